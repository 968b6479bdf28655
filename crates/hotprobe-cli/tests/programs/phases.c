/* Three phases separated by calls of phase_marker(); each phase calls
 * work() a different number of times (3, 5, 7) and main prints them. */
#include <stdio.h>

static volatile int sink;

__attribute__((noinline)) void phase_marker(int n) { sink = n; }

__attribute__((noinline)) int work(int x) {
    sink += x;
    return x + 1;
}

int main(void) {
    int counts[3] = {3, 5, 7};
    for (int p = 0; p < 3; p++) {
        phase_marker(p);
        for (int i = 0; i < counts[p]; i++)
            work(i);
        printf("phase %d work %d\n", p, counts[p]);
    }
    return 0;
}
