/* The library tests/programs/reloads.c unloads and loads again (the
 * reloaded-library tests of crates/hotprobe and crates/hotprobe-cli).
 * Built with -fpatchable-function-entry=5: `f`, long enough for a jump,
 * has a patchable entry (a patch can take it too); `g`, too short for a
 * jump and without one, the last function (no padding after it: an
 * in-process trap takes it under `auto`; 3 bytes, `mov %edi,%eax; ret`:
 * a 4-byte one would take a punned jump);
 * `named` has a string parameter (typed values). */
#include <string.h>

volatile long lib_sink;

__attribute__((noinline)) long f(long x) {
    lib_sink += x * 3;
    if (x > 1000)
        lib_sink ^= x;
    return x + 2;
}

__attribute__((noinline)) long named(const char *name, long n) {
    lib_sink += n;
    return (long)strlen(name) + n;
}

/* Last: no padding after it for a jump to take. */
__attribute__((noinline, patchable_function_entry(0, 0))) long g(long x) {
    return (unsigned)x;
}
