/* 8 threads call work() ITER times each; prints the total.
 *   threads ITER        start at once
 *   threads ITER wait   print "ready PID" once all 8 threads exist, then
 *                       start their loops when a line arrives on stdin */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define THREADS 8
static long iters;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t go_cv = PTHREAD_COND_INITIALIZER;
static int go = 1;
volatile long sink;

__attribute__((noinline)) long work(long x) {
    sink += x;
    return x + 1;
}

static void *body(void *arg) {
    pthread_mutex_lock(&mu);
    while (!go)
        pthread_cond_wait(&go_cv, &mu);
    pthread_mutex_unlock(&mu);
    long s = 0;
    for (long i = 0; i < iters; i++)
        s += work(i);
    return (void *)s;
}

int main(int argc, char **argv) {
    iters = argc > 1 ? atol(argv[1]) : 1000;
    int wait = argc > 2 && argv[2][0] == 'w';
    go = !wait;
    pthread_t t[THREADS];
    for (int i = 0; i < THREADS; i++)
        pthread_create(&t[i], NULL, body, NULL);
    if (wait) {
        char line[16];
        printf("ready %d\n", (int)getpid());
        fflush(stdout);
        if (!fgets(line, sizeof line, stdin))
            return 1;
        pthread_mutex_lock(&mu);
        go = 1;
        pthread_cond_broadcast(&go_cv);
        pthread_mutex_unlock(&mu);
    }
    long total = 0;
    for (int i = 0; i < THREADS; i++) {
        void *r;
        pthread_join(t[i], &r);
        total += (long)r;
    }
    printf("threads %d iters %ld calls %ld total %ld\n", THREADS, iters, THREADS * iters, total);
    return 0;
}
