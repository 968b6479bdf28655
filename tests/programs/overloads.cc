// Three C++ overloads of ns::f called 3, 5 and 7 times (issue 24: a name
// without its parameter list stands for every overload, as gdb's
// `break ns::f`). Prints its own total, which probes must not change.
#include <cstdio>
namespace ns {
__attribute__((noinline)) int f(int a) { asm volatile(""); return a + 1; }
__attribute__((noinline)) int f(double a) { asm volatile(""); return (int)a + 2; }
__attribute__((noinline)) int f(const char *s) { asm volatile(""); return s[0]; }
}
int main() {
    int t = 0;
    for (int i = 0; i < 3; i++) t += ns::f(i);
    for (int i = 0; i < 5; i++) t += ns::f(i * 1.5);
    for (int i = 0; i < 7; i++) t += ns::f("x");
    printf("t=%d\n", t);
    return 0;
}
