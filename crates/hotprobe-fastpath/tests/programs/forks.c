/* f (probed with its return hook) forks inside its 4th call. The child
   returns from that call (through the agent's return trampoline when the
   return was hooked), calls f and g 5 times each, prints what it computed
   and exits 0; the parent makes 10 calls of f and g in all, waits for the
   child and prints its own results and the child's exit status. */
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static volatile int in_child;
static volatile pid_t child;
volatile long last_g;

__attribute__((noinline)) long g(long x) {
    last_g = x; /* long enough an entry for the jump mechanism */
    return x + 7;
}

__attribute__((noinline)) long f(long x) {
    long r = x * 2 + 1;
    if (x == 3) {
        pid_t p = fork();
        if (p < 0)
            exit(3);
        if (p == 0)
            in_child = 1;
        else
            child = p;
    }
    __asm__ volatile("" ::: "memory");
    return r;
}

int main(void) {
    long s = 0, t = 0;
    for (long i = 0; i < 10; i++) {
        s += f(i);
        if (in_child) {
            long c = 0, d = 0;
            for (long j = 0; j < 5; j++) {
                c += f(100 + j);
                d += g(100 + j);
            }
            printf("child %ld %ld %ld %ld\n", s, t, c, d);
            fflush(stdout);
            return 0;
        }
        t += g(i);
    }
    int st = -1;
    if (waitpid(child, &st, 0) != child)
        return 4;
    printf("parent %ld %ld status %d\n", s, t, WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    return 0;
}
