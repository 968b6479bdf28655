/* Four functions, one per mechanism a Session picks: `patched` has a
 * placeholder (patch), `jumped` a plain entry (jump), `recorded` records
 * its arguments and return value, `forced` gets a trap return probe whose
 * handler rewrites the return value. Prints what it computed. */
#include <stdio.h>
#include <stdlib.h>

__attribute__((noinline, patchable_function_entry(5, 0))) long patched(long x) {
    return x * 3 + 1;
}

__attribute__((noinline)) long jumped(long x) {
    long s = 0;
    for (long i = 0; i < x % 7; i++)
        s += i * x;
    return s + x;
}

__attribute__((noinline)) long recorded(long a, long b) {
    long r = a * 10 + b;
    __asm__ volatile("" : "+r"(r));
    return r;
}

__attribute__((noinline)) long forced(long x) {
    long r = x + 1000;
    __asm__ volatile("" : "+r"(r));
    return r;
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 100;
    long acc = 0;
    for (int i = 0; i < n; i++) {
        acc += patched(i);
        acc += jumped(i);
    }
    printf("acc %ld\n", acc);
    for (int i = 0; i < 5; i++)
        printf("recorded %ld\n", recorded(i, i + 1));
    for (int i = 0; i < 3; i++)
        printf("forced %ld\n", forced(i));
    return 0;
}
