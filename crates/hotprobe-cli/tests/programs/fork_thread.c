/* Three threads call work() while a fourth forks a child that calls
 * work() 5 times: the callers run until the fork has returned in the
 * parent, then make 20 more calls each. Prints "parent PID", "child PID
 * work 5", "child PID exit S" or "child PID signal S", and "parent PID
 * work N" with N the callers' calls together. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#define CALLERS 3

static volatile long sink;

__attribute__((noinline)) long work(long x) {
    sink += x;
    return sink * 3 + x;
}

static atomic_int started;
static atomic_int forked;
static long calls[CALLERS];
static pid_t child;
static int status;

static void *caller(void *arg) {
    long id = (long)arg, n = 0;
    work(id);
    n++;
    atomic_fetch_add(&started, 1);
    while (!atomic_load(&forked)) {
        work(id);
        n++;
    }
    for (int i = 0; i < 20; i++, n++)
        work(id);
    calls[id] = n;
    return NULL;
}

static void *forker(void *arg) {
    (void)arg;
    while (atomic_load(&started) < CALLERS)
        ;
    pid_t c = fork();
    if (c == 0) {
        long mine = 0;
        for (int i = 0; i < 5; i++, mine++)
            work(i);
        printf("child %d work %ld\n", (int)getpid(), mine);
        fflush(stdout);
        _exit(0);
    }
    atomic_store(&forked, 1);
    if (c < 0) {
        perror("fork");
        exit(1);
    }
    child = c;
    if (waitpid(c, &status, 0) != c) {
        perror("waitpid");
        exit(1);
    }
    return NULL;
}

int main(void) {
    printf("parent %d\n", (int)getpid());
    fflush(stdout);
    pthread_t th[CALLERS + 1];
    for (long i = 0; i < CALLERS; i++)
        pthread_create(&th[i], NULL, caller, (void *)i);
    pthread_create(&th[CALLERS], NULL, forker, NULL);
    for (int i = 0; i <= CALLERS; i++)
        pthread_join(th[i], NULL);
    if (WIFEXITED(status))
        printf("child %d exit %d\n", (int)child, WEXITSTATUS(status));
    else
        printf("child %d signal %d\n", (int)child, WTERMSIG(status));
    long total = 0;
    for (int i = 0; i < CALLERS; i++)
        total += calls[i];
    printf("parent %d work %ld\n", (int)getpid(), total);
    return 0;
}
