/* Calls into a stripped libc whose types come from libc6-dbg (or, hidden,
 * from hotprobe's prototype table): fopen64 with two strings, fclose with
 * the FILE * it returned, write with an fd and a size. Built without -g:
 * the program's own DWARF plays no part. Prints what it passed, and the
 * stream's fd (fclose's fp->_fileno). */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

int main(void) {
    FILE *f = fopen("/etc/hostname", "rb");
    int fd = f ? fileno(f) : -1;
    if (f) fclose(f);
    const char *msg = "typed\n";
    write(1, msg, strlen(msg));
    fprintf(stderr, "fopen64(\"/etc/hostname\", \"rb\") fileno %d write(1, 6)\n", fd);
    return 0;
}
