// A child forked inside a probed function (its return hooked in the
// parent) throws through that function's frame.
#include <cstdio>
#include <sys/wait.h>
#include <unistd.h>
extern "C" __attribute__((noinline)) int thrower(int x) {
    if (x > 2) throw x;
    return x;
}
extern "C" __attribute__((noinline)) int forker(int x) {
    pid_t p = fork();
    if (p < 0) return -2;
    if (p == 0) return thrower(x) + 1;
    int st = -1;
    if (waitpid(p, &st, 0) != p) return -3;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}
int main() {
    int r;
    try {
        r = forker(5);
    } catch (int e) {
        std::printf("child caught %d\n", e);
        std::fflush(stdout);
        return 0;
    }
    std::printf("parent child-status %d\n", r);
    return 0;
}
