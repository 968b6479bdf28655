/* report --callers -s (report_sort.rs): leaf is called by two callers
 * whose orders by calls and by time differ: slow_caller twice, each call
 * doing much work (HEAVY iterations of a loop, busy: no sleep), and
 * fast_caller twenty times, each doing little (LIGHT). By calls,
 * fast_caller's leaf calls come first; by any time, slow_caller's (the
 * work differs 100,000-fold: 2 x 20,000,000 iterations against 20 x 20). */
#include <stdio.h>

#define HEAVY 20000000UL
#define LIGHT 20UL

volatile unsigned long sink;

__attribute__((noinline)) void leaf(unsigned long work) {
    unsigned long x = work;
    for (unsigned long i = 0; i < work; i++) {
        x = x * 6364136223846793005UL + i;
        asm volatile("" : "+r"(x));
    }
    sink = x;
}
__attribute__((noinline)) void slow_caller(void) { leaf(HEAVY); asm volatile(""); }
__attribute__((noinline)) void fast_caller(void) { leaf(LIGHT); asm volatile(""); }

int main(void) {
    for (int i = 0; i < 2; i++) slow_caller();
    for (int i = 0; i < 20; i++) fast_caller();
    printf("leaf calls 22\n");
    return 0;
}
