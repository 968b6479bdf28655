/* WAVES waves of THREADS short threads (joined before the next wave),
 * each calling work CALLS times: many more threads over the run than are
 * alive at once. With ALIVE set (argv[4] = 1) all threads of a wave wait
 * at a barrier before calling, so that they are all alive at once. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

__attribute__((noinline)) long work(long x) {
    __asm__ volatile("" ::: "memory");
    return x ^ 5;
}

static long calls_each;
static int together;
static pthread_barrier_t barrier;

static void *worker(void *arg) {
    long s = 0;
    if (together)
        pthread_barrier_wait(&barrier);
    for (long i = 0; i < calls_each; i++)
        s += work(i);
    return (void *)s;
}

int main(int argc, char **argv) {
    int waves = argc > 1 ? atoi(argv[1]) : 40;
    int threads = argc > 2 ? atoi(argv[2]) : 50;
    calls_each = argc > 3 ? atol(argv[3]) : 10;
    together = argc > 4 && atoi(argv[4]) == 1;
    pthread_t *t = calloc(threads, sizeof *t);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 64 * 1024);
    long calls = 0, started = 0;
    for (int w = 0; w < waves; w++) {
        if (together)
            pthread_barrier_init(&barrier, NULL, threads);
        for (int i = 0; i < threads; i++) {
            if (pthread_create(&t[i], &attr, worker, NULL) != 0) {
                perror("pthread_create");
                return 2;
            }
            started++;
        }
        for (int i = 0; i < threads; i++) {
            pthread_join(t[i], NULL);
            calls += calls_each;
        }
        if (together)
            pthread_barrier_destroy(&barrier);
    }
    printf("threads %ld\ncalls %ld\n", started, calls);
    return 0;
}
