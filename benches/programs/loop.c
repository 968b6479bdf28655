/* The iProbe micro-benchmark: a loop calling an empty function N times.
 * Prints the loop's own wall time, so tracer start-up is not counted.
 *   loop N        N calls of empty()
 *   loop N body   N calls of body(i)
 *   loop N mix    N calls of mix(i) */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

__attribute__((noinline)) void empty(void) { __asm__ volatile(""); }

/* A function whose first instruction is an ordinary one (lea), not a ret:
 * the trap mechanism runs it out of line instead of emulating it. */
__attribute__((noinline)) long body(long x) { return x + 1; }

/* A few instructions before its ret: room for the jump mechanism. */
__attribute__((noinline)) long mix(long x) { return (x * 2654435761L) ^ (x >> 13); }

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 100000000L;
    int use_body = argc > 2 && argv[2][0] == 'b';
    int use_mix = argc > 2 && argv[2][0] == 'm';
    volatile long sink = 0;
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    if (use_mix)
        for (long i = 0; i < n; i++)
            sink = mix(i);
    else if (use_body)
        for (long i = 0; i < n; i++)
            sink = body(i);
    else
        for (long i = 0; i < n; i++)
            empty();
    clock_gettime(CLOCK_MONOTONIC, &b);
    long ns = (b.tv_sec - a.tv_sec) * 1000000000L + (b.tv_nsec - a.tv_nsec);
    printf("calls %ld ns %ld\n", n, ns);
    return 0;
}
