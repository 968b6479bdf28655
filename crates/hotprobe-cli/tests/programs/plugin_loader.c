/* A plugin-loading server: LOADERS threads dlopen, call and dlclose a
 * plugin (argv[1]) without end, holding the dynamic loader's lock for
 * much of the time; the main thread prints "ready PID", then for each
 * line read makes a round of 100,000 calls of `work` and prints
 * "round: calls N sum S". At the end of its input it stops the loaders
 * and prints "loads>0 1 bad 0" (every plugin call gave 42). */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define ROUND 100000

static const char *plugin;
static volatile int stop;
static long loads[8], bad;

__attribute__((noipa)) long work(long i) { return 3 * i + 1; }

static void *loader(void *arg) {
    long id = (long)arg;
    while (!stop) {
        void *h = dlopen(plugin, RTLD_NOW | RTLD_LOCAL);
        if (!h) {
            fprintf(stderr, "dlopen: %s\n", dlerror());
            exit(3);
        }
        int (*value)(void) = (int (*)(void))dlsym(h, "plugin_value");
        if (!value || value() != 42)
            __atomic_add_fetch(&bad, 1, __ATOMIC_RELAXED);
        dlclose(h);
        loads[id]++;
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 3)
        return 2;
    plugin = argv[1];
    int n = atoi(argv[2]);
    if (n < 1 || n > 8)
        return 2;
    pthread_t t[8];
    for (long i = 0; i < n; i++)
        pthread_create(&t[i], 0, loader, (void *)i);
    printf("ready %d\n", getpid());
    fflush(stdout);
    char line[64];
    while (fgets(line, sizeof line, stdin)) {
        long sum = 0;
        for (long i = 0; i < ROUND; i++)
            sum += work(i);
        printf("round: calls %d sum %ld\n", ROUND, sum);
        fflush(stdout);
    }
    stop = 1;
    long total = 0;
    for (int i = 0; i < n; i++) {
        pthread_join(t[i], 0);
        total += loads[i];
    }
    printf("loads>0 %d bad %ld\n", total > 0, bad);
    return 0;
}
