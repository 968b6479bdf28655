/* Functions shorter than a jump (issue 23): inc and twice are 4 bytes
 * (`lea`, `ret`), nothing is a 1-byte `ret`. Built with gcc's usual -O2
 * function alignment, padding follows each: a jump takes them. Built with
 * -falign-functions=1, the next function follows at once: only a trap.
 * `short_fns N` makes N rounds and prints its sum; `short_fns serve` makes
 * a round every millisecond until stdin closes (for -p), after printing
 * "ready". */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>

__attribute__((noinline)) int inc(int x) { return x + 1; }
__attribute__((noinline)) void nothing(void) { __asm__ volatile(""); }
__attribute__((noinline)) int twice(int x) { return x + x; }
/* Not probed: a function after twice in .text (the last function of a
 * section has no padding after it, only the next section). */
__attribute__((noinline)) int after(int x) { return x * 3 + 7; }

int main(int argc, char **argv) {
    long s = 0;
    if (argc > 1 && strcmp(argv[1], "serve") == 0) {
        printf("ready\n");
        fflush(stdout);
        struct pollfd p = {.fd = 0, .events = POLLIN};
        for (int i = 0; poll(&p, 1, 1) == 0; i++) {
            s += inc(i);
            nothing();
            s += twice(i);
        }
        return after((int)s) == 42;
    }
    long n = argc > 1 ? atol(argv[1]) : 1000;
    for (long i = 0; i < n; i++) {
        s += inc((int)i);
        nothing();
        s += twice((int)i);
    }
    printf("n=%ld s=%ld %d\n", n, s, after(1));
    return 0;
}
