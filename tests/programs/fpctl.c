/* Fast-path probes disabled, enabled and removed while the program runs.
 *
 * Two functions per mechanism: a 5-byte patchable entry (patch) and 5
 * bytes of relocatable instructions at the entry (jump), one of each for a
 * count probe and one for a handler probe. Each line read from stdin
 * starts a phase: argv[1] threads each call all four functions argv[2]
 * times; then "phase K total S" is printed (S: the sum of every result). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

__asm__(".text\n"
        ".globl cnt_jumped\n.type cnt_jumped,@function\n"
        "cnt_jumped:\n  mov %edi, %eax\n  add $7, %eax\n  ret\n"
        ".size cnt_jumped, .-cnt_jumped\n"
        ".globl h_jumped\n.type h_jumped,@function\n"
        "h_jumped:\n  mov %edi, %eax\n  add $9, %eax\n  ret\n"
        ".size h_jumped, .-h_jumped\n");

int cnt_jumped(int);
int h_jumped(int);

__attribute__((noinline, patchable_function_entry(5, 0))) int cnt_patched(int x) {
    __asm__ volatile("" ::: "memory");
    return 3 * x + 1;
}

__attribute__((noinline, patchable_function_entry(5, 0))) int h_patched(int x) {
    __asm__ volatile("" ::: "memory");
    return 5 * x + 2;
}

static long iters;

static void *worker(void *arg) {
    long id = (long)arg;
    long sum = 0;
    for (long i = 0; i < iters; i++) {
        int x = (int)(i + id);
        sum += cnt_patched(x);
        sum += cnt_jumped(x);
        sum += h_patched(x);
        sum += h_jumped(x);
    }
    return (void *)sum;
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 4;
    iters = argc > 2 ? atol(argv[2]) : 1000;
    pthread_t t[64];
    if (n > 64)
        n = 64;
    char line[64];
    for (int phase = 1; fgets(line, sizeof line, stdin); phase++) {
        for (long i = 0; i < n; i++)
            pthread_create(&t[i], NULL, worker, (void *)i);
        long total = 0;
        for (int i = 0; i < n; i++) {
            void *r;
            pthread_join(t[i], &r);
            total += (long)r;
        }
        printf("phase %d total %ld\n", phase, total);
        fflush(stdout);
    }
    return 0;
}
