/* Threads one after another (each joined before the next starts), each
 * calling work() CALLS times, with a pause between them in which a
 * tracer's drain gives the last thread's ring slot back, so that later
 * threads take over slots earlier ones wrote into. Each thread counts
 * the minor page faults it took during its calls after the first
 * (getrusage RUSAGE_THREAD): a tracer that made the thread's ring ready
 * at its first hit makes those calls take none. Prints one line per
 * thread, "thread I faults F", then "calls C sum S". Usage:
 * ring_faults [THREADS [CALLS [PAUSE_US [wait]]]]; with "wait" it first
 * prints "ready" and waits for a line on stdin (a tracer attaches). */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

static long calls;
static volatile long sink;

__attribute__((noinline)) long work(long x) {
    sink += x;
    return x * 3 + 1;
}

struct job {
    long id;
    long faults;
    long sum;
};

static long minflt(void) {
    struct rusage u;
    getrusage(RUSAGE_THREAD, &u);
    return u.ru_minflt;
}

static void *worker(void *arg) {
    struct job *j = arg;
    long sum = work(j->id);
    long before = minflt();
    for (long i = 1; i < calls; i++)
        sum += work(j->id + i);
    j->faults = minflt() - before;
    j->sum = sum;
    return NULL;
}

int main(int argc, char **argv) {
    long threads = argc > 1 ? atol(argv[1]) : 20;
    calls = argc > 2 ? atol(argv[2]) : 1000;
    long pause_us = argc > 3 ? atol(argv[3]) : 3000;
    if (argc > 4 && strcmp(argv[4], "wait") == 0) {
        char line[64];
        printf("ready\n");
        fflush(stdout);
        if (!fgets(line, sizeof line, stdin))
            return 3;
    }
    long total = 0, n = 0;
    for (long t = 0; t < threads; t++) {
        struct job j = {t, 0, 0};
        pthread_t th;
        if (pthread_create(&th, NULL, worker, &j) != 0)
            return 2;
        pthread_join(th, NULL);
        printf("thread %ld faults %ld\n", t, j.faults);
        total += j.sum;
        n += calls;
        struct timespec p = {0, pause_us * 1000};
        nanosleep(&p, NULL);
    }
    printf("calls %ld sum %ld\n", n, total);
    return 0;
}
