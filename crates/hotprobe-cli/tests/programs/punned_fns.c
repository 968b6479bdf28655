/* Functions shorter than a jump with no padding after them (issue 23,
 * punned jumps). Written in assembly so that the layout is exact: each
 * short function is followed at once by the next function.
 *   pun4   4 bytes (lea 1(%rdi),%eax; ret), then after4 (7 bytes)
 *   pun3p  3 bytes (mov %edi,%eax; ret) and 1 byte of int3 padding, then after3
 *   pun2   2 bytes (repz ret), then after2
 *   pun1   1 byte  (ret), then after1
 *   b4     4 bytes (mov %edi,%eax; repz ret), then bjump, which jumps to
 *          b4+2 for a negative argument (a branch into the bytes a punned
 *          jump would overwrite)
 * `punned_fns N` runs THREADS threads of N rounds each, prints the sum and
 * exits with status 3; `punned_fns serve` runs the threads until stdin
 * closes (for -p), after printing "ready". */
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define THREADS 4

__asm__(".text\n"
        ".p2align 4\n"
        ".globl pun4\n.type pun4,@function\npun4:\n"
        "  lea 1(%rdi),%eax\n  ret\n.size pun4,.-pun4\n"
        ".globl after4\n.type after4,@function\nafter4:\n"
        "  lea 0x12345(%rdi),%eax\n  ret\n.size after4,.-after4\n"
        ".globl pun3p\n.type pun3p,@function\npun3p:\n"
        "  mov %edi,%eax\n  ret\n.size pun3p,.-pun3p\n  int3\n"
        ".globl after3\n.type after3,@function\nafter3:\n"
        "  lea 0x333(%rdi),%eax\n  ret\n.size after3,.-after3\n"
        ".globl pun2\n.type pun2,@function\npun2:\n"
        "  repz ret\n.size pun2,.-pun2\n"
        ".globl after2\n.type after2,@function\nafter2:\n"
        "  lea 0x222(%rdi),%eax\n  ret\n.size after2,.-after2\n"
        ".globl pun1\n.type pun1,@function\npun1:\n"
        "  ret\n.size pun1,.-pun1\n"
        ".globl after1\n.type after1,@function\nafter1:\n"
        "  lea 0x111(%rdi),%eax\n  ret\n.size after1,.-after1\n"
        ".globl b4\n.type b4,@function\nb4:\n"
        "  mov %edi,%eax\n.Lb4_ret:\n  repz ret\n.size b4,.-b4\n"
        ".globl bjump\n.type bjump,@function\nbjump:\n"
        "  mov %edi,%eax\n  test %edi,%edi\n  js .Lb4_ret\n"
        "  add $5,%eax\n  ret\n.size bjump,.-bjump\n");

int pun4(int), after4(int), pun3p(int), after3(int), after2(int), after1(int);
int b4(int), bjump(int);
void pun2(void), pun1(void);

static atomic_int stop;
static long rounds;

static void *worker(void *arg) {
    long s = (long)arg;
    for (long i = 0; rounds ? i < rounds : !atomic_load(&stop); i++) {
        int x = (int)i;
        s += pun4(x) + after4(x) + pun3p(x) + after3(x);
        pun2();
        s += after2(x);
        pun1();
        s += after1(x) + b4(x) + bjump(x) + bjump(-x - 1);
    }
    return (void *)s;
}

int main(int argc, char **argv) {
    pthread_t t[THREADS];
    int serve = argc > 1 && strcmp(argv[1], "serve") == 0;
    rounds = serve ? 0 : (argc > 1 ? atol(argv[1]) : 1000);
    for (long i = 0; i < THREADS; i++)
        pthread_create(&t[i], NULL, worker, (void *)i);
    if (serve) {
        printf("ready\n");
        fflush(stdout);
        struct pollfd p = {.fd = 0, .events = POLLIN};
        /* Until stdin closes (an attach's EINTR is no end). */
        while (poll(&p, 1, -1) <= 0)
            ;
        atomic_store(&stop, 1);
    }
    long sum = 0;
    for (int i = 0; i < THREADS; i++) {
        void *r;
        pthread_join(t[i], &r);
        sum += (long)r;
    }
    if (!serve)
        printf("threads=%d rounds=%ld sum=%ld\n", THREADS, rounds, sum);
    return serve ? 0 : 3;
}
