/* Thread start under a tracer (issue 23's benchmark row): main takes the
 * time, starts argv[1] threads (default 8), each calling work() argv[2]
 * times (default 1000), joins them, and prints
 *   "threads N start_ns S total_ns T cpu_first_ns F cpu_all_ns A main_cpu_ns M"
 * S: from before the first pthread_create until every thread made its
 * first call (what a tracer's per-thread set-up delays); T: until all
 * joined. The program times itself, so the tracer's own start-up and
 * exit are left out. F and A: the CPU time of the threads (summed) until
 * their first call returned, and until their last; unlike S and T, a
 * load on the machine changes them little. M: main's own CPU time in its
 * pthread_create loop (what a tracer adds to making a thread, in the
 * creator). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static long calls;
static atomic_long started;
static volatile long sink;

/* Built with -DSPIN=N, work() first busy-waits N TSC cycles: a native
 * program whose calls cost what a tracer adds to each (the bench's
 * `--spin` row), to tell a tracer's per-thread set-up from its per-call
 * cost, which the other threads' calls also put into the start on a
 * machine with fewer CPUs than threads. */
#ifdef SPIN
#include <x86intrin.h>
#endif

__attribute__((noinline)) long work(long x) {
#ifdef SPIN
    unsigned long until = __rdtsc() + SPIN;
    while (__rdtsc() < until)
        ;
#endif
    sink += x;
    return x + 1;
}

static long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000L + t.tv_nsec;
}

static long n_threads;
static atomic_long all_at;
static atomic_long cpu_first, cpu_all;

static long cpu_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return t.tv_sec * 1000000000L + t.tv_nsec;
}

static void *worker(void *arg) {
    long id = (long)arg;
    work(id);
    long first = cpu_ns();
    if (atomic_fetch_add(&started, 1) + 1 == n_threads)
        atomic_store(&all_at, now_ns());
    for (long i = 1; i < calls; i++)
        work(i + id);
    atomic_fetch_add(&cpu_first, first);
    atomic_fetch_add(&cpu_all, cpu_ns());
    return NULL;
}

int main(int argc, char **argv) {
    n_threads = argc > 1 ? atol(argv[1]) : 8;
    calls = argc > 2 ? atol(argv[2]) : 1000;
    if (n_threads < 1 || n_threads > 256)
        return 2;
    pthread_t t[256];
    long t0 = now_ns();
    long m0 = cpu_ns();
    for (long i = 0; i < n_threads; i++)
        pthread_create(&t[i], NULL, worker, (void *)i);
    long m1 = cpu_ns();
    for (long i = 0; i < n_threads; i++)
        pthread_join(t[i], NULL);
    long t1 = now_ns();
    printf("threads %ld start_ns %ld total_ns %ld cpu_first_ns %ld cpu_all_ns %ld main_cpu_ns %ld\n",
           n_threads, atomic_load(&all_at) - t0, t1 - t0, atomic_load(&cpu_first),
           atomic_load(&cpu_all), m1 - m0);
    return 0;
}
