/* Non-local exits out of functions under return probes; each mode prints
 * the calls and normal returns it made, counted by the program itself.
 *   nonlocal longjmp ROUNDS   each round: deep(4) (5 calls) left by longjmp
 *                             from the innermost, then deep(2) (3 calls)
 *                             returning normally
 *   nonlocal sigalrm ROUNDS   each round: work(1) arms a 2 ms timer and
 *                             spins until the SIGALRM handler siglongjmps
 *                             out of it, then work(0) returns normally
 *   nonlocal setjmp ROUNDS    setjmp/longjmp in a loop (nothing probed
 *                             should change that)
 *   nonlocal altstack ROUNDS  a thread whose signal stack lies above its
 *                             stack: deep(2) raises SIGUSR1 at the bottom,
 *                             the handler (on the signal stack) calls
 *                             deep(1); everything returns normally
 *   nonlocal exit THREADS     threads that pthread_exit from deep(3)
 *   nonlocal threads N ITERS  N threads call deep(0) ITERS times each */
#define _GNU_SOURCE
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/time.h>

static jmp_buf jb;
static sigjmp_buf sjb;
static volatile int jumping, exiting;
static volatile long sink;
static long deep_calls, deep_returns, work_calls, work_returns, jumps;

__attribute__((noinline, noipa)) long deep(long n) {
    __atomic_add_fetch(&deep_calls, 1, __ATOMIC_RELAXED);
    long r = 0;
    if (n == 0) {
        if (jumping)
            longjmp(jb, 1);
        if (exiting)
            pthread_exit(NULL);
        if (exiting == 0 && jumping == 0 && sink == -1)
            raise(SIGUSR1);
    } else {
        r = deep(n - 1) + 1;
    }
    sink = r;
    __atomic_add_fetch(&deep_returns, 1, __ATOMIC_RELAXED);
    return r;
}

__attribute__((noinline, noipa)) long work(long spin) {
    work_calls++;
    long i = 0;
    if (spin) {
        /* Armed here, so that it fires inside this call whatever the delay. */
        struct itimerval it = {{0, 0}, {0, 2000}};
        setitimer(ITIMER_REAL, &it, NULL);
    }
    while (spin)
        sink = ++i;
    work_returns++;
    return i;
}

static void on_alarm(int sig) {
    (void)sig;
    jumps++;
    siglongjmp(sjb, 1);
}

static void on_usr1(int sig) {
    (void)sig;
    sink = 0;
    deep(1);
    sink = -1;
    jumps++;
}

struct alt_arg {
    void *stack;
    long rounds;
};

static void *alt_thread(void *p) {
    struct alt_arg *a = p;
    stack_t ss = {.ss_sp = a->stack, .ss_size = 1 << 16, .ss_flags = 0};
    if (sigaltstack(&ss, NULL) != 0)
        abort();
    char here;
    printf("altstack above the stack: %d\n", (char *)a->stack > &here);
    fflush(stdout);
    for (long i = 0; i < a->rounds; i++) {
        sink = -1;
        deep(2);
    }
    return NULL;
}

static void *exit_thread(void *p) {
    (void)p;
    deep(3);
    return (void *)1; /* never: deep(0) calls pthread_exit */
}

static long iters;
static void *loop_thread(void *p) {
    (void)p;
    long s = 0;
    for (long i = 0; i < iters; i++)
        s += deep(0) + 1;
    return (void *)s;
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "longjmp";
    static long n;
    n = argc > 2 ? atol(argv[2]) : 100;
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (!strcmp(mode, "longjmp")) {
        for (volatile long r = 0; r < n; r++) {
            if (!setjmp(jb)) {
                jumping = 1;
                deep(4);
            }
            jumping = 0;
            deep(2);
        }
        printf("deep calls=%ld returns=%ld\n", deep_calls, deep_returns);
    } else if (!strcmp(mode, "sigalrm")) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_alarm;
        sigaction(SIGALRM, &sa, NULL);
        for (volatile long r = 0; r < n; r++) {
            if (!sigsetjmp(sjb, 1))
                work(1);
            work(0);
        }
        printf("work calls=%ld returns=%ld jumps=%ld\n", work_calls, work_returns, jumps);
    } else if (!strcmp(mode, "setjmp")) {
        volatile long k = 0;
        for (volatile long r = 0; r < n; r++) {
            if (!setjmp(jb))
                longjmp(jb, 1);
            k++;
        }
        printf("setjmp rounds=%ld\n", k);
    } else if (!strcmp(mode, "altstack")) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_usr1;
        sa.sa_flags = SA_ONSTACK;
        sigaction(SIGUSR1, &sa, NULL);
        /* Mapped before the thread's stack, so above it. */
        struct alt_arg a = {mmap(NULL, 1 << 16, PROT_READ | PROT_WRITE,
                                 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0),
                            n};
        pthread_t t;
        pthread_create(&t, NULL, alt_thread, &a);
        pthread_join(t, NULL);
        printf("deep calls=%ld returns=%ld signals=%ld\n", deep_calls, deep_returns, jumps);
    } else if (!strcmp(mode, "exit")) {
        exiting = 1;
        for (long i = 0; i < n; i++) {
            pthread_t t;
            void *r;
            pthread_create(&t, NULL, exit_thread, NULL);
            pthread_join(t, &r);
            if (r != NULL)
                abort();
        }
        printf("deep calls=%ld returns=%ld\n", deep_calls, deep_returns);
    } else if (!strcmp(mode, "threads")) {
        iters = argc > 3 ? atol(argv[3]) : 1000;
        pthread_t t[64];
        if (n > 64)
            n = 64;
        for (long i = 0; i < n; i++)
            pthread_create(&t[i], NULL, loop_thread, NULL);
        long total = 0;
        for (long i = 0; i < n; i++) {
            void *r;
            pthread_join(t[i], &r);
            total += (long)r;
        }
        printf("deep calls=%ld returns=%ld total=%ld\n", deep_calls, deep_returns, total);
    } else {
        fprintf(stderr, "unknown mode %s\n", mode);
        return 2;
    }
    return 0;
}
