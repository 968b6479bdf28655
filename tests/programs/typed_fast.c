/* Typed values copied in the target (issue 23): strings, a field through
 * a pointer and stack-passed arguments, each call logged by the program
 * as "CALL name(args) = ret" so that a test compares what hotprobe shows
 * with what the program saw.  argv[1]: calls per function.  The last call
 * of tag() passes a pointer into unmapped memory (never dereferenced);
 * then a string longer than the 128 bytes copied, one of exactly 128 bytes
 * (whole), and one whose bytes run
 * into an unmapped page before any NUL (shown cut, "..."). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

struct point { long pad; int x; int y; };

static const char *words[] = {"alpha", "be\"ta", "", "a much longer string with spaces"};

__attribute__((noinline)) int slen(const char *s) { return (int)strlen(s); }

/* A returned string. */
__attribute__((noinline)) const char *word(int i) { return words[i % 4]; }

/* Never reads `s`: hotprobe does. */
__attribute__((noinline)) int tag(const char *s, int k) { return s ? k + 1 : k; }

__attribute__((noinline)) int getx(const struct point *p) { return p->x; }

__attribute__((noinline)) long eight(int a, int b, int c, int d, int e, int f, int g, int h) {
    return (long)a + b + c + d + e + f + g * 10L + h * 100L;
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 4;
    long total = 0;
    for (int i = 0; i < n; i++) {
        const char *w = word(i);
        printf("CALL word(%d) = \"%s\"\n", i, w);
        int r = slen(w);
        printf("CALL slen(\"%s\") = %d\n", w, r);
        total += r;
        struct point p = {0, i * 3, -i};
        r = getx(&p);
        printf("CALL getx(p->x=%d) = %d\n", p.x, r);
        total += r;
        long e = eight(1, 2, 3, 4, 5, 6, i + 7, -i);
        printf("CALL eight(1, 2, 3, 4, 5, 6, %d, %d) = %ld\n", i + 7, -i, e);
        total += e;
    }
    int t = tag((const char *)1, 41);
    printf("CALL tag(1, 41) = %d\n", t);
    char big[201];
    memset(big, 'y', 200);
    big[200] = 0;
    int r = slen(big);
    printf("CALL slen(\"%.128s\"...) = %d\n", big, r);
    /* Exactly the 128 bytes copied, its NUL right after: whole, not cut. */
    char exact[129];
    memset(exact, 'x', 128);
    exact[128] = 0;
    r += slen(exact);
    printf("CALL slen(\"%s\") = %d\n", exact, 128);
    char *pg = mmap(NULL, 8192, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (pg == MAP_FAILED || munmap(pg + 4096, 4096) != 0)
        return 1;
    memcpy(pg + 4093, "xyz", 3);
    int u = tag(pg + 4093, 1);
    printf("CALL tag(\"xyz\"..., 1) = %d\n", u);
    printf("total %ld\n", total + t + r + u);
    return 7;
}
