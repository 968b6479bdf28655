/* The target of `hotprobe-bench handlerwait` (issue 22): a process whose
 * tracer serves a shared-memory handler (on `h`) while a ptrace-trap probe
 * (a return probe on `t`) stops it.
 *   handlerwait_target IDLE_MS N
 * calls h once, prints "idle T" (T: CLOCK_MONOTONIC in ns), sleeps IDLE_MS,
 * prints "awake T", times N calls of t alone, then N iterations of t and h
 * in turn (CLOCK_MONOTONIC, its own figures), and prints
 *   t calls N ns NS
 *   th calls N ns NS
 *   calls h H t T          (every call made: H = N + 1, T = 2 N)
 * `h` is 2 bytes (xchg eax, edi; ret): no patch or jump fits it. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

__asm__(".text\n.globl h\n.type h,@function\n"
        "h:\n  xchg %edi, %eax\n  ret\n"
        ".size h, .-h\n");
int h(int);
__asm__(".text\n.globl t\n.type t,@function\n"
        "t:\n  lea 1(%rdi), %eax\n  ret\n"
        ".size t, .-t\n");
int t(int);

static long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000L + ts.tv_nsec;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: handlerwait_target IDLE_MS N\n");
        return 2;
    }
    long idle_ms = atol(argv[1]);
    long n = atol(argv[2]);
    volatile long sink = 0;
    long h_calls = 0, t_calls = 0;

    sink += h(1);
    h_calls++;

    long start = now_ns();
    printf("idle %ld\n", start);
    fflush(stdout);
    long end = start + idle_ms * 1000000L;
    struct timespec until = {end / 1000000000L, end % 1000000000L};
    int r;
    while ((r = clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &until, NULL)) == EINTR)
        ;
    if (r != 0) {
        fprintf(stderr, "clock_nanosleep: %d\n", r);
        return 1;
    }
    printf("awake %ld\n", now_ns());
    fflush(stdout);

    long a = now_ns();
    for (long i = 0; i < n; i++) {
        sink += t((int)i);
        t_calls++;
    }
    long b = now_ns();
    for (long i = 0; i < n; i++) {
        sink += t((int)i);
        t_calls++;
        sink += h((int)i);
        h_calls++;
    }
    long c = now_ns();
    printf("t calls %ld ns %ld\n", n, b - a);
    printf("th calls %ld ns %ld\n", n, c - b);
    printf("calls h %ld t %ld\n", h_calls, t_calls);
    return 0;
}
