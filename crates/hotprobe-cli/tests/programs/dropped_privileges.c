/* A daemon that drops its privileges (issue 23): setuid(65534) and
 * PR_SET_DUMPABLE 0, then counts work on request: each line N read on
 * stdin makes N calls of work_jump (probed by a jump) and of work_patch
 * (a patchable entry: probed by a patch), answered by "done N". */
#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <unistd.h>

static volatile long sink;

__attribute__((noinline, noipa)) long work_jump(long x) {
    sink += x;
    return x * 3 + 1;
}

__attribute__((noinline, noipa, patchable_function_entry(5, 0))) long work_patch(long x) {
    sink -= x;
    return x ^ 0x55;
}

int main(void) {
    if (setuid(65534) != 0) {
        perror("setuid");
        return 1;
    }
    if (prctl(PR_SET_DUMPABLE, 0) != 0) {
        perror("prctl");
        return 1;
    }
    printf("ready uid %d dumpable %d\n", (int)getuid(), prctl(PR_GET_DUMPABLE));
    fflush(stdout);
    char line[64];
    long acc = 0;
    while (fgets(line, sizeof line, stdin)) {
        long n = atol(line);
        for (long i = 0; i < n; i++)
            acc += work_jump(i) + work_patch(i);
        printf("done %ld\n", n);
        fflush(stdout);
    }
    return (int)(acc & 0);
}
