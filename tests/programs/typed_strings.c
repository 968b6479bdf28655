/* Strings hotprobe copies in the target at the edges of readable memory
 * (issue 23): show() never reads its string, hotprobe does.  Each call is
 * logged as "CALL show(S, k) = k" with S written as hotprobe shows it:
 *   1 NULL;
 *   2 "abcd" whose NUL is the last byte before an unmapped page (whole);
 *   3 "uvwxyz" running into a PROT_NONE page before any NUL (cut, "...");
 *   4 a fresh anonymous page never touched (the zero page: "");
 *   5 a file mapping not touched yet ("from a file", not faulted in);
 *   6 300 bytes (cut at the 128 copied);
 *   7 argv[1] calls with a string another thread rewrites meanwhile: its
 *     first byte flips between 'A' and 'B' and its fifth between 'w' and
 *     NUL, so each call sees one of "Axyzw", "Bxyzw", "Axyz", "Bxyz"
 *     (logged as "CALL show(racy, 7) = 7").
 * Exit status 3.  stdout is line-buffered. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static volatile int shown;

/* Long enough for a patch or a jump (a trap is not what is tested). */
__attribute__((noipa)) int show(const char *s, int k) {
    (void)s;
    shown++;
    return k;
}

static char racy[16] = "Axyzw";
static atomic_int stop;
static atomic_long flips;

static void *writer(void *arg) {
    (void)arg;
    volatile char *p = racy;
    for (long i = 0; !atomic_load_explicit(&stop, memory_order_relaxed); i++) {
        p[0] = (i & 1) ? 'B' : 'A';
        p[4] = (i & 2) ? 0 : 'w';
        atomic_store_explicit(&flips, i + 1, memory_order_relaxed);
    }
    return NULL;
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 100;
    /* Whole lines, never mixed with a tracer's on a shared pipe. */
    setvbuf(stdout, NULL, _IOLBF, 0);
    long page = sysconf(_SC_PAGESIZE);
    printf("CALL show((null), 1) = %d\n", show(NULL, 1));

    char *a = mmap(NULL, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (a == MAP_FAILED || munmap(a + page, page) != 0)
        return 1;
    memcpy(a + page - 5, "abcd", 5);
    printf("CALL show(\"abcd\", 2) = %d\n", show(a + page - 5, 2));

    char *b = mmap(NULL, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (b == MAP_FAILED || mprotect(b + page, page, PROT_NONE) != 0)
        return 1;
    memcpy(b + page - 6, "uvwxyz", 6);
    printf("CALL show(\"uvwxyz\"..., 3) = %d\n", show(b + page - 6, 3));

    char *z = mmap(NULL, page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (z == MAP_FAILED)
        return 1;
    printf("CALL show(\"\", 4) = %d\n", show(z, 4));

    FILE *f = tmpfile();
    if (!f || fwrite("from a file", 1, 12, f) != 12 || fflush(f) != 0)
        return 1;
    char *m = mmap(NULL, page, PROT_READ, MAP_PRIVATE, fileno(f), 0);
    if (m == MAP_FAILED)
        return 1;
    printf("CALL show(\"from a file\", 5) = %d\n", show(m, 5));

    char big[301];
    memset(big, 'q', 300);
    big[300] = 0;
    printf("CALL show(\"%.128s\"..., 6) = %d\n", big, show(big, 6));

    pthread_t t;
    if (pthread_create(&t, NULL, writer, NULL) != 0)
        return 1;
    /* The writer is flipping before the first call. */
    while (atomic_load_explicit(&flips, memory_order_relaxed) < 1000)
        ;
    for (int i = 0; i < n; i++)
        printf("CALL show(racy, 7) = %d\n", show(racy, 7));
    atomic_store(&stop, 1);
    pthread_join(t, NULL);
    fclose(f);
    return 3;
}
