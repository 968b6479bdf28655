/* Floats and doubles on 4 threads: lerp() takes two doubles and a float
 * and returns a double, area() takes an int, a float and a long and
 * returns a float. Each call logs itself on stderr ("CALL name(args) =
 * ret", one fprintf: one write on the unbuffered stream) in the form
 * hotprobe prints it, so that a test compares the two as multisets; the
 * values are chosen so that %g prints them exactly. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#define CALLS 100

__attribute__((noinline, noclone)) double lerp(double a, double b, float t) {
    double r = a + (b - a) * t;
    fprintf(stderr, "CALL lerp(%g, %g, %g) = %g\n", a, b, (double)t, r);
    return r;
}

__attribute__((noinline, noclone)) float area(int w, float h, long id) {
    float r = (float)w * h + (float)id;
    fprintf(stderr, "CALL area(%d, %g, %ld) = %g\n", w, (double)h, id, (double)r);
    return r;
}

static int base;

static void *worker(void *arg) {
    long id = (long)arg;
    double acc = 0;
    for (int i = 0; i < CALLS; i++) {
        acc += lerp(base + id * 0.5, i * 0.5 - id, (float)(i % 4) * 0.25f);
        acc += area(base + i, 0.5f * (float)id + 0.25f, id * 1000 + i);
    }
    return (void *)(long)(acc > 0);
}

int main(int argc, char **argv) {
    (void)argv;
    base = argc;
    pthread_t t[4];
    for (long i = 0; i < 4; i++)
        if (pthread_create(&t[i], NULL, worker, (void *)i) != 0)
            return 2;
    for (int i = 0; i < 4; i++)
        pthread_join(t[i], NULL);
    return 0;
}
