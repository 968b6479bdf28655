/* Thousands of live threads, and more made and ended all the time, for
 * `count -p` on a server of that size (tests/many_threads.rs).
 *
 * usage: many_threads N [CHURNERS]
 * Starts N worker threads (64 KiB stacks) and CHURNERS (default 1)
 * churners, each making and joining short threads (4 at a time) until the
 * program ends; then prints "ready PID". It reads lines on stdin:
 *   go    every worker calls work() 10 times (a round), and each of the
 *         churner's threads started from then on calls it 10 times too,
 *         until the round ends: once every worker is done, no new churn
 *         thread calls it and every churn thread that did is joined. Then
 *         it prints "round: workers W calls C sum S" (W workers, C calls
 *         in all, S the sum of work()'s return values; C and S counted by
 *         each thread for itself, added once it is done).
 *   EOF   the workers and the churner end and are joined; it prints
 *         "threads N rounds R churned>0 1" and exits 0.
 * work() is called nowhere else: its calls between a "go" and its
 * "round:" line are exactly the C printed. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CALLS 10

volatile int sink;

__attribute__((noinline)) int work(int x) {
    sink += x;
    return x * 3 + 1;
}

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t to_workers = PTHREAD_COND_INITIALIZER;
static pthread_cond_t to_main = PTHREAD_COND_INITIALIZER;
/* Under `lock`. */
static long round_no; /* rounds started */
static int quit;
static int workers_left; /* workers still in this round */
static int churn_calls_on; /* new churn threads call work() */
static long *churn_gen; /* batches each churner joined */
static long calls, sum; /* of the current round */

static void add(long c, long s) {
    pthread_mutex_lock(&lock);
    calls += c;
    sum += s;
    pthread_mutex_unlock(&lock);
}

static void *worker(void *arg) {
    long seen = 0;
    int id = (int)(long)arg;
    for (;;) {
        pthread_mutex_lock(&lock);
        while (round_no == seen && !quit)
            pthread_cond_wait(&to_workers, &lock);
        if (quit) {
            pthread_mutex_unlock(&lock);
            return NULL;
        }
        seen = round_no;
        pthread_mutex_unlock(&lock);
        long s = 0;
        for (int i = 0; i < CALLS; i++)
            s += work(id + i);
        add(CALLS, s);
        pthread_mutex_lock(&lock);
        if (--workers_left == 0)
            pthread_cond_broadcast(&to_main);
        pthread_mutex_unlock(&lock);
    }
}

static void *churned(void *arg) {
    if (arg) {
        long s = 0;
        for (int i = 0; i < CALLS; i++)
            s += work(i);
        add(CALLS, s);
    }
    return NULL;
}

static long churn_count; /* under `lock` */

static void *churner(void *arg) {
    long me = (long)arg;
    for (;;) {
        pthread_mutex_lock(&lock);
        int on = churn_calls_on, stop = quit;
        pthread_mutex_unlock(&lock);
        if (stop)
            return NULL;
        pthread_t t[4];
        for (int i = 0; i < 4; i++)
            if (pthread_create(&t[i], NULL, churned, on ? (void *)1 : NULL) != 0) {
                perror("pthread_create (churn)");
                exit(3);
            }
        for (int i = 0; i < 4; i++)
            pthread_join(t[i], NULL);
        pthread_mutex_lock(&lock);
        churn_count += 4;
        churn_gen[me]++;
        pthread_cond_broadcast(&to_main);
        pthread_mutex_unlock(&lock);
    }
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 2000;
    int churners = argc > 2 ? atoi(argv[2]) : 1;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 64 * 1024);
    pthread_t *ts = calloc((size_t)n, sizeof *ts);
    for (int i = 0; i < n; i++)
        if (pthread_create(&ts[i], &attr, worker, (void *)(long)i) != 0) {
            perror("pthread_create");
            return 3;
        }
    pthread_t *ch = calloc((size_t)churners, sizeof *ch);
    churn_gen = calloc((size_t)churners, sizeof *churn_gen);
    long *gen = calloc((size_t)churners, sizeof *gen);
    for (long i = 0; i < churners; i++)
        if (pthread_create(&ch[i], &attr, churner, (void *)i) != 0) {
            perror("pthread_create (churner)");
            return 3;
        }
    printf("ready %d\n", (int)getpid());
    fflush(stdout);
    long rounds = 0;
    char line[64];
    while (fgets(line, sizeof line, stdin)) {
        if (strcmp(line, "go\n") != 0) {
            fprintf(stderr, "unknown command %s", line);
            return 4;
        }
        pthread_mutex_lock(&lock);
        calls = sum = 0;
        workers_left = n;
        churn_calls_on = 1;
        round_no++;
        pthread_cond_broadcast(&to_workers);
        while (workers_left > 0)
            pthread_cond_wait(&to_main, &lock);
        /* No churn batch started from now on calls work(); the batches
         * under way (which may have) are joined before the line: each
         * churner ends one more. */
        churn_calls_on = 0;
        memcpy(gen, churn_gen, (size_t)churners * sizeof *gen);
        for (int i = 0; i < churners; i++)
            while (churn_gen[i] == gen[i])
                pthread_cond_wait(&to_main, &lock);
        printf("round: workers %d calls %ld sum %ld\n", n, calls, sum);
        fflush(stdout);
        pthread_mutex_unlock(&lock);
        rounds++;
    }
    pthread_mutex_lock(&lock);
    quit = 1;
    pthread_cond_broadcast(&to_workers);
    pthread_mutex_unlock(&lock);
    for (int i = 0; i < n; i++)
        pthread_join(ts[i], NULL);
    for (int i = 0; i < churners; i++)
        pthread_join(ch[i], NULL);
    printf("threads %d rounds %ld churned>0 %d\n", n, rounds, churn_count > 0);
    return 0;
}
