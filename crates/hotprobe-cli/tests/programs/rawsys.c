// Signal state and seccomp changed by raw system calls, under an
// in-process trap on `tiny` (4 bytes: too short for a jump).
//
// mask: four threads each block every signal with
//   syscall(SYS_rt_sigprocmask) — or, built with -DINLINE_SYSCALL, with a
//   `syscall` instruction of the program's own — call tiny 1000 times and
//   read the mask back the same way (not in the -DINLINE_SYSCALL build).
// ignore: SIGTRAP ignored with syscall(SYS_rt_sigaction) and blocked with
//   syscall(SYS_rt_sigprocmask); tiny 1000 times; the action read back.
// strict: tiny 1000 times, seccomp strict mode entered with
//   syscall(SYS_seccomp), tiny 1000 times, the counts written with
//   write(2), then the exit system call (exit_group is not allowed).
#define _GNU_SOURCE
#include <linux/seccomp.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

__attribute__((noinline)) int tiny(int x) { return x + 1; }

struct kact {
    unsigned long handler, flags, restorer, mask;
};

static long raw_mask(int how, const unsigned long *set, unsigned long *old) {
#ifdef INLINE_SYSCALL
    long r;
    register long r10 __asm__("r10") = 8;
    __asm__ volatile("syscall"
                     : "=a"(r)
                     : "0"((long)SYS_rt_sigprocmask), "D"((long)how), "S"(set), "d"(old), "r"(r10)
                     : "rcx", "r11", "memory");
    return r;
#else
    return syscall(SYS_rt_sigprocmask, how, set, old, 8);
#endif
}

static const unsigned long TRAP = 1UL << (SIGTRAP - 1);

static void *worker(void *arg) {
    unsigned long all = ~0UL, old = 0;
    raw_mask(SIG_BLOCK, &all, NULL);
    long s = 0;
    for (int i = 0; i < 1000; i++) s += tiny(i);
#ifndef INLINE_SYSCALL
    raw_mask(SIG_BLOCK, NULL, &old);
#else
    // Not read back: this build's probe is on the ptrace trap, and an int3
    // in a thread that blocks SIGTRAP has the kernel unblock it (its
    // forced signal) before the tracer sees the stop.
    old = TRAP;
#endif
    *(long *)arg = s + ((old & TRAP) ? 1000000L : 0);
    return NULL;
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "mask";
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (!strcmp(mode, "mask")) {
        pthread_t t[4];
        long r[4];
        for (int i = 0; i < 4; i++) pthread_create(&t[i], NULL, worker, &r[i]);
        for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
        long s = 0;
        for (int i = 0; i < 4; i++) s += r[i];
        printf("calls=4000 result=%ld\n", s);
    } else if (!strcmp(mode, "ignore")) {
        struct kact act = {(unsigned long)SIG_IGN, 0, 0, 0}, now;
        if (syscall(SYS_rt_sigaction, SIGTRAP, &act, NULL, 8)) { perror("rt_sigaction"); return 1; }
        unsigned long set = TRAP, old = 0;
        syscall(SYS_rt_sigprocmask, SIG_BLOCK, &set, NULL, 8);
        long s = 0;
        for (int i = 0; i < 1000; i++) s += tiny(i);
        syscall(SYS_rt_sigprocmask, SIG_BLOCK, NULL, &old, 8);
        syscall(SYS_rt_sigaction, SIGTRAP, NULL, &now, 8);
        printf("calls=1000 sum=%ld blocked=%d ignored=%d\n", s, !!(old & TRAP),
               now.handler == (unsigned long)SIG_IGN);
    } else if (!strcmp(mode, "strict")) {
        long s = 0;
        for (int i = 0; i < 1000; i++) s += tiny(i);
        fflush(stdout);
        if (syscall(SYS_seccomp, SECCOMP_SET_MODE_STRICT, 0, NULL)) { perror("seccomp"); return 2; }
        for (int i = 0; i < 1000; i++) s += tiny(i);
        char buf[64];
        int len = snprintf(buf, sizeof buf, "before=1000 after=1000 sum=%ld\n", s);
        write(1, buf, len);
        syscall(SYS_exit, 0);
    }
    return 0;
}
