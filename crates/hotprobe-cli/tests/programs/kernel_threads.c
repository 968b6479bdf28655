/* record --kernel -p (issue 25): a running program with two threads.
 * It prints `ready`, then waits for a line on stdin (the test sends it
 * once hotprobe is attached); then the main thread calls getppid 3 times
 * and the worker 5 times (after the main thread's), each printing its
 * role and tid, and the program exits. */
#include <pthread.h>
#include <stdio.h>
#include <sys/syscall.h>
#include <unistd.h>

static int go[2];

__attribute__((noinline)) void calls(const char *who, int n) {
    for (int i = 0; i < n; i++) syscall(SYS_getppid);
    printf("%s %ld\n", who, (long)syscall(SYS_gettid));
    fflush(stdout);
}

static void *worker(void *arg) {
    (void)arg;
    char c;
    if (read(go[0], &c, 1) != 1) return 0;
    calls("worker", 5);
    return 0;
}

int main(void) {
    if (pipe(go) != 0) return 3;
    pthread_t t;
    pthread_create(&t, 0, worker, 0);
    printf("ready\n");
    fflush(stdout);
    char line[16];
    if (!fgets(line, sizeof line, stdin)) return 4;
    calls("main", 3);
    if (write(go[1], "g", 1) != 1) return 5;
    pthread_join(t, 0);
    return 0;
}
