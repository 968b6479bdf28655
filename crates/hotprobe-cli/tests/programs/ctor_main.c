/* Linked with libctor.so (its constructor runs before this program's);
 * its own constructor main_ctor calls mainhelper() once. Prints
 * "main_ctor mainhelper 1", then "main" and frees what lib_ctor kept. */
#include <stdio.h>
#include <stdlib.h>

extern void *libctor_kept[6];
static volatile long sink;

__attribute__((noinline)) long mainhelper(long x) {
    sink += x;
    return sink * 3 + x;
}

__attribute__((constructor)) static void main_ctor(void) {
    mainhelper(1);
    printf("main_ctor mainhelper 1\n");
}

int main(void) {
    printf("main\n");
    for (int i = 0; i < 6; i++)
        free(libctor_kept[i]);
    return 0;
}
