/* A watched global written once by the kernel (read(2) from a pipe into
 * it) and then by the program (a plain store). Between the two the program
 * keeps running for 2.5 s (its workload), then prints what it saw. */
#include <stdio.h>
#include <time.h>
#include <unistd.h>

volatile int counter = 10;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

int main(void) {
    int fds[2], v = 1005;
    if (pipe(fds) != 0 || write(fds[1], &v, sizeof v) != sizeof v) return 1;
    if (read(fds[0], (void *)&counter, sizeof counter) != sizeof counter) return 2;
    printf("after read %d\n", counter);
    fflush(stdout);
    double end = now() + 2.5;
    while (now() < end) usleep(1000);
    counter = 2001;
    printf("after store %d\n", counter);
    return 0;
}
