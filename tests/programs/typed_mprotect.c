/* A program that makes a page of its own image unreadable
 * (tests/typed_fast_cli.rs): `show(lit)` with a string literal in a
 * page-aligned .rodata array, then mprotect(PROT_NONE) on that page, then
 * `show(lit)` again. Prints "CALL show(\"...\")" for the first call, the
 * second's pointer as "CALL2 0x...", and "r=2". */
#include <stdint.h>
#include <stdio.h>
#include <sys/mman.h>

__attribute__((aligned(4096))) const char lit[8192] = "a literal in rodata";

__attribute__((noinline)) int show(const char *s) {
    return s != 0;
}

int main(void) {
    printf("CALL show(\"%s\")\n", lit);
    fflush(stdout);
    int r = show(lit);
    uintptr_t page = (uintptr_t)lit & ~(uintptr_t)4095;
    if (mprotect((void *)page, 4096, PROT_NONE) != 0) {
        perror("mprotect");
        return 1;
    }
    printf("CALL2 %p\n", (void *)lit);
    fflush(stdout);
    r += show(lit);
    printf("r=%d\n", r);
    return 0;
}
