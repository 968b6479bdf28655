/* Calls with known durations: short() sleeps 1 ms, long_() 30 ms, 10 of
 * each, interleaved; main prints how many of each it made. */
#include <stdio.h>
#include <time.h>

__attribute__((noinline)) void nap(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0) {
    }
}

__attribute__((noinline)) void short_call(void) { nap(1); }
__attribute__((noinline)) void long_call(void) { nap(30); }

int main(void) {
    int s = 0, l = 0;
    for (int i = 0; i < 10; i++) {
        short_call();
        s++;
        long_call();
        l++;
    }
    printf("short %d long %d\n", s, l);
    return 0;
}
