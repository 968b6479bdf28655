/* Waits for a line on stdin between phases; calls work() in a loop.
   Prints "ready", reads a line, runs, prints the total. */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
volatile long last_a;
__attribute__((noinline)) long work(long a, long b) {
    last_a = a;
    return a * 2 + b;
}
int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 1000, s = 0;
    printf("ready\n");
    fflush(stdout);
    char buf[16];
    if (read(0, buf, sizeof buf) <= 0) return 1;
    for (long i = 0; i < n; i++) { s += work(i & 3, 1); if (i % 1000 == 0) usleep(100); }
    printf("total %ld\n", s);
    return 0;
}
