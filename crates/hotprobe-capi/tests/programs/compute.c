/* The program the C API tests (and the C and Python examples) probe:
 *   compute N   prints "sum S" where S = compute(0) + ... + compute(N-1)
 * compute(x) returns x*x and writes x to the global `last`. */
#include <stdio.h>
#include <stdlib.h>

volatile long last = -1;

__attribute__((noinline)) long compute(long x) {
    last = x;
    return x * x;
}

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 10;
    long sum = 0;
    for (long i = 0; i < n; i++)
        sum += compute(i);
    printf("sum %ld last %ld\n", sum, (long)last);
    return 0;
}
