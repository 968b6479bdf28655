/* The iProbe micro-benchmark: a loop calling one function N times, timed
   inside the program (so that tracer start-up is not counted).
   Usage: bench N (empty|small)   prints "<ns per call> ns/call ... cpu=<ns>" */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* noipa: neither inlined, nor removed as pure, nor relied on by callers
   for register use (-fipa-ra). */
__attribute__((noinline, noipa)) void empty(void) { __asm__ volatile(""); }
/* A small body for the jump mechanism (lea = 5 relocatable bytes). */
__attribute__((noinline, noipa)) long small(long a) { return a * 3 + 1; }

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 100000000L;
    int use_small = argc > 2 && strcmp(argv[2], "small") == 0;
    struct timespec a, b, ca, cb;
    long s = 0;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ca);
    clock_gettime(CLOCK_MONOTONIC, &a);
    if (use_small)
        for (long i = 0; i < n; i++) s += small(i);
    else
        for (long i = 0; i < n; i++) empty();
    clock_gettime(CLOCK_MONOTONIC, &b);
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &cb);
    double ns = ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / (double)n;
    double cpu = ((cb.tv_sec - ca.tv_sec) * 1e9 + (cb.tv_nsec - ca.tv_nsec)) / (double)n;
    /* cpu: the same per call in CPU time of the process (less sensitive to
       other load on the machine; the tables use wall time). */
    printf("%.3f ns/call n=%ld s=%ld cpu=%.3f\n", ns, n, s, cpu);
    return 0;
}
