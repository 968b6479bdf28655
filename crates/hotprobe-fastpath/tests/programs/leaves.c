/* Frameless -O2 leaf functions whose callers keep live values in
   call-clobbered registers across the calls: gcc's -fipa-ra knows which
   registers each leaf touches and lets main keep its loop state (index,
   sums, array pointers) in the others (rsi, rdi, rcx, r8-r11). A probe that
   disturbs any register the leaf leaves alone changes what main computes.
   Prints every returned value, then the sums. */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define N 300

static unsigned long long state = 88172645463325252ull;

/* sub edi, 0x30; xor eax, eax; cmp dil, 9; setbe al; ret */
__attribute__((noinline)) int is_digit(char c) { return c >= '0' && c <= '9'; }

/* Starts with a rip-relative load (relocated by the jump mechanism). */
__attribute__((noinline)) unsigned long long next_rand(void) {
    unsigned long long x = state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    state = x;
    return x;
}

__attribute__((noinline)) long scale(long v, long k) { return v * k + 3; }

static long digits[N];
static unsigned long long rands[N];
static long scaled[N];

int main(int argc, char **argv) {
    alarm(60); /* a clobbered loop counter must fail the test, not hang it */
    long k = argc > 1 ? atol(argv[1]) : 7;
    long n = 0, acc = k;
    unsigned long long sum = 0, x1 = 1, x2 = 2, x3 = 3, x4 = 4, x5 = 5;
    for (int i = 0; i < N; i++) {
        long d = is_digit((char)(i & 127));
        digits[i] = d;
        n += d;
        unsigned long long r = next_rand();
        rands[i] = r;
        sum ^= r + (unsigned long long)i;
        long s = scale(i + n, acc & 31);
        scaled[i] = s;
        acc += s & 15;
        x1 = x1 * 3 + d;
        x2 = x2 * 5 + (r >> 60);
        x3 = x3 * 7 + (s & 7);
        x4 = x4 * 11 + (x1 ^ x3);
        x5 = x5 * 13 + (x2 ^ x4);
    }
    for (int i = 0; i < N; i++)
        printf("%d %ld %llu %ld\n", i, digits[i], rands[i], scaled[i]);
    printf("n=%ld sum=%llu acc=%ld\n", n, sum, acc);
    printf("x=%llu %llu %llu %llu %llu\n", x1, x2, x3, x4, x5);
    return 0;
}
