/* A global written by 4 threads, for watchpoint tests.
 *
 * `watched run`: one round. `watched serve`: prints "ready PID", then one
 * round per line read from stdin ("go"), until "quit" or end of input.
 *
 * A round: the main thread stores 0 into `counter`, then 4 writer threads
 * (created for the round) store known values: writer k (0..3) stores
 * (k+1)*1000 + i for i = 1..10*(k+1). Each writer prints its own log line
 * (its tid, how many values it wrote, the last one); the main thread
 * prints the round's total and `other`, which only it writes, once.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

volatile int counter;
volatile long other;
static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;

__attribute__((noinline)) void store(int v) { counter = v; }

static void *writer(void *arg) {
    long k = (long)arg;
    int n = 10 * (int)(k + 1), last = 0;
    for (int i = 1; i <= n; i++) {
        last = (int)(k + 1) * 1000 + i;
        store(last);
    }
    pthread_mutex_lock(&log_lock);
    printf("writer %ld tid %ld wrote %d values, last %d\n", k, (long)syscall(SYS_gettid), n,
           last);
    fflush(stdout);
    pthread_mutex_unlock(&log_lock);
    return NULL;
}

static void round_(int r) {
    pthread_t t[4];
    counter = 0;
    for (long k = 0; k < 4; k++)
        pthread_create(&t[k], NULL, writer, (void *)k);
    for (int k = 0; k < 4; k++)
        pthread_join(t[k], NULL);
    other += 1;
    printf("round %d main tid %ld other %ld\n", r, (long)syscall(SYS_gettid), other);
    fflush(stdout);
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "serve") == 0) {
        char line[64];
        printf("ready %d\n", getpid());
        fflush(stdout);
        for (int r = 1; fgets(line, sizeof line, stdin); r++) {
            if (strncmp(line, "quit", 4) == 0)
                break;
            round_(r);
        }
        return 0;
    }
    round_(1);
    return 0;
}
