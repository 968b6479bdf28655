/* Forbids itself rdtsc (prctl PR_SET_TSC, PR_TSC_SIGSEGV) after one call
 * of work, then calls work on the main thread and on a thread it
 * creates (which inherits the setting). Prints its calls. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>

__attribute__((noinline)) long work(long x) {
    __asm__ volatile("" ::: "memory");
    return x * 3 + 1;
}

static long calls;

static void *worker(void *arg) {
    long n = (long)arg, s = 0;
    for (long i = 0; i < n; i++)
        s += work(i);
    return (void *)s;
}

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 1000;
    long s = work(0);
    calls = 1;
    if (prctl(PR_SET_TSC, PR_TSC_SIGSEGV, 0, 0, 0) != 0) {
        perror("prctl");
        return 2;
    }
    int mode = 0;
    prctl(PR_GET_TSC, &mode, 0, 0, 0);
    s += (long)worker((void *)n);
    calls += n;
    pthread_t t;
    void *r;
    pthread_create(&t, NULL, worker, (void *)n);
    pthread_join(t, &r);
    calls += n;
    printf("tsc %s\ncalls %ld\nsum %ld\n", mode == PR_TSC_SIGSEGV ? "sigsegv" : "enabled", calls,
           s + (long)r);
    return 0;
}
