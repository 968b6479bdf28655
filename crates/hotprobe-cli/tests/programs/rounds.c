/* Prints "ready PID", waits for a line on stdin, then runs N rounds
 * (about 300 µs apart) of `round_`, which calls `step` 5 times and prints
 * "round I SUM", then prints "done N TOTAL". The output after "ready"
 * depends on nothing but N. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static volatile long sink;

__attribute__((noinline)) long step(long x) {
    sink += x;
    return x * 7 % 1000;
}

__attribute__((noinline)) long round_(int i) {
    long s = 0;
    for (int k = 0; k < 5; k++)
        s += step(i * 5 + k);
    printf("round %d %ld\n", i, s);
    fflush(stdout);
    return s;
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 400;
    printf("ready %d\n", (int)getpid());
    fflush(stdout);
    char go[16];
    if (!fgets(go, sizeof go, stdin))
        return 1;
    long total = 0;
    for (int i = 0; i < n; i++) {
        total += round_(i);
        struct timespec ts = {0, 300000L};
        nanosleep(&ts, NULL);
    }
    printf("done %d %ld\n", n, total);
    return 0;
}
