/* Calls work() once, then execve()s itself into its second mode, which
 * calls work() 7 times and checks that its own text is its file's: the
 * first 32 bytes at work's address, read from memory, against those at
 * the matching offset of the file that /proc/self/maps names.
 * Prints "first work 1", "second work 7", "second text OK|DIFF". */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static volatile long sink;

__attribute__((noinline)) long work(long x) {
    sink += x;
    return sink * 3 + x;
}

static const char *text_check(void) {
    unsigned long addr = (unsigned long)&work;
    unsigned char mem[32], file[32];
    memcpy(mem, (const void *)addr, sizeof mem);
    FILE *maps = fopen("/proc/self/maps", "r");
    char line[4096];
    while (maps && fgets(line, sizeof line, maps)) {
        unsigned long lo, hi, off;
        char path[4096] = "";
        if (sscanf(line, "%lx-%lx %*s %lx %*s %*s %4095s", &lo, &hi, &off, path) < 3)
            continue;
        if (addr < lo || addr >= hi)
            continue;
        fclose(maps);
        FILE *f = fopen(path, "rb");
        if (!f || fseek(f, (long)(off + (addr - lo)), SEEK_SET) != 0 ||
            fread(file, 1, sizeof file, f) != sizeof file)
            return "UNREADABLE";
        fclose(f);
        return memcmp(mem, file, sizeof mem) == 0 ? "OK" : "DIFF";
    }
    return "NOMAP";
}

int main(int argc, char **argv) {
    long n = 0;
    if (argc > 1 && strcmp(argv[1], "second") == 0) {
        for (int i = 0; i < 7; i++, n++)
            work(i);
        printf("second work %ld\n", n);
        printf("second text %s\n", text_check());
        return 0;
    }
    work(1);
    n++;
    printf("first work %ld\n", n);
    fflush(stdout);
    char *args[] = {argv[0], "second", NULL};
    execv("/proc/self/exe", args);
    perror("execv");
    return 1;
}
