/* USDT markers as distributions build them (<sys/sdt.h>): tick, guarded by
 * its semaphore as dtrace -h headers do, with a register, a memory and a
 * constant operand; done, without one. Prints each tick's arguments when
 * the guarded block runs (the semaphore was raised), what it computed, and
 * how many times the guarded block ran. */
#define _SDT_HAS_SEMAPHORES 1
#include <stdio.h>
#include <stdlib.h>
#include <sys/sdt.h>

unsigned short demo_tick_semaphore __attribute__((unused)) __attribute__((section(".probes")));
unsigned short demo_done_semaphore __attribute__((unused)) __attribute__((section(".probes")));
long total;
int guarded_runs;

__attribute__((noinline)) void tick(int i, long *acc) {
    *acc += i;
    if (demo_tick_semaphore) {
        guarded_runs++;
        DTRACE_PROBE3(demo, tick, i, *acc, 42);
        /* What the marker's arguments are, for a tracer to compare. */
        fprintf(stderr, "tick(%d, %ld, 42)\n", i, *acc);
    }
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 5;
    long acc = 0;
    for (int i = 0; i < n; i++) tick(i, &acc);
    DTRACE_PROBE(demo, done);
    printf("acc=%ld\n", acc);
    fprintf(stderr, "guarded=%d\n", guarded_runs);
    return 0;
}
