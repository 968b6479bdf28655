/* hotprobe's calibration target (crates/hotprobe/src/calibration.rs): calls
 * one of its functions N times and prints the ns per call its own clock
 * measured (the median of batches of 100, and their 10th percentile). Built by the hotprobe crate's
 * build script, embedded in the library, written out when a recording
 * calibrates. The functions are written in assembly
 * so that each mechanism gets the one it is for:
 *   hotprobe_calibration_patch: a 5-byte NOP placeholder first
 *     (-fpatchable-function-entry's), then the body: the patch;
 *   hotprobe_calibration_leaf: a frame, 10 bytes: a jump (or the ptrace
 *     trap, when forced);
 *   hotprobe_calibration_short: 3 bytes, another function right after
 *     it (no padding): only a trap fits (the in-process trap under the
 *     usual choice; a 4-byte one would take a punned jump).
 * Usage: hotprobe-calibration FUNCTION CALLS */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

__asm__(
    ".text\n"
    ".globl hotprobe_calibration_patch\n"
    ".type hotprobe_calibration_patch,@function\n"
    ".p2align 4\n"
    "hotprobe_calibration_patch:\n"
    "1: .byte 0x0f, 0x1f, 0x44, 0x00, 0x00\n"
    "push %rbp\n"
    "mov %rsp, %rbp\n"
    "lea 1(%rdi), %rax\n"
    "pop %rbp\n"
    "ret\n"
    ".size hotprobe_calibration_patch, . - hotprobe_calibration_patch\n"
    ".section __patchable_function_entries,\"awo\",@progbits,hotprobe_calibration_patch\n"
    ".p2align 3\n"
    ".quad 1b\n"
    ".text\n"
    ".globl hotprobe_calibration_leaf\n"
    ".type hotprobe_calibration_leaf,@function\n"
    ".p2align 4\n"
    "hotprobe_calibration_leaf:\n"
    "push %rbp\n"
    "mov %rsp, %rbp\n"
    "lea 1(%rdi), %rax\n"
    "pop %rbp\n"
    "ret\n"
    ".size hotprobe_calibration_leaf, . - hotprobe_calibration_leaf\n"
    ".globl hotprobe_calibration_short\n"
    ".type hotprobe_calibration_short,@function\n"
    ".p2align 4\n"
    "hotprobe_calibration_short:\n"
    "xchg %rdi, %rax\n"
    "ret\n"
    ".size hotprobe_calibration_short, . - hotprobe_calibration_short\n"
    ".globl hotprobe_calibration_after_short\n"
    ".type hotprobe_calibration_after_short,@function\n"
    "hotprobe_calibration_after_short:\n"
    "ret\n"
    ".size hotprobe_calibration_after_short, . - hotprobe_calibration_after_short\n");

long hotprobe_calibration_patch(long);
long hotprobe_calibration_leaf(long);
long hotprobe_calibration_short(long);

static double now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s FUNCTION CALLS\n", argv[0]);
        return 2;
    }
    long (*f)(long);
    if (strcmp(argv[1], "hotprobe_calibration_patch") == 0)
        f = hotprobe_calibration_patch;
    else if (strcmp(argv[1], "hotprobe_calibration_leaf") == 0)
        f = hotprobe_calibration_leaf;
    else if (strcmp(argv[1], "hotprobe_calibration_short") == 0)
        f = hotprobe_calibration_short;
    else {
        fprintf(stderr, "no function %s\n", argv[1]);
        return 2;
    }
    long n = strtol(argv[2], NULL, 10);
    if (n <= 0) {
        fprintf(stderr, "bad count %s\n", argv[2]);
        return 2;
    }
    /* Batches of 100 calls, each timed: the median batch's ns per call
     * is printed, so that a batch the scheduler preempted does not count. */
    enum { BATCH = 100, MAX_BATCHES = 4096 };
    static double per_call[MAX_BATCHES];
    long batches = n / BATCH;
    if (batches < 1)
        batches = 1;
    if (batches > MAX_BATCHES)
        batches = MAX_BATCHES;
    long (*volatile call)(long) = f;
    long acc = 0;
    for (long b = 0; b < batches; b++) {
        double t0 = now_ns();
        for (long i = 0; i < BATCH; i++)
            acc += call(i);
        per_call[b] = (now_ns() - t0) / BATCH;
    }
    /* Insertion sort: at most 4096 values. */
    for (long i = 1; i < batches; i++) {
        double v = per_call[i];
        long j = i - 1;
        while (j >= 0 && per_call[j] > v) {
            per_call[j + 1] = per_call[j];
            j--;
        }
        per_call[j + 1] = v;
    }
    printf("ns_per_call %.3f\n", per_call[batches / 2]);
    /* The 10th-percentile batch: a low quantile, that a loaded machine's
     * preemptions and cache misses reach less than the median. */
    printf("ns_per_call_low %.3f\n", per_call[batches / 10]);
    return acc == 0x7fffffffffffffffL; /* uses acc */
}
