/* record --kernel (issue 25): a child writes into a pipe 200 ms late;
 * wait_for_data() reads it, blocked in read(2) meanwhile. */
#include <stdio.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static int fds[2];

__attribute__((noinline)) int wait_for_data(void) {
    char buf[16];
    return (int)read(fds[0], buf, sizeof buf);
}

int main(void) {
    if (pipe(fds) != 0) return 3;
    pid_t child = fork();
    if (child == 0) {
        struct timespec ts = {0, 200000000};
        nanosleep(&ts, 0);
        if (write(fds[1], "hello", 5) != 5) _exit(4);
        _exit(0);
    }
    int n = wait_for_data();
    printf("main %ld read %d\n", (long)syscall(SYS_gettid), n);
    waitpid(child, 0, 0);
    return 0;
}
