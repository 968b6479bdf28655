/* The program the conditional count tests (C API, Python) probe: take()
 * is called 10 times with known arguments, 5 of them above 256 (-5 is
 * negative: conditions compare signed). Prints "total T". */
#include <stdio.h>

volatile long acc;

__attribute__((noinline, noipa)) long take(long n) {
    acc += n;
    return n;
}

int main(void) {
    static const long sizes[10] = {0, 100, 300, 1000, 256, 257, -5, 4096, 1, 999};
    long total = 0;
    for (int i = 0; i < 10; i++)
        total += take(sizes[i]);
    printf("total %ld\n", total);
    return 0;
}
