/* A program that drops its own text pages with MADV_DONTNEED halfway:
 * the file's code comes back over whatever a tracer wrote there. It calls
 * work() N times, drops the page holding it, then keeps calling it for
 * 2.5 s (the workload a tracer's periodic check must see), and prints its
 * counts (the exact number of calls after the drop on stderr: it varies
 * with the machine). With a second argument "untraced", it then waits (30 s
 * at most) until work() holds a tracer's bytes again and no tracer holds
 * the process, and says whether that came: a tracer whose mechanism needs
 * no ptrace must let it run untraced again once it armed the site again. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

__attribute__((noinline)) long work(long i) { return i * 3 + 1; }

/* The TracerPid line of /proc/self/status (-1: not read). */
static long tracer_pid(void) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return -1;
    char line[256];
    long pid = -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "TracerPid: %ld", &pid) == 1) break;
    fclose(f);
    return pid;
}

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
    /* The file's first byte of work(), back with the page. */
    unsigned char file_byte = *(volatile unsigned char *)work;
    double end = now() + 2.5;
    while (now() < end) {
        s += work(after++);
        usleep(1000);
    }
    printf("after %ld sum=%ld\n", after > 0 ? 1L : 0L, s > 0 ? 1L : 0L);
    fprintf(stderr, "dropped_text: calls after the drop %ld\n", after);
    if (argc > 2 && strcmp(argv[2], "untraced") == 0) {
        double limit = now() + 30;
        unsigned char b;
        long tracer;
        while ((b = *(volatile unsigned char *)work) == file_byte || (tracer = tracer_pid()) != 0) {
            if (now() > limit) {
                fprintf(stderr, "dropped_text: still traced or not armed: byte %02x, tracer %ld\n",
                        b, tracer_pid());
                return 0;
            }
            usleep(1000);
        }
        fprintf(stderr, "dropped_text: armed again and untraced\n");
    }
    return 0;
}
