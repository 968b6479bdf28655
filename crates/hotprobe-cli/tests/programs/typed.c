/* Typed arguments: functions taking int, unsigned long, double, float,
 * const char *, a struct pointer, an enum, bool and char log their own
 * calls on stderr ("CALL name(args) = ret") in the form hotprobe prints
 * them, so that a test compares the two. With -O2, quiet() and mul() become
 * gcc clones (quiet.constprop.0 or .isra.0 without `unused`, which its
 * caller logs; mul.constprop.0 with k == 3). */
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

struct buf {
    const char *name;
    unsigned long len;
    int id;
};
enum color { RED, GREEN = 5, BLUE };
static const char *color_name(enum color c) {
    return c == RED ? "RED" : c == GREEN ? "GREEN" : "BLUE";
}

__attribute__((noinline)) int greet(const char *who, int n) {
    int r = (int)strlen(who) + n;
    fprintf(stderr, "CALL greet(\"%s\", %d) = %d\n", who, n, r);
    return r;
}

__attribute__((noinline)) double scale(double x, int k, float f) {
    double r = x * k + f;
    fprintf(stderr, "CALL scale(%g, %d, %g) = %g\n", x, k, (double)f, r);
    return r;
}

__attribute__((noinline)) unsigned long total(struct buf *b, unsigned long extra) {
    unsigned long r = b->len + extra;
    fprintf(stderr, "CALL total(%p, %lu) = %lu\n", (void *)b, extra, r);
    return r;
}

__attribute__((noinline)) const char *pick(enum color c, long v, bool loud, char tag) {
    const char *r = c == GREEN ? "green" : "other";
    fprintf(stderr, "CALL pick(%s, %ld, %s, '%c') = \"%s\"\n", color_name(c), v,
            loud ? "true" : "false", tag, r);
    return r;
}

__attribute__((noinline)) float mix(int a, double x, unsigned long big, float y, double z) {
    float r = (float)(a * x + y - z);
    fprintf(stderr, "CALL mix(%d, %g, %lu, %g, %g) = %g\n", a, x, big, (double)y, z, (double)r);
    return r;
}

static __attribute__((noinline)) int half(int used, const char *ignored) {
    fprintf(stderr, "CALL half(%d, \"%s\") = %d\n", used, ignored, used / 2);
    return used / 2;
}

static __attribute__((noinline)) int quiet(int used, const char *unused) {
    (void)unused;
    return used / 2;
}

static __attribute__((noinline)) int mul(int a, int k) {
    fprintf(stderr, "CALL mul(%d, %d) = %d\n", a, k, a * k);
    return a * k;
}

int main(int argc, char **argv) {
    struct buf b = {"bee", 40 + (unsigned long)argc, 7};
    int s = greet("world", argc - 1);
    s += greet("hotprobe", -3);
    scale(1.5, 3, 0.25f);
    scale(-2.5, argc, 1.0f);
    total(&b, 2);
    total(&b, 18446744073709551615UL - 41 - (unsigned long)argc);
    pick(GREEN, -9, true, 'x');
    pick(BLUE, 1L << 40, false, 'Q');
    mix(argc, 0.5, 18446744073709551615UL, 2.25f, 0.125);
    s += half(argc * 10, argv[0] + strlen(argv[0]));
    s += half(argc * 30, "");
    s += mul(argc + 4, 3) + mul(argc, 3);
    int q = quiet(argc * 10, argv[0]);
    fprintf(stderr, "CALL quiet(%d, \"%s\") = %d\n", argc * 10, argv[0], q);
    s += q;
    printf("done %d\n", s);
    return 0;
}
