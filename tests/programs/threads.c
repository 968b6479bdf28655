/* 8 threads call work() ITER times each; prints the total. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#define THREADS 8
static long iters;
volatile long sink;

__attribute__((noinline)) long work(long x) {
    sink += x;
    return x + 1;
}

static void *body(void *arg) {
    long s = 0;
    for (long i = 0; i < iters; i++)
        s += work(i);
    return (void *)s;
}

int main(int argc, char **argv) {
    iters = argc > 1 ? atol(argv[1]) : 1000;
    pthread_t t[THREADS];
    for (int i = 0; i < THREADS; i++)
        pthread_create(&t[i], NULL, body, NULL);
    long total = 0;
    for (int i = 0; i < THREADS; i++) {
        void *r;
        pthread_join(t[i], &r);
        total += (long)r;
    }
    printf("threads %d iters %ld calls %ld total %ld\n", THREADS, iters, THREADS * iters, total);
    return 0;
}
