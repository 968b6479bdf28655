/* Allocates N sizes from a fixed pseudo-random sequence and logs each one
 * ("SIZE n", with write(2): stdio would allocate its buffer through
 * malloc) before its call. The aggregation tests compare hotprobe's
 * histograms of malloc's argument with this log. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void say(const char *what, unsigned long v) {
    char line[64];
    int n = snprintf(line, sizeof line, "%s %lu\n", what, v);
    if (write(1, line, (size_t)n) != n)
        _exit(3);
}

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
        say("SIZE", size);
        keep[i] = malloc(size);
    }
    for (int i = 0; i < n; i++)
        free(keep[i]);
    free(keep);
    return 0;
}
