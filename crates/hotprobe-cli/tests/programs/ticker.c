/* Runs on its own for a while: prints "ready PID", then N rounds of
   tick() (which calls work()) about 1 ms apart, then "done N". */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static volatile long sink;

__attribute__((noinline)) void work(int i) { sink += i; }

__attribute__((noinline)) void tick(int i) {
    sink++; /* (a call in its first 5 bytes would keep the jump mechanism off) */
    work(i);
    struct timespec ts = {0, 1000000L};
    nanosleep(&ts, NULL);
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 1500;
    printf("ready %d\n", (int)getpid());
    fflush(stdout);
    int i;
    for (i = 0; i < n; i++)
        tick(i);
    printf("done %d\n", i);
    return 0;
}
