/* reloads LIB [wait]: dlopens LIB (tests/programs/reload_lib.c), prints
 * "loaded" and waits for a line on stdin; calls f, g and
 * named("before-I", I) BEFORE times, dlcloses LIB and prints how many of
 * its mappings are left (0: unmapped); dlopens it again, calls them AFTER
 * times (named("after-I", I)) and prints so; with a second argument waits
 * for another line; prints "end" and exits with status 7. */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#ifndef BEFORE
#define BEFORE 5
#endif
#ifndef AFTER
#define AFTER 7
#endif

static void wait_line(void) {
    char c;
    do {
        if (read(0, &c, 1) <= 0)
            _exit(3);
    } while (c != '\n');
}

static int mappings(const char *path) {
    FILE *m = fopen("/proc/self/maps", "r");
    char l[4096];
    int n = 0;
    while (m && fgets(l, sizeof l, m))
        if (strstr(l, path))
            n++;
    if (m)
        fclose(m);
    return n;
}

static long calls(void *h, int n, const char *phase) {
    long (*f)(long) = (long (*)(long))dlsym(h, "f");
    long (*g)(long) = (long (*)(long))dlsym(h, "g");
    long (*named)(const char *, long) = (long (*)(const char *, long))dlsym(h, "named");
    long s = 0;
    char b[32];
    for (int i = 0; f && g && named && i < n; i++) {
        s += f(i) + g(i);
        snprintf(b, sizeof b, "%s-%d", phase, i);
        s += named(b, i);
    }
    return s;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IONBF, 0);
    void *h = dlopen(argv[1], RTLD_NOW);
    if (!h) {
        printf("dlopen: %s\n", dlerror());
        return 2;
    }
    printf("loaded\n");
    wait_line();
    long s = calls(h, BEFORE, "before");
    dlclose(h);
    printf("closed %ld mappings %d\n", s, mappings(argv[1]));
    h = dlopen(argv[1], RTLD_NOW);
    if (!h) {
        printf("dlopen again: %s\n", dlerror());
        return 2;
    }
    s += calls(h, AFTER, "after");
    printf("reloaded %ld mapped %d\n", s, mappings(argv[1]) > 0);
    if (argc > 2)
        wait_line();
    printf("end\n");
    return 7;
}
