/* Issue 24 (--stacks): malloc reached from three known call paths, 3, 5
 * and 7 times (noinline functions, no tail calls: an empty asm after each
 * call), then once more from printf. */
#include <stdio.h>
#include <stdlib.h>

static void *keep[64];
static int nkeep;

__attribute__((noinline)) void alloc_leaf(size_t n) {
    keep[nkeep++] = malloc(n);
    asm volatile("");
}
__attribute__((noinline)) void path_a(void) { alloc_leaf(16); asm volatile(""); }
__attribute__((noinline)) void path_b(void) { alloc_leaf(32); asm volatile(""); }
__attribute__((noinline)) void path_c_inner(void) { alloc_leaf(48); asm volatile(""); }
__attribute__((noinline)) void path_c(void) { path_c_inner(); asm volatile(""); }

int main(void) {
    for (int i = 0; i < 3; i++) path_a();
    for (int i = 0; i < 5; i++) path_b();
    for (int i = 0; i < 7; i++) path_c();
    for (int i = 0; i < nkeep; i++) free(keep[i]);
    printf("allocated %d\n", nkeep);
    return 0;
}
