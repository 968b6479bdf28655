/* record --kernel (issue 25): a child writes into a pipe 200 ms late;
 * wait_for_data() reads it, blocked in read(2) meanwhile. The child's
 * 200 ms start when the parent is about to read (a byte on a second
 * pipe), not at the fork: the parent's stops under ptrace at the fork do
 * not shorten its read. */
#include <stdio.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static int data[2], go[2];

__attribute__((noinline)) int wait_for_data(void) {
    char buf[16];
    return (int)read(data[0], buf, sizeof buf);
}

int main(void) {
    if (pipe(data) != 0 || pipe(go) != 0) return 3;
    pid_t child = fork();
    if (child == 0) {
        char c;
        if (read(go[0], &c, 1) != 1) _exit(5);
        struct timespec ts = {0, 200000000};
        nanosleep(&ts, 0);
        if (write(data[1], "hello", 5) != 5) _exit(4);
        _exit(0);
    }
    if (write(go[1], "g", 1) != 1) return 6;
    int n = wait_for_data();
    printf("main %ld read %d\n", (long)syscall(SYS_gettid), n);
    waitpid(child, 0, 0);
    return 0;
}
