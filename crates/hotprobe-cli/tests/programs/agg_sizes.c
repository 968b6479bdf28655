/* Allocates N sizes from a fixed pseudo-random sequence and logs each one
 * ("SIZE n", with write(2): stdio would allocate its buffer through
 * malloc) before its call, and the pointer it returned ("PTR p") after; then passes N ints, negative ones among them,
 * to take() ("TAKE n"); then, given M, take(0) .. take(M - 1) without a
 * word ("DISTINCT M"). The aggregation tests compare hotprobe's
 * histograms of malloc's argument and take's parameter with this log. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void say(const char *what, long v) {
    char line[64];
    int n = snprintf(line, sizeof line, "%s %ld\n", what, v);
    if (write(1, line, (size_t)n) != n)
        _exit(3);
}

static volatile long taken;

/* An int parameter: its register's upper half is no part of it. */
__attribute__((noinline)) void take(int n) { taken += n; }

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 200;
    unsigned long x = 12345;
    void **keep = calloc((size_t)n, sizeof *keep);
    if (!keep)
        return 1;
    for (int i = 0; i < n; i++) {
        x = x * 6364136223846793005UL + 1442695040888963407UL;
        /* Spread over 0 .. 2^17, denser at small sizes. */
        unsigned long size = (x >> 33) % (1UL << (x >> 60));
        say("SIZE", (long)size);
        keep[i] = malloc(size);
        say("PTR", (long)keep[i]);
    }
    for (int i = 0; i < n; i++) {
        x = x * 6364136223846793005UL + 1442695040888963407UL;
        int v = (int)((x >> 40) % 20001) - 10000;
        say("TAKE", v);
        take(v);
    }
    int distinct = argc > 2 ? atoi(argv[2]) : 0;
    say("DISTINCT", distinct);
    for (int i = 0; i < distinct; i++)
        take(i);
    for (int i = 0; i < n; i++)
        free(keep[i]);
    free(keep);
    return 0;
}
