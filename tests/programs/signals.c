/* Signals while probed code runs: a 200 µs interval timer (SIGALRM) fires
 * during a loop of N calls to tick(); SIGUSR1 and a realtime signal are
 * raised by the program itself and their handlers call tick() too.
 * Prints what it received, so tests compare with the probe counts. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/time.h>

volatile long ticks, alarms, usr1, rt;

__attribute__((noinline)) void tick(long x) { ticks += x; }

static void on_alarm(int s) { (void)s; alarms++; }
static void on_usr1(int s) { (void)s; usr1++; tick(1); }
static void on_rt(int s) { (void)s; rt++; tick(1); }

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 10000;
    signal(SIGALRM, on_alarm);
    signal(SIGUSR1, on_usr1);
    signal(SIGRTMIN + 1, on_rt);
    struct itimerval it = {{0, 200}, {0, 200}};
    setitimer(ITIMER_REAL, &it, NULL);
    for (long i = 0; i < n; i++) {
        tick(1);
        if (i % 1000 == 0) {
            raise(SIGUSR1);
            raise(SIGRTMIN + 1);
        }
    }
    struct itimerval off = {{0, 0}, {0, 0}};
    setitimer(ITIMER_REAL, &off, NULL);
    printf("calls %ld usr1 %ld rt %ld ticks %ld alarms>0 %d\n", n, usr1, rt, ticks, alarms > 0);
    return 0;
}
