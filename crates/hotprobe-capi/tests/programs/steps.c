/* The target of handler_crash.rs: prints "ready PID", then for each line
 * N read from stdin calls work(i) N times (i counting all calls) and
 * prints "calls C total T"; at a line 0 or the end of input prints
 * "end calls C total T" and exits with status 7. */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

__attribute__((noinline)) long work(long i) { return i * 3 + 1; }

int main(void) {
    long calls = 0, total = 0;
    char line[64];
    printf("ready %d\n", (int)getpid());
    fflush(stdout);
    while (fgets(line, sizeof line, stdin)) {
        long n = atol(line);
        if (n <= 0)
            break;
        for (long k = 0; k < n; k++)
            total += work(calls++);
        printf("calls %ld total %ld\n", calls, total);
        fflush(stdout);
    }
    printf("end calls %ld total %ld\n", calls, total);
    return 7;
}
