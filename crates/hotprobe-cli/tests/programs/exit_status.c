/* Calls work() once, prints "work 1", then exits with status argv[1]
 * (a number), or with "segv" raises SIGSEGV. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static volatile long sink;

__attribute__((noinline)) long work(long x) {
    sink += x;
    return sink * 3 + x;
}

int main(int argc, char **argv) {
    work(1);
    printf("work 1\n");
    fflush(stdout);
    if (argc > 1 && strcmp(argv[1], "segv") == 0)
        raise(SIGSEGV);
    return argc > 1 ? atoi(argv[1]) : 0;
}
