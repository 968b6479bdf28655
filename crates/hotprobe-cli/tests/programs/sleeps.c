/* Calls with known durations: short_call() sleeps 1 ms, long_call() 30 ms,
   10 of each, interleaved. main times each call from outside (so its time
   includes whatever a tracer adds) and prints how many calls of each it
   made and how many lasted at least 10 ms:
   "short 10 long 10 over10ms short S long L". */
#include <stdio.h>
#include <time.h>

__attribute__((noinline)) void nap(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0) {
    }
}

__attribute__((noinline)) void short_call(void) { nap(1); }
__attribute__((noinline)) void long_call(void) { nap(30); }

static long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000L + t.tv_nsec;
}

int main(void) {
    int s = 0, l = 0, s_over = 0, l_over = 0;
    for (int i = 0; i < 10; i++) {
        long t0 = now_ns();
        short_call();
        long t1 = now_ns();
        long_call();
        long t2 = now_ns();
        s++;
        l++;
        s_over += t1 - t0 >= 10000000L;
        l_over += t2 - t1 >= 10000000L;
    }
    printf("short %d long %d over10ms short %d long %d\n", s, l, s_over, l_over);
    return 0;
}
