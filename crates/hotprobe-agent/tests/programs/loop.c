/* The iProbe micro-benchmark shape: T threads each call target_fn N times.
 * Knows nothing about hotprobe: prints "ready", waits for one byte on stdin
 * (the test patches it meanwhile), runs, prints a checksum. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

__attribute__((noinline, noipa)) long target_fn(long a, long b, long c, long d, long e, long f)
{
    __asm__ volatile("" ::: "memory");
    return a + f;
}

static long n_calls;

static void *worker(void *arg)
{
    long id = (long)arg, s = 0;
    for (long i = 0; i < n_calls; i++)
        s += target_fn(id, i, 3, 4, 5, 6);
    return (void *)s;
}

int main(int argc, char **argv)
{
    if (argc < 3)
        return 2;
    n_calls = atol(argv[1]);
    int t = atoi(argv[2]);
    pthread_t th[64];
    if (t < 1 || t > 64)
        return 2;
    printf("ready\n");
    fflush(stdout);
    char c;
    if (read(0, &c, 1) != 1)
        return 3;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (long i = 0; i < t; i++)
        pthread_create(&th[i], 0, worker, (void *)i);
    long total = 0;
    for (int i = 0; i < t; i++) {
        void *r;
        pthread_join(th[i], &r);
        total += (long)r;
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double ns = (t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec);
    fprintf(stderr, "ns/call/thread %.2f\n", ns / n_calls);
    printf("done %ld\n", total);
    return 0;
}
