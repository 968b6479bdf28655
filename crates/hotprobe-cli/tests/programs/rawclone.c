// Threads made by a raw clone(CLONE_VM | CLONE_THREAD | ...) without
// CLONE_SETTLS: they run on their creator's thread pointer (its TLS).
// Four such threads call `work` N times each while main calls it 1000
// times, all started together; main waits for each through
// CLONE_CHILD_CLEARTID. The threads
// call nothing of libc (they have no TLS of their own).
#define _GNU_SOURCE
#include <linux/futex.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

#define NT 4
#define STACK (256 * 1024)

__attribute__((noinline)) long work(long x) {
    __asm__ volatile("" ::: "memory");
    return x * 3 + 1;
}

static long n;
static long sums[NT];
static volatile pid_t ctid[NT];
static int ready, go;

static int body(void *arg) {
    long id = (long)arg, s = 0;
    // All start together: their calls overlap on both cores.
    __atomic_add_fetch(&ready, 1, __ATOMIC_SEQ_CST);
    while (!__atomic_load_n(&go, __ATOMIC_ACQUIRE)) __asm__ volatile("pause");
    for (long i = 0; i < n; i++) s += work(i + id);
    sums[id] = s;
    return 0;
}

int main(int argc, char **argv) {
    n = argc > 1 ? atol(argv[1]) : 50000;
    setvbuf(stdout, NULL, _IOLBF, 0);
    const int flags = CLONE_VM | CLONE_FS | CLONE_FILES | CLONE_SIGHAND | CLONE_THREAD |
                      CLONE_SYSVSEM | CLONE_PARENT_SETTID | CLONE_CHILD_CLEARTID;
    for (long id = 0; id < NT; id++) {
        char *stack = malloc(STACK);
        if (clone(body, stack + STACK, flags, (void *)id, &ctid[id], NULL, &ctid[id]) < 0) {
            perror("clone");
            return 1;
        }
    }
    while (__atomic_load_n(&ready, __ATOMIC_ACQUIRE) < NT) __asm__ volatile("pause");
    __atomic_store_n(&go, 1, __ATOMIC_RELEASE);
    long s = 0;
    for (long i = 0; i < 1000; i++) s += work(i);
    for (int id = 0; id < NT; id++) {
        pid_t t;
        while ((t = ctid[id]) != 0) syscall(SYS_futex, &ctid[id], FUTEX_WAIT, t, NULL, NULL, 0);
    }
    for (int id = 0; id < NT; id++) s += sums[id];
    printf("calls=%ld sum=%ld\n", NT * n + 1000, s);
    return 0;
}
