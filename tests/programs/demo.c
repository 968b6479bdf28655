/* The program `hotprobe demo` builds and traces: small, deterministic, and
 * done in well under a second. It parses numbers out of a string, runs each
 * through a tiny compute pipeline, then computes fib(5) recursively, and
 * prints what it did so the trace can be checked against it.
 *   demo            run the whole program
 */
#include <stdio.h>
#include <stdlib.h>

static const char text[] = "3 5 7";

/* The i-th number of `s` (numbers separated by spaces). */
__attribute__((noinline)) long parse(const char *s, long i) {
    char *end = (char *)s;
    long v = 0;
    for (long k = 0; k <= i; k++)
        v = strtol(end, &end, 10);
    return v;
}

__attribute__((noinline)) long square(long x) {
    return x * x;
}

__attribute__((noinline)) long compute(long x, long bias) {
    return square(x) + bias;
}

__attribute__((noinline, optimize("no-optimize-sibling-calls"))) long fib(long n) {
    if (n < 2)
        return n;
    return fib(n - 1) + fib(n - 2);
}

int main(void) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    for (long i = 0; i < 3; i++) {
        long v = parse(text, i);
        printf("compute(%ld, %ld) = %ld\n", v, i, compute(v, i));
    }
    printf("fib(5) = %ld\n", fib(5));
    return 0;
}
