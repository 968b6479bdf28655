/* Calls work() in a loop, about 100 us apart, printing "calls K" (and
 * flushing) every 50 calls, until SIGINT: by default that kills it; with
 * argument "handle" its handler stops the loop, and it prints "final K"
 * (every call it made) and exits 3. Prints "pid PID" first. */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static volatile long sink;
static volatile sig_atomic_t stop;

__attribute__((noinline)) long work(long x) {
    sink += x;
    return sink * 3 + x;
}

static void on_sigint(int sig) {
    (void)sig;
    stop = 1;
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "handle") == 0) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_sigint;
        sigemptyset(&sa.sa_mask);
        sigaction(SIGINT, &sa, NULL);
    }
    printf("pid %d\n", (int)getpid());
    fflush(stdout);
    long n = 0;
    while (!stop) {
        work(n);
        n++;
        if (n % 50 == 0) {
            printf("calls %ld\n", n);
            fflush(stdout);
        }
        struct timespec ts = {0, 100000L};
        nanosleep(&ts, NULL);
    }
    printf("final %ld\n", n);
    return 3;
}
