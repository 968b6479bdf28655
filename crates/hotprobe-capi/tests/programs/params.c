/* The program the conditional counts by parameter name (C API, Python)
 * probe: put(key, size) is called 8 times with known arguments. key is an
 * int: a condition naming it compares the low 32 bits, signed (-2 < 0
 * whatever the register's upper half holds); size is an unsigned int
 * (4000000000 > 256). Prints "sum S" (the keys' sum). */
#include <stdio.h>

volatile unsigned long acc;

__attribute__((noinline, noipa)) int put(int key, unsigned int size) {
    acc += size;
    return key;
}

int main(void) {
    static const int keys[8] = {1, -2, 3, -4, 5, 6, -7, 8};
    static const unsigned int sizes[8] = {100, 300, 4096, 0, 257, 256, 1000, 4000000000u};
    long sum = 0;
    for (int i = 0; i < 8; i++)
        sum += put(keys[i], sizes[i]);
    printf("sum %ld\n", sum);
    return 0;
}
