/* gcc -O2 splits g into g and g.cold (the rarely taken path calls a cold
 * function): g.cold runs every 97th call, entered by a jump from g with
 * g's saved registers on the stack, so its [rsp] is not a return address.
 * asm_twice holds a local label (asm_twice_done), which is not a function.
 *
 *   coldsplit [N]   g(a, i) for i < N (default 300), prints t=...
 *   coldsplit serve prints "ready PID", then for each line "run N" prints
 *                   t=... for N calls; "bye" at end of input.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

volatile int sink;

__attribute__((cold, noinline)) void note(long x) {
    sink += (int)x;
}

__attribute__((noinline)) long h(long *p, long x) {
    long acc = 0;
    for (long i = 0; i < x % 50; i++) acc += (i * x) ^ (acc >> 3) ^ p[i & 3];
    return acc;
}

__attribute__((noinline)) long g(long *p, long x) {
    long acc = h(p, x);
    acc += h(p, acc & 7);
    if (x % 97 == 96) {
        note(x);
        note(acc);
        acc = acc * 3 + sink + p[1];
        note(acc);
    }
    return acc + p[x & 3];
}

__asm__(".text\n"
        ".globl asm_twice\n"
        ".type asm_twice, @function\n"
        "asm_twice:\n"
        "    lea (%rdi,%rdi), %rax\n"
        "asm_twice_done:\n"
        "    ret\n"
        ".size asm_twice, .-asm_twice\n");
long asm_twice(long);

static long run(long n) {
    long a[4] = {1, 2, 3, 4};
    long t = 0;
    sink = 0;
    for (long i = 0; i < n; i++) t += (g(a, i) & 0xfff) + asm_twice(i & 1);
    return t;
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "serve") == 0) {
        char line[64];
        printf("ready %d\n", (int)getpid());
        fflush(stdout);
        while (fgets(line, sizeof line, stdin)) {
            if (strncmp(line, "run ", 4) == 0) {
                printf("t=%ld\n", run(atol(line + 4)));
                fflush(stdout);
            }
        }
        printf("bye\n");
        return 0;
    }
    long n = argc > 1 ? atol(argv[1]) : 300;
    printf("t=%ld\n", run(n));
    return 0;
}
