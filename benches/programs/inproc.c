/* The in-process trap micro-benchmark: a loop calling a 2-byte function
 * (xchg eax, edi; ret) N times: no patch or jump fits it. Prints the
 * loop's own wall time, so tracer start-up is not counted.
 *   inproc N */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

__asm__(".text\n.globl two\n.type two,@function\n"
        "two:\n  xchg %edi, %eax\n  ret\n"
        ".size two, .-two\n");
int two(int);

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 1000000L;
    volatile long sink = 0;
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (long i = 0; i < n; i++)
        sink += two((int)i);
    clock_gettime(CLOCK_MONOTONIC, &b);
    long ns = (b.tv_sec - a.tv_sec) * 1000000000L + (b.tv_nsec - a.tv_nsec);
    printf("calls %ld ns %ld\n", n, ns);
    return 0;
}
