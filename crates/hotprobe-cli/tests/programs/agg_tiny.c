/* tiny() is 3 bytes at -O2 (mov eax, edi; ret): too short for a jump, so
 * its probe is an in-process trap. main calls it with N values and logs
 * each ("VALUE v", write(2)): the aggregation tests compare hotprobe's
 * histogram of its argument with the log. */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

__attribute__((noinline)) int tiny(int x) { return x; }

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 100;
    volatile int sum = 0;
    for (int i = 0; i < n; i++) {
        int v = (i * 37) % 500;
        char line[32];
        int len = snprintf(line, sizeof line, "VALUE %d\n", v);
        if (write(1, line, (size_t)len) != len)
            return 3;
        sum += tiny(v);
    }
    return 0;
}
