/* A program that maps its own text again from its file halfway:
 * mmap(MAP_FIXED) of the page holding work() from /proc/self/exe puts the
 * file's code back over whatever a tracer wrote there. It calls work() N
 * times, maps that page again, then keeps calling it for 2.5 s (the
 * workload a tracer's periodic check must see), and prints its counts
 * (the exact number of calls after the mapping on stderr: it varies with
 * the machine). */
#define _GNU_SOURCE
#include <fcntl.h>
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

/* The file offset of the page at `page`, from /proc/self/maps. */
static long file_offset(unsigned long page) {
    FILE *f = fopen("/proc/self/maps", "r");
    if (!f) return -1;
    char line[512];
    long off = -1;
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi, o;
        if (sscanf(line, "%lx-%lx %*s %lx", &lo, &hi, &o) == 3 && page >= lo && page < hi) {
            off = (long)(o + (page - lo));
            break;
        }
    }
    fclose(f);
    return off;
}

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 1000, s = 0, after = 0;
    for (long i = 0; i < n; i++) s += work(i);
    printf("before %ld\n", n);
    fflush(stdout);
    long pagesize = sysconf(_SC_PAGESIZE);
    unsigned long page = (unsigned long)work & ~(unsigned long)(pagesize - 1);
    long off = file_offset(page);
    int fd = open("/proc/self/exe", O_RDONLY);
    if (off < 0 || fd < 0) {
        perror("mapped_text: the page of work");
        return 1;
    }
    void *p = mmap((void *)page, pagesize, PROT_READ | PROT_EXEC, MAP_PRIVATE | MAP_FIXED, fd,
                   off);
    if (p != (void *)page) {
        perror("mmap");
        return 1;
    }
    close(fd);
    double end = now() + 2.5;
    while (now() < end) {
        s += work(after++);
        usleep(1000);
    }
    printf("after %ld sum=%ld\n", after > 0 ? 1L : 0L, s > 0 ? 1L : 0L);
    fprintf(stderr, "mapped_text: calls after the mapping %ld\n", after);
    return 0;
}
