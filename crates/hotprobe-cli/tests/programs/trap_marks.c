/* `hotprobe trace` marks the lines of functions placed on a trap
 * (trace_cli.rs). In top-level assembly so that their bytes are certain:
 *   t_tiny:  mov %edi,%eax; ret    3 bytes, t_next right after it: too
 *                                  short for a jump or a punned one, only
 *                                  the in-process trap takes it
 *   t_work:  mov; add; add; ret    11 bytes: a jump
 *   t_next:  never called
 * `trap_marks N M` calls t_tiny N times, then t_work M times, prints the
 * sums and exits with status 3. */
#include <stdio.h>
#include <stdlib.h>

long t_tiny(long), t_next(long), t_work(long);

__asm__(".text\n"
        ".p2align 4\n"
        ".globl t_work\n.type t_work, @function\nt_work:\n"
        "  mov %rdi, %rax\n  add %rdi, %rax\n  add $1, %rax\n  ret\n"
        ".size t_work, .-t_work\n"

        ".globl t_tiny\n.type t_tiny, @function\nt_tiny:\n"
        "  mov %edi, %eax\n  ret\n"
        ".size t_tiny, .-t_tiny\n"

        ".globl t_next\n.type t_next, @function\nt_next:\n"
        "  lea 7(%rdi), %rax\n  ret\n"
        ".size t_next, .-t_next\n");

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 5;
    long m = argc > 2 ? atol(argv[2]) : 3;
    long tiny = 0, work = 0;
    for (long i = 0; i < n; i++)
        tiny += t_tiny(i);
    for (long i = 0; i < m; i++)
        work += t_work(i);
    printf("tiny %ld calls sum %ld, work %ld calls sum %ld\n", n, tiny, m, work);
    return 3;
}
