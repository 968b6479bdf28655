// Typed values copied in the target from C++ (issue 23): a member
// function taking a string and a struct by reference (a pointer), each
// call logged as "CALL say(args) = ret". argv[1]: calls.
#include <cstdio>
#include <cstdlib>
#include <cstring>

struct Point {
    long pad;
    int x;
};

struct Greeter {
    int base;
    __attribute__((noipa)) int say(const char *who, const Point &p) const {
        return base + (int)std::strlen(who) + p.x;
    }
};

int main(int argc, char **argv) {
    int n = argc > 1 ? std::atoi(argv[1]) : 4;
    static const char *names[] = {"ada", "grace", "barbara"};
    Greeter g{100};
    long total = 0;
    for (int i = 0; i < n; i++) {
        Point p{0, i};
        int r = g.say(names[i % 3], p);
        std::printf("CALL say(who=\"%s\", p->x=%d) = %d\n", names[i % 3], p.x, r);
        total += r;
    }
    std::printf("total %ld\n", total);
    return 0;
}
