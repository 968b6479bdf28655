/* Loads the library argv[1] at run time (dlopen) and calls its
 * scale(n, weight) argv[2] times, n = 0, 1, ... and weight = 100 - 30 * n,
 * printing each call's arguments ("call N WEIGHT") and the sum of the
 * results. Its library is dlopen_cond_lib.c. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

typedef long (*scale_t)(int, long);

int main(int argc, char **argv) {
    if (argc < 3)
        return 2;
    int calls = atoi(argv[2]);
    void *h = dlopen(argv[1], RTLD_NOW);
    if (!h) {
        fprintf(stderr, "%s\n", dlerror());
        return 3;
    }
    scale_t scale = (scale_t)dlsym(h, "scale");
    if (!scale)
        return 4;
    long sum = 0;
    for (int n = 0; n < calls; n++) {
        long weight = 100 - 30L * n;
        printf("call %d %ld\n", n, weight);
        sum += scale(n, weight);
    }
    printf("sum %ld\n", sum);
    return 0;
}
