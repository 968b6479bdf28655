// A C++ exception thrown through a function whose prologue is
// `sub $8,%rsp; call thrower` (issue 23: the call is relocated as a push
// of its original return address and a jmp, so the unwinder finds
// sub_throw's frame by its own return address).
//   prologue_throw   10 calls of sub_throw, thrower throws for 3 and 7
#include <cstdio>
#include <stdexcept>

extern "C" __attribute__((noinline, used)) long thrower(long x) {
    if (x == 3 || x == 7)
        throw std::runtime_error("odd one");
    return x * 2;
}
extern "C" long sub_throw(long);
__asm__(".text\n"
        ".globl sub_throw\n.type sub_throw, @function\nsub_throw:\n.cfi_startproc\n"
        "  sub $8, %rsp\n.cfi_adjust_cfa_offset 8\n  call thrower\n"
        "  add $8, %rsp\n.cfi_adjust_cfa_offset -8\n  ret\n"
        ".cfi_endproc\n.size sub_throw, .-sub_throw\n");

int main() {
    long sum = 0;
    int caught = 0;
    for (long i = 0; i < 10; i++) {
        try {
            sum += sub_throw(i);
        } catch (const std::exception &) {
            caught++;
        }
    }
    std::printf("sum %ld caught %d\n", sum, caught);
    return 0;
}
