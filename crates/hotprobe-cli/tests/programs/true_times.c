/* True timings (issue 23): busy_a and busy_b spin for durations they
 * measure themselves (only the spinning, never the calls between), and
 * call functions that only a trap takes (s1, 3 bytes, and s2, 1 byte, with
 * no padding after them: the in-process trap; a 4-byte one would take a
 * punned jump) ten times between spins. A report's self times of busy_a and
 * busy_b should be what the program measured, and s1's and s2's durations
 * near native, once the probes' costs are taken out. */
#include <stdio.h>
#include <time.h>

volatile long sink;
static double spun_a, spun_b;

static inline __attribute__((always_inline)) double now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

static inline __attribute__((always_inline)) void spin(double *acc, double ns) {
    double t0 = now_ns(), t;
    do
        t = now_ns();
    while (t - t0 < ns);
    *acc += t - t0;
}

__attribute__((noinline)) int s1(int x) { return x; }
__attribute__((noinline)) void s2(void) { __asm__ volatile(""); }

__attribute__((noinline)) void busy_a(int r) {
    for (int k = 0; k < 5; k++) {
        spin(&spun_a, 40000);
        for (int j = 0; j < 10; j++)
            sink += s1(j + r);
    }
}

__attribute__((noinline)) void busy_b(int r) {
    for (int k = 0; k < 5; k++) {
        spin(&spun_b, 80000);
        for (int j = 0; j < 10; j++) {
            s2();
            sink += j + r;
        }
    }
}

int main(void) {
    for (int r = 0; r < 20; r++) {
        busy_a(r);
        busy_b(r);
    }
    printf("spun busy_a %.0f\nspun busy_b %.0f\n", spun_a, spun_b);
    return 0;
}
