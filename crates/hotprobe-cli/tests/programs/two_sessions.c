/* Two hotprobe sessions on one process (issue 22): `tiny` is 3 bytes
 * (`mov`, `ret`; built with -falign-functions=1 nothing pads it, so only
 * a trap fits: the in-process one where the agent is preloaded, the
 * ptrace one where it is injected; a 4-byte one would take a punned jump), `work` is long enough for a jump.
 * Prints "ready PID", then for each stdin line "round N" calls both N
 * times and prints their sums; "exit K" exits with status K. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

__attribute__((noinline)) int tiny(int x) { return x; }
__attribute__((noinline)) long work(long x) {
    long s = 0;
    for (long i = 0; i < (x & 7) + 1; i++) {
        s += i * x;
        __asm__ volatile("" ::: "memory");
    }
    return s;
}

int main(void) {
    char line[64];
    setvbuf(stdout, NULL, _IOLBF, 0);
    printf("ready %d\n", (int)getpid());
    while (fgets(line, sizeof line, stdin)) {
        long n;
        int k;
        if (sscanf(line, "round %ld", &n) == 1) {
            long a = 0, b = 0;
            for (long i = 0; i < n; i++) {
                a += tiny((int)i);
                b += work(i);
            }
            printf("round %ld tiny %ld work %ld\n", n, a, b);
        } else if (sscanf(line, "exit %d", &k) == 1) {
            return k;
        }
    }
    return 0;
}
