/* Threads calling a small function; recursion; a tiny function; a function
   with a jump into its first 5 bytes. Usage: loop N THREADS */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

volatile long last_a;
__attribute__((noinline)) long work(long a, long b) {
    last_a = a;
    return a * 2 + b;
}
__attribute__((noinline)) long fact(long n) {
    if (n <= 1) return 1;
    long r = fact(n - 1);
    __asm__ volatile("" : "+r"(r)); /* keeps the recursion a real call */
    return n * r;
}
__attribute__((noinline)) int tiny(void) { return 0; }
int backjump(int);
__asm__(".text\n.globl backjump\n.type backjump,@function\nbackjump:\n"
        " mov %edi, %eax\n1:\n add $1, %eax\n cmp $100, %eax\n jl 1b\n ret\n"
        ".size backjump, .-backjump\n");

static long n_calls;
static void *worker(void *arg) {
    long id = (long)arg, s = 0;
    for (long i = 0; i < n_calls; i++) s += work(id, i & 7);
    return (void *)s;
}
int main(int argc, char **argv) {
    n_calls = argc > 1 ? atol(argv[1]) : 10;
    int nt = argc > 2 ? atoi(argv[2]) : 1;
    pthread_t th[64];
    long total = 0;
    for (long i = 0; i < nt; i++) pthread_create(&th[i], 0, worker, (void *)i);
    for (int i = 0; i < nt; i++) { void *r; pthread_join(th[i], &r); total += (long)r; }
    printf("total %ld fact %ld tiny %d backjump %d\n", total, fact(5), tiny(), backjump(0));
    return 0;
}
