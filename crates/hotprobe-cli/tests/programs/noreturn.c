/* A function that never returns, known only from DWARF (DW_AT_noreturn):
 * its name is in no list. Prints what it did and exits with 7 from it. */
#include <stdio.h>
#include <stdlib.h>

__attribute__((noreturn, noinline)) void finish_run(int code) {
    printf("finishing with %d\n", code);
    fflush(stdout);
    exit(code);
}

__attribute__((noinline)) int work(int i) { return i * 3 + 1; }

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 5, s = 0;
    for (int i = 0; i < n; i++) s += work(i);
    printf("sum=%d\n", s);
    finish_run(7);
}
