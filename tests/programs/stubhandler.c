/* Shared-memory handlers at patch and jump sites (no signal).
 *
 * patched: a C function with a 5-byte patchable entry (the patch
 *          mechanism); returns 3x + 1.
 * jumped:  mov eax, edi; add eax, 7; ret — 5 bytes of relocatable
 *          instructions at its entry (the jump mechanism); returns x + 7.
 *
 * argv[1] threads each call both argv[2] times and keep values in
 * callee-saved registers across the calls. Prints the sum of every result. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

__asm__(".text\n"
        ".globl jumped\n.type jumped,@function\n"
        "jumped:\n  mov %edi, %eax\n  add $7, %eax\n  ret\n"
        ".size jumped, .-jumped\n");

int jumped(int);

__attribute__((noinline, patchable_function_entry(5, 0))) int patched(int x) {
    __asm__ volatile("" ::: "memory");
    return 3 * x + 1;
}

static long iters;

static void *worker(void *arg) {
    long id = (long)arg;
    long sum = 0;
    for (long i = 0; i < iters; i++) {
        sum += patched((int)(i + id));
        sum += jumped((int)i);
    }
    return (void *)sum;
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 8;
    iters = argc > 2 ? atol(argv[2]) : 1000;
    pthread_t t[64];
    if (n > 64)
        n = 64;
    for (long i = 0; i < n; i++)
        pthread_create(&t[i], NULL, worker, (void *)i);
    long total = 0;
    for (int i = 0; i < n; i++) {
        void *r;
        pthread_join(t[i], &r);
        total += (long)r;
    }
    printf("total %ld\n", total);
    return 0;
}
