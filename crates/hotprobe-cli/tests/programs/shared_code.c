/* Two functions called in two rounds: the first round at start, the second
 * once a line arrives on stdin; "ready" is printed in between. The sum of
 * every result is the program's output. */
#include <stdio.h>

__attribute__((noinline)) long work(long x) {
    long r = 0;
    for (long i = 0; i < x; i++)
        r += i * x;
    return r;
}

__attribute__((noinline)) long work2(long x) {
    long r = 1;
    for (long i = 1; i < x; i++)
        r = (r * 31 + i) % 1000003;
    return r;
}

static long round_of_calls(long k) {
    long s = 0;
    for (long i = 0; i < 5; i++)
        s += work(k + i) + work2(k + i);
    return s;
}

int main(void) {
    long s = round_of_calls(10);
    printf("ready\n");
    fflush(stdout);
    char line[16];
    if (!fgets(line, sizeof line, stdin))
        return 2;
    s += round_of_calls(20);
    printf("%ld\n", s);
    return 0;
}
