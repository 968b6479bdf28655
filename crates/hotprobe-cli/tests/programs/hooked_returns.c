/* Recorded functions whose returns are hooked, in the cases the per-site
 * stub's return hook declines and the agent's generic path takes over:
 *   - `depth` recursing DEPTH deep, past the shadow stack's 4,096 entries
 *     (the deepest returns cannot be hooked: counted, not lost silently);
 *   - `tail_a` ending in a tail call (`jmp`) of `tail_b`, whose entry
 *     finds its return address already swapped (built with -O2:
 *     -foptimize-sibling-calls);
 *   - `lj_inner` leaving `lj_outer` and itself by longjmp, so that the
 *     next entry finds dead frames to pop first.
 * Every function counts its own calls; main prints the counts, and a
 * checksum of the values the functions returned. */
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>

static long depth_calls, tail_a_calls, tail_b_calls, lj_outer_calls, lj_inner_calls;
static jmp_buf jb;

__attribute__((noinline)) long depth(long n) {
    depth_calls++;
    if (n == 0)
        return 0;
    long r = depth(n - 1);
    __asm__ volatile("" ::: "memory");
    return r + 1;
}

__attribute__((noinline)) long tail_b(long x) {
    tail_b_calls++;
    __asm__ volatile("" ::: "memory");
    return x * 3 + 1;
}

__attribute__((noinline)) long tail_a(long x) {
    tail_a_calls++;
    __asm__ volatile("" ::: "memory");
    return tail_b(x + 1);
}

__attribute__((noinline)) void lj_inner(int jump) {
    lj_inner_calls++;
    __asm__ volatile("" ::: "memory");
    if (jump)
        longjmp(jb, 1);
}

__attribute__((noinline)) void lj_outer(int jump) {
    lj_outer_calls++;
    lj_inner(jump);
    __asm__ volatile("" ::: "memory");
}

int main(int argc, char **argv) {
    long deep = argc > 1 ? atol(argv[1]) : 5000;
    long rounds = argc > 2 ? atol(argv[2]) : 100;
    unsigned long sum = 0;
    sum += depth(deep);
    for (long i = 0; i < rounds; i++) {
        sum += tail_a(i);
        if (setjmp(jb) == 0)
            lj_outer(1);
        lj_outer(0);
        sum += depth(3);
    }
    printf("depth_calls %ld\ntail_a_calls %ld\ntail_b_calls %ld\nlj_outer_calls %ld\n"
           "lj_inner_calls %ld\nsum %lu\n",
           depth_calls, tail_a_calls, tail_b_calls, lj_outer_calls, lj_inner_calls, sum);
    return 0;
}
