/* The program the C API tests (and the C and Python examples) probe:
 *   compute N   prints "sum S last L twice T" where S = compute(0) + ... +
 *               compute(N-1), L the global `last`, T = twice(N)
 * compute(x) returns x*x and writes x to `last`; twice(x) returns 2x. */
#include <stdio.h>
#include <stdlib.h>

volatile long last = -1;

__attribute__((noinline)) long compute(long x) {
    last = x;
    return x * x;
}

__attribute__((noinline)) long twice(long x) { return 2 * x; }

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 10;
    long sum = 0;
    for (long i = 0; i < n; i++)
        sum += compute(i);
    long t = twice(n);
    printf("sum %ld last %ld twice %ld\n", sum, (long)last, t);
    return 0;
}
