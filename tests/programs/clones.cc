// g++ -O2 makes clones and partitions of these functions:
//   work         .cold    (the throw path; never taken here)
//   checked      .cold    (the rare error path; never taken here)
//   lookup       .part.0  (the slow body split out of an inlined test)
//   big_sum      .isra.0  (a big struct by value: only two fields passed)
//   scaled       .constprop.0 (its factor is always 3)
// Clones are functions (called, [rsp] a return address); .cold parts are
// not.
//
//   clones [N]   prints t=... and the calls made: calls work=N big_sum=N
//                scaled=2N lookup_slow=S.
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

struct Big {
    long a, b, pad[14];
};

volatile long sink;
long table[64];
static long slow_calls;

__attribute__((noinline)) static long big_sum(Big p, long k) {
    long s = 0;
    for (long i = 0; i < k; i++) s += (p.a * i) ^ (p.b + i);
    return s;
}

__attribute__((noinline)) static long scaled(long x, long factor) {
    long s = 0;
    for (long i = 0; i < x % 17; i++) s += i * factor + sink;
    return s;
}

static long checked(long x) {
    if (x > 1000000) {
        std::string m = "too big: " + std::to_string(x);
        for (int i = 0; i < 5; i++) m += std::to_string(i * x);
        sink += (long)m.size();
        std::fprintf(stderr, "%s\n", m.c_str());
        return -1;
    }
    return x * 2;
}

static long lookup(long x) {
    if (__builtin_expect(x < 1000, 1)) return x;
    slow_calls++;
    long s = 0;
    for (long i = 0; i < (x & 31); i++) {
        s += (i * x) ^ table[i & 63];
        table[(i * 7) & 63] = s;
    }
    for (long i = 0; i < (x & 15); i++) {
        s ^= s << 3;
        table[i] += s;
    }
    for (long i = 0; i < (x & 15); i++) {
        s ^= s >> 3;
        table[i + 1] += s;
    }
    return s & 0xffff;
}

__attribute__((noinline)) long work(std::vector<long> &v, long x) {
    if (x < 0) throw std::invalid_argument("negative: " + std::to_string(x));
    long r = 0;
    for (long e : v) r += e * x;
    v.push_back(r & 0xff);
    if (v.size() > 64) v.erase(v.begin());
    return r;
}

int main(int argc, char **argv) {
    long n = argc > 1 ? std::atol(argv[1]) : 200;
    std::vector<long> v{1, 2, 3};
    Big p{3, 5, {0}};
    long t = 0;
    for (long i = 0; i < n; i++) {
        Big q{i, i + 1, {0}};
        t += work(v, i) & 0xfff;
        t += big_sum(i & 1 ? p : q, i % 7) & 0xff;
        t += scaled(i, 3) + scaled(i + 1, 3);
        t += checked(i) + checked(i * 3);
        t += lookup(i * 7) + lookup(i * 11);
    }
    std::printf("t=%ld\n", t);
    std::printf("calls work=%ld big_sum=%ld scaled=%ld lookup_slow=%ld\n", n, n, 2 * n,
                slow_calls);
    return 0;
}
