// leaf throws through mid (a destructor to run: a cleanup, then
// _Unwind_Resume) to top, which catches; mid also catches some, counts
// and rethrows. Prints its own counts.
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
static volatile int sink;
static int leaf_calls, leaf_returns, mid_returns, top_returns, caught, rethrown, guards;
struct Guard { ~Guard() { guards++; } };
extern "C" __attribute__((noinline)) int leaf(int i) {
    leaf_calls++;
    if (i % 3 == 0) throw std::runtime_error("three");
    if (i % 5 == 0) throw std::logic_error("five");
    sink = i;
    leaf_returns++;
    return i * 2;
}
extern "C" __attribute__((noinline)) int mid(int i) {
    Guard g;
    int r;
    try {
        r = leaf(i);
    } catch (const std::logic_error &) {
        rethrown++;
        throw;
    }
    sink = r;
    mid_returns++;
    return r + 1;
}
extern "C" __attribute__((noinline)) int top(int i) {
    int r;
    try { r = mid(i); } catch (const std::exception &) { caught++; r = -1; }
    top_returns++;
    return r;
}
int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 30;
    long sum = 0;
    for (int i = 0; i < n; i++) sum += top(i);
    printf("leaf_calls=%d leaf_returns=%d mid_returns=%d top_returns=%d caught=%d rethrown=%d guards=%d sum=%ld\n",
           leaf_calls, leaf_returns, mid_returns, top_returns, caught, rethrown, guards, sum);
    return 0;
}
