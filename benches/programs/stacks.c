/* The --stacks benchmark (issue 24): a loop calling `leaf` N times through
 * a chain of DEPTH noinline functions (no tail calls), so that each hit's
 * stack is DEPTH + 4 frames deep (the chain, main, libc's start-up,
 * _start). Build with -O2 -fomit-frame-pointer: the agent walks it with
 * the tracer's .eh_frame tables. Prints the loop's own wall time.
 *   stacks N */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

volatile long sink;

__attribute__((noinline)) long leaf(long x) { sink += x; asm volatile(""); return x + 1; }
#define LEVEL(name, next)                                                     \
    __attribute__((noinline)) long name(long x) {                             \
        long r = next(x + 1);                                                 \
        asm volatile("");                                                     \
        return r;                                                             \
    }
LEVEL(c8, leaf)
LEVEL(c7, c8)
LEVEL(c6, c7)
LEVEL(c5, c6)
LEVEL(c4, c5)
LEVEL(c3, c4)
LEVEL(c2, c3)
LEVEL(c1, c2)

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 1000000L;
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (long i = 0; i < n; i++)
        c1(i);
    clock_gettime(CLOCK_MONOTONIC, &b);
    long ns = (b.tv_sec - a.tv_sec) * 1000000000L + (b.tv_nsec - a.tv_nsec);
    printf("calls %ld ns %ld\n", n, ns);
    return 0;
}
