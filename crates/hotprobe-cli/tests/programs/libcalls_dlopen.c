/* zlib loaded at run time (dlopen), its compress2 called through a pointer
 * from caller(), N times (argv[1]); prints how many calls succeeded. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

typedef int (*compress2_t)(unsigned char *, unsigned long *, const unsigned char *, unsigned long,
                           int);

__attribute__((noinline)) int caller(compress2_t f) {
    static unsigned char src[4096], dst[8192];
    unsigned long len = sizeof dst;
    return f(dst, &len, src, sizeof src, 6) == 0;
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 3;
    void *h = dlopen("libz.so.1", RTLD_NOW);
    if (!h)
        return 2;
    compress2_t f = (compress2_t)dlsym(h, "compress2");
    int ok = 0;
    for (int i = 0; i < n; i++)
        ok += caller(f);
    printf("compress2 %d ok %d\n", n, ok);
    return 0;
}
