/* 4 threads, each running a nested/recursive call pattern whose shape
 * depends on the thread's index; every probed function logs "TID DEPTH
 * NAME" on entry into a per-thread buffer (its own instrumentation,
 * through note_enter/note_leave, which the test excludes from recording).
 * main prints every buffer at the end: the call tree `hotprobe replay`
 * must show. The workers wait for each other (a barrier, once each has
 * entered `worker`) so that all four are alive at once: a run with fewer
 * ring slots than threads then loses some, whatever the timing. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <sys/syscall.h>
#include <unistd.h>

#define NTHREADS 4
#define MAXLINES 4096

struct log {
    int tid;
    int depth;
    int n;
    char line[MAXLINES][48];
};

static struct log logs[NTHREADS + 1];
static pthread_barrier_t all_started;
static __thread struct log *L;

__attribute__((noinline)) void note_enter(const char *name) {
    if (L->n < MAXLINES)
        snprintf(L->line[L->n++], sizeof L->line[0], "%d %d %s", L->tid, L->depth, name);
    L->depth++;
}

__attribute__((noinline)) void note_leave(void) { L->depth--; }

static volatile int sink;

__attribute__((noinline)) int leaf(int x) {
    note_enter("leaf");
    sink += x;
    note_leave();
    return x * 2;
}

__attribute__((noinline)) int fib(int n) {
    note_enter("fib");
    int r = n < 2 ? leaf(n) : fib(n - 1) + fib(n - 2);
    note_leave();
    return r;
}

__attribute__((noinline)) int fan(int k) {
    note_enter("fan");
    int s = 0;
    for (int i = 0; i < k; i++)
        s += leaf(i);
    note_leave();
    return s;
}

__attribute__((noinline)) int nest(int d) {
    note_enter("nest");
    int r = d == 0 ? fan(2) : nest(d - 1) + 1;
    note_leave();
    return r;
}

__attribute__((noinline)) void *worker(void *arg) {
    int idx = (int)(long)arg;
    L = &logs[idx];
    L->tid = (int)syscall(SYS_gettid);
    note_enter("worker");
    pthread_barrier_wait(&all_started);
    int s = 0;
    for (int round = 0; round <= idx; round++) {
        s += fib(2 + idx);
        s += nest(idx);
    }
    s += fan(idx + 1);
    note_leave();
    return (void *)(long)s;
}

int main(void) {
    L = &logs[NTHREADS];
    L->tid = (int)syscall(SYS_gettid);
    note_enter("main");
    pthread_t th[NTHREADS];
    pthread_barrier_init(&all_started, NULL, NTHREADS);
    for (long i = 0; i < NTHREADS; i++)
        pthread_create(&th[i], NULL, worker, (void *)i);
    for (int i = 0; i < NTHREADS; i++)
        pthread_join(th[i], NULL);
    fan(3);
    note_leave();
    for (int t = 0; t <= NTHREADS; t++)
        for (int i = 0; i < logs[t].n; i++)
            printf("%s\n", logs[t].line[i]);
    return 0;
}
