/* Typed-argument benchmark: a loop calling one function N times, timed by
 * the program itself (tracer start-up not counted).
 *   typed N int     add(int, long): values in integer registers
 *   typed N str     slen(const char *): a string to copy at each call
 *   typed N dbl     scale(double, int): a double in xmm0 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

__attribute__((noinline)) long add(int a, long b) { return a + b; }
__attribute__((noinline)) int slen(const char *s) {
    int n = 0;
    while (s[n])
        n++;
    return n;
}
__attribute__((noinline)) double scale(double x, int k) { return x * k; }

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 1000000L;
    char mode = argc > 2 ? argv[2][0] : 'i';
    static const char *words[4] = {"alpha", "beta", "gamma", "delta"};
    volatile double sink = 0;
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (long i = 0; i < n; i++) {
        if (mode == 's')
            sink += slen(words[i & 3]);
        else if (mode == 'd')
            sink += scale((double)i, 3);
        else
            sink += add((int)i, i);
    }
    clock_gettime(CLOCK_MONOTONIC, &b);
    long ns = (b.tv_sec - a.tv_sec) * 1000000000L + (b.tv_nsec - a.tv_nsec);
    printf("calls %ld ns %ld\n", n, ns);
    return 0;
}
