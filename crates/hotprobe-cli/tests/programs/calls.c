/* Calls whose tree, arguments and durations the program logs itself, for
 * the tests of replay/report filters, histograms, diffs and exports.
 *
 * main (thread 0) calls outer(N); two workers (threads 1, 2) call
 * outer(N + idx) and rec(1 + idx); after a 60 ms pause main calls late(N).
 * outer(n) calls middle(i) for i < n; middle(i) calls leaf(i) and, for odd
 * i, slow(i), which sleeps 20 ms; rec(d) recurses down to leaf(-1); late(n)
 * calls leaf(100 + i). Every probed function logs itself through note_*
 * (which the tests exclude from recording): main prints one line per call,
 * "TID DEPTH NAME ARG START_NS END_NS", times (CLOCK_MONOTONIC) taken
 * inside the call. Argument: N (default 3). */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define MAXCALLS 1024
#define SLOW_MS 20
#define GAP_MS 60

struct call {
    int depth;
    const char *name;
    long arg;
    long t0, t1;
};

struct log {
    int tid;
    int depth;
    int n;
    struct call c[MAXCALLS];
};

static struct log logs[3];
static __thread struct log *L;
static volatile long sink;

__attribute__((noinline)) long note_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000L + t.tv_nsec;
}

__attribute__((noinline)) int note_enter(const char *name, long arg) {
    int i = L->n++;
    L->c[i].depth = L->depth++;
    L->c[i].name = name;
    L->c[i].arg = arg;
    L->c[i].t0 = note_now();
    return i;
}

__attribute__((noinline)) void note_leave(int i) {
    L->c[i].t1 = note_now();
    L->depth--;
}

__attribute__((noinline)) void note_nap(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0) {
    }
}

__attribute__((noinline)) long leaf(long x) {
    int s = note_enter("leaf", x);
    sink += x;
    note_leave(s);
    return x * 2;
}

__attribute__((noinline)) long slow(long x) {
    int s = note_enter("slow", x);
    note_nap(SLOW_MS);
    note_leave(s);
    return x + 1;
}

__attribute__((noinline)) long middle(long i) {
    int s = note_enter("middle", i);
    long r = leaf(i);
    if (i % 2)
        r += slow(i);
    note_leave(s);
    return r;
}

__attribute__((noinline)) long outer(long n) {
    int s = note_enter("outer", n);
    long r = 0;
    for (long i = 0; i < n; i++)
        r += middle(i);
    note_leave(s);
    return r;
}

__attribute__((noinline)) long rec(long d) {
    int s = note_enter("rec", d);
    long r = d > 0 ? rec(d - 1) + 1 : leaf(-1);
    note_leave(s);
    return r;
}

__attribute__((noinline)) long late(long n) {
    int s = note_enter("late", n);
    long r = 0;
    for (long i = 0; i < n; i++)
        r += leaf(100 + i);
    note_leave(s);
    return r;
}

static long n_arg = 3;

__attribute__((noinline)) void *worker(void *arg) {
    long idx = (long)arg;
    L = &logs[idx];
    L->tid = (int)syscall(SYS_gettid);
    int s = note_enter("worker", idx);
    sink += outer(n_arg + idx) + rec(1 + idx);
    note_leave(s);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc > 1)
        n_arg = atol(argv[1]);
    L = &logs[0];
    L->tid = (int)syscall(SYS_gettid);
    int s = note_enter("main", argc);
    sink += outer(n_arg);
    pthread_t th[2];
    for (long i = 1; i <= 2; i++)
        pthread_create(&th[i - 1], NULL, worker, (void *)i);
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
    note_nap(GAP_MS);
    sink += late(n_arg);
    note_leave(s);
    for (int t = 0; t < 3; t++)
        for (int i = 0; i < logs[t].n; i++) {
            struct call *c = &logs[t].c[i];
            printf("%d %d %s %ld %ld %ld\n", logs[t].tid, c->depth, c->name, c->arg, c->t0, c->t1);
        }
    return 0;
}
