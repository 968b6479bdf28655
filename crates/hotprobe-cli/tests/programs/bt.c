// Prints the function names of its own backtrace() from a leaf reached
// through c1 -> c2 -> c3 -> leaf (none a tail call), three times. Built
// with -rdynamic: backtrace_symbols() names the program's functions.
#include <execinfo.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

__attribute__((noinline)) void leaf(int round) {
    void *b[64];
    int n = backtrace(b, 64);
    char **s = backtrace_symbols(b, n);
    printf("round %d frames=%d:", round, n);
    for (int i = 0; i < n; i++) {
        // "path(name+0xoff) [addr]": the name, or "?" without one.
        char *open = strchr(s[i], '('), *plus = open ? strpbrk(open, "+)") : NULL;
        if (open && plus && plus > open + 1) printf(" %.*s", (int)(plus - open - 1), open + 1);
        else printf(" ?");
    }
    printf("\n");
    free(s);
}

__attribute__((noinline)) int c3(int r) { leaf(r); __asm__ volatile("" ::: "memory"); return r + 3; }
__attribute__((noinline)) int c2(int r) { int v = c3(r); __asm__ volatile("" ::: "memory"); return v + 2; }
__attribute__((noinline)) int c1(int r) { int v = c2(r); __asm__ volatile("" ::: "memory"); return v + 1; }

int main(void) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    int s = 0;
    for (int r = 0; r < 3; r++) s += c1(r);
    printf("sum=%d\n", s);
    return 0;
}
