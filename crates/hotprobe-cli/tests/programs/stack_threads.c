/* Issue 24 (--stacks): four threads started after the probes are placed,
 * each reaching malloc 5 times through thread_path and alloc_leaf: their
 * stacks are not among the published regions at first. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

static void *keep[4][8];

__attribute__((noinline)) void *alloc_leaf(size_t n) {
    void *p = malloc(n);
    asm volatile("");
    return p;
}
__attribute__((noinline)) void thread_path(long t) {
    for (int i = 0; i < 5; i++)
        keep[t][i] = alloc_leaf(64 + i);
    asm volatile("");
}
static void *thread_main(void *arg) {
    thread_path((long)arg);
    return NULL;
}

int main(void) {
    pthread_t th[4];
    for (long t = 0; t < 4; t++)
        pthread_create(&th[t], NULL, thread_main, (void *)t);
    for (int t = 0; t < 4; t++)
        pthread_join(th[t], NULL);
    int n = 0;
    for (int t = 0; t < 4; t++)
        for (int i = 0; i < 5; i++, n++)
            free(keep[t][i]);
    printf("freed %d\n", n);
    return 0;
}
