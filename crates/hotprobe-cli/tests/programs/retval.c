/* A leaf function whose result the program depends on: prints how many
   of 0..999 (mod 128) are ASCII digits ("n=80"). gcc -O2 makes is_digit
   frameless: sub, xor, cmp, setbe, ret. */
#include <stdio.h>

__attribute__((noinline)) int is_digit(char c) { return c >= '0' && c <= '9'; }

int main(void) {
    int n = 0;
    for (int i = 0; i < 1000; i++)
        n += is_digit((char)(i & 127));
    printf("n=%d\n", n);
    return 0;
}
