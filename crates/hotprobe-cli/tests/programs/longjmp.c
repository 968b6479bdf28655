/* 100 rounds of: recurse 5 deep in `deep` and longjmp out of the deepest
 * call, then call `deep` 2 deep normally. Every probed function logs
 * "TID DEPTH NAME" on entry, through note_enter (which the test leaves
 * out of the recording), with the depth as the program sees it: a
 * longjmp resets it. That is the call tree `hotprobe replay` must show. */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdio.h>
#include <sys/syscall.h>
#include <unistd.h>

static jmp_buf jb;
static int depth, tid;

__attribute__((noinline)) void note_enter(const char *name) {
    printf("%d %d %s\n", tid, depth, name);
}

__attribute__((noinline)) int deep(int n, int jump) {
    note_enter("deep");
    depth++;
    int r = 0;
    if (n == 0) {
        if (jump)
            longjmp(jb, 1);
    } else {
        r = deep(n - 1, jump) + 1;
    }
    depth--;
    return r;
}

__attribute__((noinline)) void round_trip(void) {
    note_enter("round_trip");
    depth++;
    if (setjmp(jb) == 0)
        deep(4, 1);
    depth = 2;
    deep(1, 0);
    depth--;
}

int main(void) {
    tid = (int)syscall(SYS_gettid);
    note_enter("main");
    depth++;
    for (int i = 0; i < 100; i++)
        round_trip();
    depth--;
    return 0;
}
