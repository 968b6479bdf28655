/* dlopen()s the library argv[1] (libtest.so), calls its libfn 3 times,
 * dlclose()s it (and checks it is unloaded), loads it again and calls
 * libfn 4 times. Prints "first libfn 3", "unloaded yes|no",
 * "second libfn 4", "total libfn 7". */
#include <dlfcn.h>
#include <stdio.h>

typedef long (*fn_t)(long);

static long calls(const char *path, int n) {
    void *h = dlopen(path, RTLD_NOW);
    if (!h) {
        printf("dlopen: %s\n", dlerror());
        return -1000;
    }
    fn_t f = (fn_t)dlsym(h, "libfn");
    long done = 0;
    for (int i = 0; f && i < n; i++, done++)
        f(i);
    dlclose(h);
    return done;
}

int main(int argc, char **argv) {
    if (argc < 2)
        return 2;
    long a = calls(argv[1], 3);
    printf("first libfn %ld\n", a);
    printf("unloaded %s\n", dlopen(argv[1], RTLD_NOW | RTLD_NOLOAD) ? "no" : "yes");
    long b = calls(argv[1], 4);
    printf("second libfn %ld\n", b);
    printf("total libfn %ld\n", a + b);
    return 0;
}
