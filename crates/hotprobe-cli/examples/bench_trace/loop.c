/* The iProbe micro-benchmark: a loop calling an empty function N times,
   timed inside the program. Usage: loop N   prints "<ns> ns/call n=N" */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

__attribute__((noinline, noipa)) void empty(void) { __asm__ volatile(""); }

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 10000000L;
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (long i = 0; i < n; i++)
        empty();
    clock_gettime(CLOCK_MONOTONIC, &b);
    double ns = ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / (double)n;
    printf("%.3f ns/call n=%ld\n", ns, n);
    return 0;
}
