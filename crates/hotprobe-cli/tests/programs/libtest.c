/* The shared library dlopen_twice.c loads: libfn, counted by the caller. */
static volatile long sink;

__attribute__((noinline)) long libfn(long x) {
    sink += x;
    return sink * 3 + x;
}
