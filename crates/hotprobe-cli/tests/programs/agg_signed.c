/* Signed parameters for `count --by NAME` (tests/aggregations.rs):
 * g(int x, unsigned long u, short s) for i in -5..4, with x = i,
 * u = (unsigned long)i and s = i * 1000. Prints "t=T". */
#include <stdio.h>

volatile int sink;

__attribute__((noinline)) int g(int x, unsigned long u, short s) {
    sink += x + s;
    return x + 1 + (int)u;
}

int main(void) {
    long t = 0;
    for (int i = -5; i < 5; i++)
        t += g(i, (unsigned long)i, (short)(i * 1000));
    printf("t=%ld\n", t);
    return 0;
}
