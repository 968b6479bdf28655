/* A program that drops its own text pages with MADV_DONTNEED halfway:
 * the file's code comes back over whatever a tracer wrote there. It calls
 * work() N times, drops the page holding it, then keeps calling it for
 * 2.5 s (the workload a tracer's periodic check must see), and prints its
 * counts (the exact number of calls after the drop on stderr: it varies
 * with the machine). */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

__attribute__((noinline)) long work(long i) { return i * 3 + 1; }

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 1000, s = 0, after = 0;
    for (long i = 0; i < n; i++) s += work(i);
    printf("before %ld\n", n);
    fflush(stdout);
    long page = sysconf(_SC_PAGESIZE);
    void *p = (void *)((unsigned long)work & ~(unsigned long)(page - 1));
    if (madvise(p, page, MADV_DONTNEED) != 0) {
        perror("madvise");
        return 1;
    }
    double end = now() + 2.5;
    while (now() < end) {
        s += work(after++);
        usleep(1000);
    }
    printf("after %ld sum=%ld\n", after > 0 ? 1L : 0L, s > 0 ? 1L : 0L);
    fprintf(stderr, "dropped_text: calls after the drop %ld\n", after);
    return 0;
}
