/* Holds a pattern in the upper halves of ymm0 and ymm9 (live across the
 * whole run: the loop's own code uses no AVX, built with -mno-avx) and
 * checks it on every round, calling `work` each time; prints its ready
 * line, runs until its stdin is readable or closed, then says whether
 * the pattern ever changed: "checks>0 1 changed 0" as without hotprobe.
 * A tracer's remote call that runs glibc code on this thread (whose AVX
 * functions end with vzeroupper) changes it unless it gives the whole
 * extended state back. */
#define _GNU_SOURCE
#include <poll.h>
#include <stdio.h>
#include <unistd.h>

static const unsigned long long pattern[4] = {0x0123456789abcdefULL, 0x1122334455667788ULL,
                                              0x99aabbccddeeff00ULL, 0xfedcba9876543210ULL};
volatile long sink;

__attribute__((noinline)) void work(long i) { sink += i; }

static int held(void) {
    unsigned long long a[4], b[4];
    __asm__ volatile("vmovdqu %%ymm0, %0\n\tvmovdqu %%ymm9, %1" : "=m"(a), "=m"(b));
    int same = 1;
    for (int i = 0; i < 4; i++)
        same &= a[i] == pattern[i] && b[i] == pattern[i];
    return same;
}

static void load(void) {
    __asm__ volatile("vmovdqu %0, %%ymm0\n\tvmovdqu %0, %%ymm9" ::"m"(pattern) : "xmm0", "xmm9");
}

int main(void) {
    printf("ready %d\n", getpid());
    fflush(stdout);
    long checks = 0, changed = 0;
    load();
    for (;;) {
        if (!held()) {
            changed++;
            load();
        }
        checks++;
        work(checks);
        struct pollfd p = {0, POLLIN, 0};
        if (poll(&p, 1, 0) > 0)
            break;
    }
    printf("checks>0 %d changed %ld\n", checks > 0, changed);
    return 0;
}
