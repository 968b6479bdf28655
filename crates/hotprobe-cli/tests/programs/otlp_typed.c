/* Typed arguments on four threads for the OTLP collector test: each call
 * logs "CALL <tid> name(args) = ret" on stderr, in the form hotprobe
 * shows typed values, with the kernel thread id. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <sys/syscall.h>
#include <unistd.h>

enum color { RED, GREEN, BLUE };
static const char *const COLORS[] = {"RED", "GREEN", "BLUE"};
static const char *const WHO[] = {"ada", "bob", "cy", "dee"};

static long tid(void) { return syscall(SYS_gettid); }

__attribute__((noinline, noclone)) int greet(const char *who, int n) {
    int r = n * 2 + 1;
    fprintf(stderr, "CALL %ld greet(\"%s\", %d) = %d\n", tid(), who, n, r);
    return r;
}

__attribute__((noinline, noclone)) double scale(double x, int k, float f) {
    double r = x * k + f;
    fprintf(stderr, "CALL %ld scale(%g, %d, %g) = %g\n", tid(), x, k, (double)f, r);
    return r;
}

__attribute__((noinline, noclone)) long paint(enum color c, char mark, long id) {
    long r = id * 3 + c;
    fprintf(stderr, "CALL %ld paint(%s, '%c', %ld) = %ld\n", tid(), COLORS[c], mark, id, r);
    return r;
}

static void *worker(void *arg) {
    long w = (long)arg;
    long acc = 0;
    /* Thread w makes 2 + w rounds: the counts differ per thread. */
    for (int i = 0; i < 2 + w; i++) {
        acc += greet(WHO[w], i);
        acc += (long)scale(0.5 * i + w, i - 1, 0.25f * (float)w);
        acc += paint((enum color)(i % 3), (char)('a' + i), w * 100 + i);
    }
    return (void *)(acc > 0 ? 1L : 0L);
}

int main(void) {
    pthread_t t[3];
    worker((void *)0);
    for (long i = 0; i < 3; i++)
        if (pthread_create(&t[i], NULL, worker, (void *)(i + 1)) != 0)
            return 2;
    for (int i = 0; i < 3; i++)
        pthread_join(t[i], NULL);
    return 0;
}
