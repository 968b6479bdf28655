/* A program whose probes all fit the agent's fast paths (`work`, a jump),
 * for running untraced (issue 23): 8 threads started after main waited to
 * be untraced, each checking whether a tracer is attached to it.
 *   untraced_threads MODE ITER [ARG...]
 * First waits (up to 10 s) until its TracerPid is 0 — natively it is at
 * once; a tracer that lets it run untraced has done so by then —, then
 * runs one round: 8 threads, each reading its own TracerPid at its start
 * and calling work(i + id) ITER times; joined, it prints
 *   "round traced T total S"
 * (T: threads that saw a tracer at their start, S: the sum of work's
 * results). Then, per MODE:
 *   exit CODE       exits with CODE
 *   kill            sends itself SIGKILL
 *   exec PROG ARG…  executes PROG with ARG… (its argv[0] is PROG)
 *   serve           prints "ready PID" first (no wait, no round), then
 *                   per line of stdin: "exit N" exits with N, "kill"
 *                   sends itself SIGKILL, any other runs one round;
 *                   exits 0 at EOF
 *   await_seize     (no wait, no round) waits up to 10 s for a tracer to
 *                   take it (as one takes a process whose exec it saw),
 *                   prints "seized after exec" or "not seized after
 *                   exec", exits 0 */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define THREADS 8
static long iters;
static volatile long sink;

__attribute__((noinline)) long work(long x) {
    sink += x;
    return x + 1;
}

/* The TracerPid of the calling thread (-1 if it cannot be read). */
static int tracer_of_self(void) {
    FILE *f = fopen("/proc/thread-self/status", "r");
    if (!f)
        return -1;
    char line[256];
    int pid = -1;
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, "TracerPid:", 10))
            pid = atoi(line + 10);
    fclose(f);
    return pid;
}

struct result {
    long sum;
    int traced;
};

static void *body(void *arg) {
    long id = (long)arg;
    struct result *r = malloc(sizeof *r);
    r->traced = tracer_of_self() != 0;
    r->sum = 0;
    for (long i = 0; i < iters; i++)
        r->sum += work(i + id);
    return r;
}

static void round_(void) {
    pthread_t t[THREADS];
    for (long i = 0; i < THREADS; i++)
        pthread_create(&t[i], NULL, body, (void *)i);
    long total = 0;
    int traced = 0;
    for (int i = 0; i < THREADS; i++) {
        struct result *r;
        pthread_join(t[i], (void **)&r);
        total += r->sum;
        traced += r->traced;
        free(r);
    }
    printf("round traced %d total %ld\n", traced, total);
    fflush(stdout);
}

static long now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000L + ts.tv_nsec / 1000000;
}

int main(int argc, char **argv) {
    if (argc < 3)
        return 2;
    const char *mode = argv[1];
    iters = atol(argv[2]);
    if (!strcmp(mode, "serve")) {
        char line[64];
        printf("ready %d\n", (int)getpid());
        fflush(stdout);
        while (fgets(line, sizeof line, stdin)) {
            if (!strncmp(line, "exit ", 5))
                return atoi(line + 5);
            if (!strncmp(line, "kill", 4))
                raise(SIGKILL);
            round_();
        }
        return 0;
    }
    long until = now_ms() + 10000;
    if (!strcmp(mode, "await_seize")) {
        while (tracer_of_self() == 0 && now_ms() < until)
            sched_yield();
        printf("%s after exec\n", tracer_of_self() != 0 ? "seized" : "not seized");
        return 0;
    }
    while (tracer_of_self() != 0 && now_ms() < until)
        sched_yield();
    round_();
    if (!strcmp(mode, "exit") && argc > 3)
        return atoi(argv[3]);
    if (!strcmp(mode, "kill"))
        raise(SIGKILL);
    if (!strcmp(mode, "exec") && argc > 3) {
        execv(argv[3], &argv[3]);
        perror("execv");
        return 127;
    }
    return 2;
}
