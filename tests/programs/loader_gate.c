/* A program that stops inside the dynamic loader until told to go on.
 *
 * `pick_work` is an IFUNC resolver: ld.so runs it while it relocates this
 * executable, after libc is mapped and relocated but before libc's early
 * initialisation and before `_r_debug.r_state` is back to RT_CONSISTENT.
 * It writes "L" to stderr (fd 2), then blocks reading one byte from stdin
 * (fd 0), through raw system calls (libc is not initialised yet). A test
 * attaches while it is blocked there.
 *
 * main then calls work(i) for i in 0..N (N = argv[1], default 10) and
 * prints "sum S calls N".
 */
#include <stdio.h>
#include <stdlib.h>

static long raw3(long nr, long a, long b, long c)
{
    long ret;
    __asm__ volatile("syscall"
                     : "=a"(ret)
                     : "a"(nr), "D"(a), "S"(b), "d"(c)
                     : "rcx", "r11", "memory");
    return ret;
}

__attribute__((noinline)) long work_impl(long x)
{
    return x * 3 + 1;
}

static long (*pick_work(void))(long)
{
    char c = 'L';
    raw3(1 /* write */, 2, (long)&c, 1);
    long r;
    do {
        r = raw3(0 /* read */, 0, (long)&c, 1);
    } while (r == -4 /* EINTR */);
    return work_impl;
}

long work(long x) __attribute__((ifunc("pick_work")));

int main(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 10;
    long sum = 0;
    for (long i = 0; i < n; i++)
        sum += work(i);
    printf("sum %ld calls %ld\n", sum, n);
    return 0;
}
