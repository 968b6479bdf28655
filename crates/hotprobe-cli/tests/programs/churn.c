/* Thread churn for `watch -p --duration` (tests/watch_churn.rs): prints
 * "ready PID", then until killed creates 4 short threads at a time, each
 * storing 100 values into the global `counter`, and joins them. */
#include <pthread.h>
#include <stdio.h>
#include <unistd.h>

volatile int counter;

static void *writer(void *arg) {
    long k = (long)arg;
    for (int i = 0; i < 100; i++)
        counter = (int)(k * 1000 + i);
    return NULL;
}

int main(void) {
    printf("ready %d\n", (int)getpid());
    fflush(stdout);
    for (;;) {
        pthread_t t[4];
        for (long k = 0; k < 4; k++)
            pthread_create(&t[k], NULL, writer, (void *)k);
        for (int k = 0; k < 4; k++)
            pthread_join(t[k], NULL);
    }
}
