/* Threads made all the time, for attach/detach under churn
 * (tests/attach_churn.rs): prints "ready PID", then, until SIGTERM, runs
 * rounds of 4 threads each calling work() 1000 times, joined; at SIGTERM
 * it finishes the round and prints "rounds R calls C" (C is 4000 R when
 * no thread was lost or run twice). */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <unistd.h>

static volatile long calls;
static volatile sig_atomic_t stop;
volatile int sink;

__attribute__((noinline)) int work(int x) {
    sink += x;
    return x * 2;
}

static void *run(void *a) {
    (void)a;
    for (int i = 0; i < 1000; i++)
        work(i);
    __sync_fetch_and_add(&calls, 1000);
    return NULL;
}

static void on_term(int s) {
    (void)s;
    stop = 1;
}

int main(void) {
    signal(SIGTERM, on_term);
    printf("ready %d\n", (int)getpid());
    fflush(stdout);
    long rounds = 0;
    while (!stop) {
        pthread_t t[4];
        for (int i = 0; i < 4; i++)
            if (pthread_create(&t[i], NULL, run, NULL) != 0)
                return 3;
        for (int i = 0; i < 4; i++)
            pthread_join(t[i], NULL);
        rounds++;
    }
    printf("rounds %ld calls %ld\n", rounds, calls);
    return 0;
}
