/* The C side of cgo_four (main.go): four(x) = x + 1 in 4 bytes written
 * in assembly (lea 1(%rdi),%eax; ret), directly followed by another
 * function: no padding after it, so it is too short for a jump and has
 * no patchable entry (a C program would get an in-process trap there).
 * four_loop calls it n times from C, from x = from on. */

__asm__(".text\n"
        ".p2align 4\n"
        ".globl four\n"
        ".type four, @function\n"
        "four:\n"
        "  lea 1(%rdi), %eax\n"
        "  ret\n"
        ".size four, .-four\n"
        ".globl four_neighbour\n"
        ".type four_neighbour, @function\n"
        "four_neighbour:\n"
        "  lea (%rdi,%rdi), %eax\n"
        "  ret\n"
        ".size four_neighbour, .-four_neighbour\n");

int four(int x);
int four_neighbour(int x);

long four_loop(long from, long n) {
    long sum = 0;
    for (long i = 0; i < n; i++)
        sum += four((int)(from + i));
    return sum + four_neighbour(0);
}
