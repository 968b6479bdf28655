/* Calls clock_gettime and syscall(SYS_getpid) N times each and prints
 * how often: a probe on either must count exactly these calls, none of
 * the agent's own. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#include <sys/syscall.h>

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 2000;
    long sum = 0;
    int clocks = 0, syscalls = 0;
    for (int i = 0; i < n; i++) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        sum += ts.tv_nsec & 1;
        clocks++;
        sum += syscall(SYS_getpid) > 0;
        syscalls++;
    }
    printf("clock_gettime %d\nsyscall %d\nsum %ld\n", clocks, syscalls, sum >= n ? 1L : 0L);
    return 0;
}
