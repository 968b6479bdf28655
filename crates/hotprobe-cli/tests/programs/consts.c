/* Functions called with constant arguments, built by
 * tests/const_values.rs with gcc -O1/-O2 -g: at -O2 gcc makes clones
 * (add.constprop.0, scale.constprop.0) whose DWARF gives the constants as
 * DW_AT_const_value (data forms for add's int and _Bool, a block for
 * scale's double), listed in another order than the parameters. Each call
 * logs its arguments and result on stderr as `CALL name(args) = r`. */
#include <stdbool.h>
#include <stdio.h>

static int __attribute__((noinline)) add(int a, bool b) {
    int r = b ? a + 1 : a - 1;
    fprintf(stderr, "CALL add(%d, %s) = %d\n", a, b ? "true" : "false", r);
    return r;
}

static double __attribute__((noinline)) scale(double f, long k) {
    double r = f * k;
    fprintf(stderr, "CALL scale(%g, %ld) = %g\n", f, k, r);
    return r;
}

static long __attribute__((noinline)) off(long a, long b) {
    long r = a - b;
    fprintf(stderr, "CALL off(%ld, %ld) = %ld\n", a, b, r);
    return r;
}

int main(int argc, char **argv) {
    (void)argv;
    double s = 0;
    s += add(21, true);
    s += add(21, true);
    s += scale(2.5, argc + 3);
    s += scale(2.5, argc + 5);
    s += off(argc + 10, argc + 11);
    printf("sum %g\n", s);
    return 0;
}
