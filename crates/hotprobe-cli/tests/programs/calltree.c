/* A small fixed call tree: main calls a() 3 times, each a() calls b()
 * once. Prints "a 3 b 3". */
#include <stdio.h>

static volatile long sink;
static long na, nb;

__attribute__((noinline)) long b(long x) {
    sink += x;
    nb++;
    return sink * 3 + x;
}

__attribute__((noinline)) long a(long x) {
    sink += x;
    na++;
    return b(x) + 1;
}

int main(void) {
    long s = 0;
    for (int i = 0; i < 3; i++)
        s += a(i);
    printf("a %ld b %ld\n", na, nb);
    return s == 0;
}
