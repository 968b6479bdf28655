/* A program whose main thread calls pthread_exit while two workers run on:
 * its leader is a zombie (State Z) while the process lives.
 *
 *   zombie_leader run N      main calls work() N times and prints its
 *                            count, starts 2 workers and calls
 *                            pthread_exit; each worker waits for main's
 *                            task to be a zombie, calls
 *                            work() N times and prints its count; worker
 *                            1 then calls exit(7).
 *   zombie_leader serve N    the same start, then worker 0 prints
 *                            "ready PID" once main's thread is a zombie,
 *                            and reads commands on stdin: "round" makes
 *                            both workers call work() N times each (a
 *                            barrier before and after) and prints
 *                            "round total SUM calls 2N"; "exit S" calls
 *                            exit(S).
 *
 * Every hand-off is a barrier, a read or a wait for main's task to be a
 * zombie (its State in /proc): no sleep.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

static long calls_per_thread;
static pthread_barrier_t start_round, end_round;
static volatile int command; /* 1: round, 2: exit */
static long sums[2];

__attribute__((noinline)) long work(long i) {
    __asm__ volatile("" ::: "memory");
    return i * 3 + 1;
}

static long calls(long n, long base) {
    long sum = 0;
    for (long i = 0; i < n; i++)
        sum += work(base + i);
    return sum;
}

/* Whether the main thread's task is a zombie (its State in /proc). */
static int main_is_zombie(void) {
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/self/task/%d/status", (int)getpid());
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    int z = 0;
    while (fgets(buf, sizeof buf, f))
        if (strncmp(buf, "State:", 6) == 0)
            z = strchr(buf, 'Z') != NULL;
    fclose(f);
    return z;
}

static void *run_worker(void *arg) {
    long id = (long)arg;
    while (!main_is_zombie())
        sched_yield();
    long sum = calls(calls_per_thread, id * 1000);
    pthread_barrier_wait(&start_round);
    printf("worker %ld calls %ld sum %ld\n", id, calls_per_thread, sum);
    fflush(stdout);
    pthread_barrier_wait(&end_round);
    if (id == 1)
        exit(7);
    for (;;)
        pause();
}

static void *serve_worker(void *arg) {
    long id = (long)arg;
    if (id == 0) {
        while (!main_is_zombie())
            sched_yield();
        printf("ready %d\n", (int)getpid());
        fflush(stdout);
    }
    for (;;) {
        pthread_barrier_wait(&start_round); /* worker 0 read a command */
        if (command == 2)
            return NULL;
        sums[id] = calls(calls_per_thread, id * 1000);
        pthread_barrier_wait(&end_round);
    }
}

static void *serve_reader(void *arg) {
    (void)arg;
    char line[64];
    while (fgets(line, sizeof line, stdin)) {
        if (strncmp(line, "round", 5) == 0) {
            command = 1;
            pthread_barrier_wait(&start_round);
            pthread_barrier_wait(&end_round);
            printf("round total %ld calls %ld\n", sums[0] + sums[1], 2 * calls_per_thread);
            fflush(stdout);
        } else if (strncmp(line, "exit ", 5) == 0) {
            exit(atoi(line + 5));
        }
    }
    command = 2;
    pthread_barrier_wait(&start_round);
    exit(0);
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: zombie_leader run|serve N\n");
        return 2;
    }
    calls_per_thread = atol(argv[2]);
    pthread_t t[3];
    if (strcmp(argv[1], "run") == 0) {
        printf("main calls %ld sum %ld\n", calls_per_thread, calls(calls_per_thread, 500));
        fflush(stdout);
        pthread_barrier_init(&start_round, NULL, 2);
        pthread_barrier_init(&end_round, NULL, 2);
        for (long i = 0; i < 2; i++)
            pthread_create(&t[i], NULL, run_worker, (void *)i);
    } else {
        /* The reader is the third party of each round's barriers. */
        pthread_barrier_init(&start_round, NULL, 3);
        pthread_barrier_init(&end_round, NULL, 3);
        for (long i = 0; i < 2; i++)
            pthread_create(&t[i], NULL, serve_worker, (void *)i);
        pthread_create(&t[2], NULL, serve_reader, NULL);
    }
    pthread_exit(NULL);
}
