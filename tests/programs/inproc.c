/* In-process trap tracee: sites where neither a patch nor a jump fits.
 *
 * two_byte: a 2-byte function (xchg eax, edi; ret): returns its argument.
 * one_byte: a 1-byte function (ret).
 * mid_fn:   add edi, 1; mov eax, [rip+bias]; add eax, edi; ret — probed at
 *           +3 (a RIP-relative load in the middle of a function) and at +9.
 *
 * argv[1] threads each call every function argv[2] times. The program
 * also installs its own SIGTRAP handler (sigaction, SA_SIGINFO) and runs
 * two int3s of its own: its handler must see both (argv[3] "signal":
 * installed with signal() instead). Prints the sum of every result and
 * the number of its own traps. */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <ucontext.h>

int bias = 1000;

__asm__(".text\n"
        ".globl two_byte\n.type two_byte,@function\n"
        "two_byte:\n  xchg %edi, %eax\n  ret\n"
        ".size two_byte, .-two_byte\n"
        ".globl one_byte\n.type one_byte,@function\n"
        "one_byte:\n  ret\n"
        ".size one_byte, .-one_byte\n"
        ".globl mid_fn\n.type mid_fn,@function\n"
        "mid_fn:\n  add $1, %edi\n  mov bias(%rip), %eax\n  add %edi, %eax\n  ret\n"
        ".size mid_fn, .-mid_fn\n");

int two_byte(int);
void one_byte(void);
int mid_fn(int);

static volatile sig_atomic_t own_traps;
static long iters;

static void on_trap_plain(int sig) {
    (void)sig;
    own_traps++;
}

/* What each of the first traps the handler saw was (si_code, address),
 * printed at the end: a trap of hotprobe's that reached the program says
 * which it was. */
static volatile int trap_codes[4];
static volatile unsigned long trap_rips[4];

static void on_trap(int sig, siginfo_t *si, void *uc) {
    (void)sig;
    int n = own_traps;
    if (n < 4) {
        trap_codes[n] = si->si_code;
        trap_rips[n] = (unsigned long)((ucontext_t *)uc)->uc_mcontext.gregs[REG_RIP];
    }
    own_traps++;
}

static void *worker(void *arg) {
    long id = (long)arg;
    long sum = 0;
    for (long i = 0; i < iters; i++) {
        sum += two_byte((int)(i + id));
        one_byte();
        sum += mid_fn((int)i);
    }
    return (void *)sum;
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 8;
    iters = argc > 2 ? atol(argv[2]) : 1000;
    struct sigaction sa = {0};
    sa.sa_sigaction = on_trap;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    if (argc > 3 && argv[3][0] == 's') {
        if (signal(SIGTRAP, on_trap_plain) == SIG_ERR) {
            perror("signal");
            return 1;
        }
    } else if (sigaction(SIGTRAP, &sa, NULL) != 0) {
        perror("sigaction");
        return 1;
    }
    __asm__ volatile("int3");
    pthread_t t[64];
    if (n > 64)
        n = 64;
    for (long i = 0; i < n; i++)
        pthread_create(&t[i], NULL, worker, (void *)i);
    long total = 0;
    for (int i = 0; i < n; i++) {
        void *r;
        pthread_join(t[i], &r);
        total += (long)r;
    }
    __asm__ volatile("int3");
    printf("total %ld\n", total);
    printf("own traps %d\n", (int)own_traps);
    for (int i = 0; i < own_traps && i < 4; i++)
        printf("trap %d: si_code %d at %#lx\n", i, trap_codes[i], trap_rips[i]);
    return 0;
}
