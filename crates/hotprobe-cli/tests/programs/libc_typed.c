/* Calls into a stripped libc whose types come from libc6-dbg (or, hidden,
 * from hotprobe's prototype table): fopen64 with two strings, write with
 * an fd and a size. Built without -g: the program's own DWARF plays no
 * part. Prints what it passed. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

int main(void) {
    FILE *f = fopen("/etc/hostname", "rb");
    if (f) fclose(f);
    const char *msg = "typed\n";
    write(1, msg, strlen(msg));
    fprintf(stderr, "fopen64(\"/etc/hostname\", \"rb\") write(1, 6)\n");
    return 0;
}
