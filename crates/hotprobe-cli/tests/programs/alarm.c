/* A SIGALRM handler (`on_alarm`) interrupting a loop that calls `work`
 * (which spins SPIN iterations): prints how many times each ran.
 * Arguments: handler calls to wait for, the timer's period in µs, SPIN. */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/time.h>

static volatile sig_atomic_t handled;
static volatile long sink;
static long spin;

__attribute__((noinline)) void on_alarm(int sig) {
    (void)sig;
    handled++;
}

__attribute__((noinline)) long work(long x) {
    for (long i = 0; i < spin; i++)
        sink += i;
    sink += x;
    return x * 3;
}

int main(int argc, char **argv) {
    int want = argc > 1 ? atoi(argv[1]) : 2000;
    long usec = argc > 2 ? atol(argv[2]) : 50;
    spin = argc > 3 ? atol(argv[3]) : 0;
    struct sigaction sa = {0};
    sa.sa_handler = on_alarm;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGALRM, &sa, NULL);
    struct itimerval it = {{0, usec}, {0, usec}};
    setitimer(ITIMER_REAL, &it, NULL);
    long s = 0, calls = 0;
    while (handled < want) {
        s += work(s & 1023);
        calls++;
    }
    /* No handler runs after this: the counts printed are final. */
    sigset_t block;
    sigemptyset(&block);
    sigaddset(&block, SIGALRM);
    sigprocmask(SIG_BLOCK, &block, NULL);
    struct itimerval off = {{0, 0}, {0, 0}};
    setitimer(ITIMER_REAL, &off, NULL);
    printf("handled %d\n", (int)handled);
    printf("work %ld\n", calls);
    return 0;
}
