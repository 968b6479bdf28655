/* Calls work N times, enters seccomp strict mode (only read, write,
 * _exit and sigreturn allowed from then on), calls work N more times,
 * writes its counts with write(2) and leaves with the exit system call
 * (exit_group is not allowed). */
#define _GNU_SOURCE
#include <linux/seccomp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

__attribute__((noinline)) long work(long x) {
    __asm__ volatile("" ::: "memory");
    return x + 7;
}

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 1000;
    long s = 0;
    for (long i = 0; i < n; i++)
        s += work(i);
    char buf[128];
    int len = snprintf(buf, sizeof buf, "before %ld\n", n);
    fflush(stdout);
    if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_STRICT) != 0) {
        perror("prctl");
        return 2;
    }
    for (long i = 0; i < n; i++)
        s += work(i);
    len += snprintf(buf + len, sizeof buf - len, "after %ld\nsum %ld\n", n, s);
    write(1, buf, len);
    syscall(SYS_exit, 0);
    return 1;
}
