// An exception thrown across probed frames.
#include <cstdio>
extern "C" __attribute__((noinline)) int thrower(int x) {
    if (x > 2) throw x;
    return x;
}
extern "C" __attribute__((noinline)) int middle(int x) { return thrower(x) + 1; }
int main() {
    int s = 0;
    for (int i = 0; i < 5; i++) {
        try { s += middle(i); } catch (int e) { s += 100 * e; }
    }
    std::printf("%d\n", s);
    return 0;
}
