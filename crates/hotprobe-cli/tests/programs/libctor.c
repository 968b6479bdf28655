/* A shared library (libctor.so, DT_NEEDED by ctor_main.c) whose
 * constructor lib_ctor calls helper() twice and malloc() 3 times, or 6
 * times when LIBCTOR_MALLOCS=6. Prints "lib_ctor helper 2 malloc M". */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static volatile long sink;
void *libctor_kept[6];

__attribute__((noinline)) long helper(long x) {
    sink += x;
    return sink * 3 + x;
}

__attribute__((constructor, noinline)) void lib_ctor(void) {
    const char *e = getenv("LIBCTOR_MALLOCS");
    int mallocs = e && strcmp(e, "6") == 0 ? 6 : 3;
    long helpers = 0;
    for (int i = 0; i < 2; i++, helpers++)
        helper(i);
    for (int i = 0; i < mallocs; i++)
        libctor_kept[i] = malloc(64 + 16 * i);
    printf("lib_ctor helper %ld malloc %d\n", helpers, mallocs);
}
