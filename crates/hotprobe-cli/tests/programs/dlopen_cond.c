/* Loads the library argv[1] at run time (dlopen) and calls its
 * scale(n, weight) argv[2] times, n = 0, 1, ... and weight = 100 - 30 * n,
 * printing each call's arguments ("call N WEIGHT") and the sum of the
 * results. Its library is dlopen_cond_lib.c. With a third argument, it
 * then reads its stdin to the end and prints "bye". Built with -DLINKED,
 * it calls the scale it is linked with (argv[1] is not loaded). */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

typedef long (*scale_t)(int, long);
#ifdef LINKED
long scale(int n, long weight);
#endif

int main(int argc, char **argv) {
    if (argc < 3)
        return 2;
    int calls = atoi(argv[2]);
#ifdef LINKED
    scale_t f = scale;
#else
    void *h = dlopen(argv[1], RTLD_NOW);
    if (!h) {
        fprintf(stderr, "%s\n", dlerror());
        return 3;
    }
    scale_t f = (scale_t)dlsym(h, "scale");
    if (!f)
        return 4;
#endif
    long sum = 0;
    for (int n = 0; n < calls; n++) {
        long weight = 100 - 30L * n;
        printf("call %d %ld\n", n, weight);
        sum += f(n, weight);
    }
    printf("sum %ld\n", sum);
    if (argc > 3) {
        fflush(stdout);
        while (getchar() != EOF)
            ;
        printf("bye\n");
    }
    return 0;
}
