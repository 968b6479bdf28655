/* Prologues Debian's builds start functions with (issue 23), in top-level
 * assembly so that their bytes are certain:
 *   sub_call:   sub $8,%rsp; call leaf        (a call ending the 5 bytes)
 *   push_call:  push %rbx; call leaf
 *   push_icall: push %rbx; call *leaf_ptr(%rip)
 *   jmp_first:  jmp rel8 over padding to a loop (sqlite3ExprAffinity)
 *   jcc_first:  test; je rel8
 *   sub_jump:   sub $8,%rsp; call jumper      (jumper may longjmp out)
 * and t_short (3 bytes, the next function right after it: too short for
 * a punned jump too), t_loop (its loop lands at +4), t_ok, which a
 * pattern `t_*` selects. c_wrap and c_tiny are C: with -fcf-protection
 * they start with endbr64; c_wrap is also called through a pointer.
 *   prologues [N]       N rounds, then a longjmp through sub_jump; prints
 *                       the calls of leaf and jumper; exit status 3
 *   prologues code      the first 9 bytes of c_wrap, as the process sees them
 *   prologues lines     "ready", then for each n on stdin the sum of n rounds
 */
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static jmp_buf env;
static int leaf_calls, jumper_calls, do_jump;

__attribute__((noinline, used)) long leaf(long x) {
    leaf_calls++;
    __asm__ volatile("" ::: "memory");
    return x * 3 + 1;
}
__attribute__((noinline, used)) long jumper(long x) {
    jumper_calls++;
    if (do_jump)
        longjmp(env, (int)x + 1);
    return x + 2;
}
long (*leaf_ptr)(long) = leaf;

long sub_call(long), push_call(long), push_icall(long), jmp_first(long);
long jcc_first(long), sub_jump(long), t_short(long), t_loop(long), t_ok(long);

__asm__(".text\n"
        ".globl sub_call\n.type sub_call, @function\nsub_call:\n.cfi_startproc\n"
        "  sub $8, %rsp\n.cfi_adjust_cfa_offset 8\n  call leaf\n"
        "  add $8, %rsp\n.cfi_adjust_cfa_offset -8\n  ret\n"
        ".cfi_endproc\n.size sub_call, .-sub_call\n"

        ".globl push_call\n.type push_call, @function\npush_call:\n.cfi_startproc\n"
        "  push %rbx\n.cfi_adjust_cfa_offset 8\n.cfi_rel_offset rbx, 0\n  call leaf\n"
        "  pop %rbx\n.cfi_adjust_cfa_offset -8\n.cfi_restore rbx\n  ret\n"
        ".cfi_endproc\n.size push_call, .-push_call\n"

        ".globl push_icall\n.type push_icall, @function\npush_icall:\n.cfi_startproc\n"
        "  push %rbx\n.cfi_adjust_cfa_offset 8\n.cfi_rel_offset rbx, 0\n"
        "  call *leaf_ptr(%rip)\n"
        "  pop %rbx\n.cfi_adjust_cfa_offset -8\n.cfi_restore rbx\n  ret\n"
        ".cfi_endproc\n.size push_icall, .-push_icall\n"

        ".p2align 4\n"
        ".globl jmp_first\n.type jmp_first, @function\njmp_first:\n.cfi_startproc\n"
        "  jmp 1f\n  .p2align 3\n2:\n  sub $3, %rdi\n1:\n  cmp $3, %rdi\n  jge 2b\n"
        "  mov %rdi, %rax\n  ret\n"
        ".cfi_endproc\n.size jmp_first, .-jmp_first\n"

        ".globl jcc_first\n.type jcc_first, @function\njcc_first:\n.cfi_startproc\n"
        "  test %rdi, %rdi\n  je 1f\n  lea 1(%rdi), %rax\n  ret\n1:\n  mov $7, %eax\n  ret\n"
        ".cfi_endproc\n.size jcc_first, .-jcc_first\n"

        ".globl sub_jump\n.type sub_jump, @function\nsub_jump:\n.cfi_startproc\n"
        "  sub $8, %rsp\n.cfi_adjust_cfa_offset 8\n  call jumper\n"
        "  add $8, %rsp\n.cfi_adjust_cfa_offset -8\n  ret\n"
        ".cfi_endproc\n.size sub_jump, .-sub_jump\n"

        ".globl t_short\n.type t_short, @function\nt_short:\n"
        "  mov %edi, %eax\n  ret\n"
        ".size t_short, .-t_short\n"

        ".globl t_loop\n.type t_loop, @function\nt_loop:\n"
        "  xor %eax, %eax\n  xor %ecx, %ecx\n1:\n  add %rdi, %rax\n  inc %ecx\n"
        "  cmp $2, %ecx\n  jne 1b\n  ret\n"
        ".size t_loop, .-t_loop\n"

        ".globl t_ok\n.type t_ok, @function\nt_ok:\n"
        "  mov %rdi, %rax\n  add %rdi, %rax\n  ret\n"
        ".size t_ok, .-t_ok\n");

__attribute__((noinline)) long c_wrap(long x) { return leaf(x) + 1; }
__attribute__((noinline)) long c_tiny(long x) { return x ^ 0x55; }
long (*volatile wrap_ptr)(long) = c_wrap;

static long rounds(long n) {
    long s = 0;
    for (long i = 0; i < n; i++) {
        s += sub_call(i) + push_call(i) + push_icall(i) + jmp_first(i) + jcc_first(i);
        s += sub_jump(i) + t_short(i) + t_loop(i) + t_ok(i) + c_wrap(i) + wrap_ptr(i) + c_tiny(i);
    }
    return s;
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "code") == 0) {
        const unsigned char *p = (const unsigned char *)(void *)c_wrap;
        for (int i = 0; i < 9; i++)
            printf("%02x%s", p[i], i < 8 ? " " : "\n");
        return 0;
    }
    if (argc > 1 && strcmp(argv[1], "lines") == 0) {
        setvbuf(stdout, NULL, _IOLBF, 0);
        puts("ready");
        long n;
        while (scanf("%ld", &n) == 1)
            printf("%ld\n", rounds(n));
        return 0;
    }
    long n = argc > 1 ? atol(argv[1]) : 20;
    long s = rounds(n);
    do_jump = 1;
    int r = setjmp(env);
    if (r == 0) {
        sub_jump(41);
        puts("not reached");
    }
    printf("rounds %ld sum %ld longjmp %d leaf %d jumper %d\n", n, s, r, leaf_calls,
           jumper_calls);
    return 3;
}
