/* Hand-written functions where one branches into the first bytes of
 * another, as glibc's __mempcpy_avx512_unaligned_erms ends with
 * `jmp __memcpy_avx512_unaligned_erms+3`: a jump probe over add3's entry
 * would send add3_twice into the middle of its `jmp rel32`. */
#include <stdio.h>
#include <stdlib.h>

long add3(long a, long b);       /* a + b + 3 */
long add3_twice(long a, long b); /* 2a + b + 3, by a jump to add3+3 */

__asm__(".text\n"
        ".type add3, @function\n"
        "add3:\n"
        "  mov %rdi, %rax\n" /* 3 bytes: add3+3 is the next instruction */
        "  add %rsi, %rax\n"
        "  add $3, %rax\n"
        "  ret\n"
        ".size add3, .-add3\n"
        ".type add3_twice, @function\n"
        "add3_twice:\n"
        "  mov %rdi, %rax\n"
        "  add %rdi, %rax\n"
        "  jmp add3+3\n"
        ".size add3_twice, .-add3_twice\n");

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 10, s = 0;
    for (long i = 0; i < n; i++)
        s += add3(i, 1) + add3_twice(i, 2);
    printf("%ld\n", s);
    return 0;
}
