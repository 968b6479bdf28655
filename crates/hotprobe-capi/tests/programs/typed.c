/* The program the typed capture tests (C API, Python) probe: work() takes
 * an int, a double and a string; each call logs its arguments and result
 * ("work I D S = R", the double with %g) on standard output. */
#include <stdio.h>
#include <string.h>

volatile long acc;

__attribute__((noinline, noipa)) int work(int i, double d, const char *s) {
    int r = i * 2 + (int)d + (int)strlen(s);
    acc += r;
    printf("work %d %g %s = %d\n", i, d, s, r);
    return r;
}

int main(void) {
    static const int is[4] = {1, 42, -7, 1000};
    static const double ds[4] = {0.5, 2.25, -3.5, 1e3};
    static const char *ss[4] = {"one", "hello", "x y", ""};
    for (int k = 0; k < 4; k++)
        work(is[k], ds[k], ss[k]);
    fflush(stdout);
    return 0;
}
