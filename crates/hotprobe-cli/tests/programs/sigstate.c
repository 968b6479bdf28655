// Signal state a program controls, under an in-process trap on `tiny`
// (4 bytes: too short for a jump). workers: four threads created with
// every signal blocked; alarm: a SIGALRM handler, its sa_mask full, calls
// tiny every 50 us; ignore: SIGTRAP ignored and blocked. Each mode prints
// what it computed and what the masks it reads back say.
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

__attribute__((noinline)) int tiny(int x) { return x + 1; }

static volatile long handler_calls;
static volatile long handler_sum;
static void on_alarm(int sig) { (void)sig; handler_sum += tiny(1); handler_calls++; }

static int trap_blocked(void) {
    sigset_t old;
    pthread_sigmask(SIG_BLOCK, NULL, &old);
    return sigismember(&old, SIGTRAP);
}

static void *worker(void *arg) {
    long s = 0;
    for (int i = 0; i < 1000; i++) s += tiny(i);
    *(long *)arg = s + trap_blocked() * 1000000L;
    return NULL;
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "workers";
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (!strcmp(mode, "workers")) {
        sigset_t all;
        sigfillset(&all);
        pthread_sigmask(SIG_BLOCK, &all, NULL);
        pthread_t t[4];
        long r[4];
        for (int i = 0; i < 4; i++) pthread_create(&t[i], NULL, worker, &r[i]);
        for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
        long s = 0;
        for (int i = 0; i < 4; i++) s += r[i];
        printf("calls=4000 result=%ld main_blocked=%d\n", s, trap_blocked());
    } else if (!strcmp(mode, "alarm")) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_alarm;
        sigfillset(&sa.sa_mask);
        sigaction(SIGALRM, &sa, NULL);
        struct sigaction now;
        sigaction(SIGALRM, NULL, &now);
        struct itimerval it = {{0, 50}, {0, 50}};
        setitimer(ITIMER_REAL, &it, NULL);
        long s = 0;
        for (int i = 0; i < 200000; i++) s += tiny(i);
        struct itimerval off = {{0, 0}, {0, 0}};
        setitimer(ITIMER_REAL, &off, NULL);
        printf("main=200000 sum=%ld handler_mask_has_trap=%d\n", s, sigismember(&now.sa_mask, SIGTRAP));
        printf("handler=%ld\n", handler_calls);
    } else if (!strcmp(mode, "ignore")) {
        signal(SIGTRAP, SIG_IGN);
        sigset_t t;
        sigemptyset(&t);
        sigaddset(&t, SIGTRAP);
        sigprocmask(SIG_BLOCK, &t, NULL);
        long s = 0;
        for (int i = 0; i < 1000; i++) s += tiny(i);
        sigset_t old;
        sigprocmask(SIG_BLOCK, NULL, &old);
        printf("calls=1000 sum=%ld blocked=%d\n", s, sigismember(&old, SIGTRAP));
    }
    return 0;
}
