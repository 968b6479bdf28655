/* The in-process trap micro-benchmark: a loop calling a 2-byte function
 * (xchg eax, edi; ret) N times: no patch or jump fits it. Prints the
 * loop's own wall time, so tracer start-up is not counted.
 *   inproc N         N calls of two()
 *   inproc N floor   N int3s caught by a SIGTRAP handler of its own (the
 *                    floor of any in-process trap: no hotprobe)
 *   inproc N jump    N calls of five() (mov eax, edi; add eax, 7; ret:
 *                    5 bytes at its entry, the jump mechanism fits) */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

__asm__(".text\n.globl two\n.type two,@function\n"
        "two:\n  xchg %edi, %eax\n  ret\n"
        ".size two, .-two\n");
int two(int);
__asm__(".text\n.globl five\n.type five,@function\n"
        "five:\n  mov %edi, %eax\n  add $7, %eax\n  ret\n"
        ".size five, .-five\n");
int five(int);

static void on_trap(int sig, siginfo_t *si, void *uc) {
    (void)sig;
    (void)si;
    (void)uc;
}

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 1000000L;
    int floor = argc > 2 && argv[2][0] == 'f';
    int jump = argc > 2 && argv[2][0] == 'j';
    volatile long sink = 0;
    struct timespec a, b;
    if (floor) {
        struct sigaction sa = {0};
        sa.sa_sigaction = on_trap;
        sa.sa_flags = SA_SIGINFO;
        sigemptyset(&sa.sa_mask);
        sigaction(SIGTRAP, &sa, NULL);
    }
    clock_gettime(CLOCK_MONOTONIC, &a);
    if (floor)
        for (long i = 0; i < n; i++)
            __asm__ volatile("int3");
    else if (jump)
        for (long i = 0; i < n; i++)
            sink += five((int)i);
    else
        for (long i = 0; i < n; i++)
            sink += two((int)i);
    clock_gettime(CLOCK_MONOTONIC, &b);
    long ns = (b.tv_sec - a.tv_sec) * 1000000000L + (b.tv_nsec - a.tv_nsec);
    printf("calls %ld ns %ld\n", n, ns);
    return 0;
}
