/* Calls leaf() N times from work() (argv[1], default 20000), then prints
 * "done N": a trace whose replay is longer than a pipe holds. */
#include <stdio.h>
#include <stdlib.h>

static volatile long sink;

__attribute__((noinline)) void leaf(long i) { sink += i; }

__attribute__((noinline)) void work(long n) {
    for (long i = 0; i < n; i++)
        leaf(i);
}

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 20000;
    work(n);
    printf("done %ld\n", n);
    return 0;
}
