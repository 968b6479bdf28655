/* T threads; thread i (from 0) calls malloc 3 * (i + 1) times, main
 * 2 times before it starts them. Each logs "TID tid calls" (write(2)) once
 * it is done: the aggregation tests compare `--by tid` with it. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static void say(long tid, int calls) {
    char line[64];
    int n = snprintf(line, sizeof line, "TID %ld %d\n", tid, calls);
    if (write(1, line, (size_t)n) != n)
        _exit(3);
}

static void *work(void *arg) {
    int calls = 3 * ((int)(long)arg + 1);
    for (int i = 0; i < calls; i++)
        free(malloc(16 + (size_t)i));
    say(gettid(), calls);
    return NULL;
}

int main(int argc, char **argv) {
    int t = argc > 1 ? atoi(argv[1]) : 4;
    pthread_t th[64];
    if (t > 64)
        t = 64;
    free(malloc(100));
    free(malloc(200));
    say(gettid(), 2);
    /* One thread at a time: each row's count is the thread's alone. */
    for (int i = 0; i < t; i++) {
        if (pthread_create(&th[i], NULL, work, (void *)(long)i) != 0)
            return 1;
        pthread_join(th[i], NULL);
    }
    return 0;
}
