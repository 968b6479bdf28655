/* The probe engine's main tracee: does what its arguments say and prints
 * what it did, so tests can compare observed hits, arguments and return
 * values with the program's own account.
 *   target compute N     N calls compute(i, 7), prints each result
 *   target caller N      N calls caller(i) (which calls compute)
 *   target rec DEPTH     one recursive descent rec(DEPTH)
 *   target getpid N      N calls to libc getpid()
 *   target slow MS       slow(MS) sleeps MS milliseconds
 *   target serve         reads commands like the above from stdin, one per line
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

volatile long sink;
long global_counter;

__attribute__((noinline)) long compute(long a, long b) {
    global_counter++; /* a RIP-relative read-modify-write */
    return a * 3 + b;
}

__attribute__((noinline)) long caller(long x) {
    long r = compute(x, 1);
    sink = r;
    return r + 1;
}

__attribute__((noinline, optimize("no-optimize-sibling-calls"))) long rec(long n) {
    if (n == 0)
        return 0;
    long r = rec(n - 1);
    sink = r;
    return r + 1;
}

__attribute__((noinline)) long slow(long ms) {
    usleep(ms * 1000);
    return ms;
}

static void run(const char *cmd, long n) {
    if (!strcmp(cmd, "compute")) {
        for (long i = 0; i < n; i++)
            printf("compute(%ld, 7) = %ld\n", i, compute(i, 7));
    } else if (!strcmp(cmd, "caller")) {
        for (long i = 0; i < n; i++)
            printf("caller(%ld) = %ld\n", i, caller(i));
    } else if (!strcmp(cmd, "rec")) {
        printf("rec(%ld) = %ld\n", n, rec(n));
    } else if (!strcmp(cmd, "getpid")) {
        long s = 0;
        for (long i = 0; i < n; i++)
            s += getpid();
        printf("getpid x%ld sum %ld\n", n, s);
    } else if (!strcmp(cmd, "slow")) {
        printf("slow(%ld) = %ld\n", n, slow(n));
    } else {
        printf("unknown command %s\n", cmd);
    }
    printf("done %s %ld counter %ld\n", cmd, n, global_counter);
    fflush(stdout);
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc >= 2 && !strcmp(argv[1], "serve")) {
        char line[128], cmd[64];
        long n;
        printf("ready %d\n", getpid());
        while (fgets(line, sizeof line, stdin)) {
            if (sscanf(line, "%63s %ld", cmd, &n) != 2)
                break;
            run(cmd, n);
        }
        printf("bye\n");
        return 0;
    }
    for (int i = 1; i + 1 < argc; i += 2)
        run(argv[i], atol(argv[i + 1]));
    return 0;
}
