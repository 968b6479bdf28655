/* Calls leafwork() N times (N = argv[1]), then prints "leafn N sum S".
 * With a second argument FIFO, first opens FIFO for reading and waits
 * until its writer closes it (a test holds it running that way), then
 * does its calls. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static volatile long sink;

__attribute__((noinline)) long leafwork(long x) {
    sink += x;
    return sink;
}

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 1;
    if (argc > 2) {
        int fd = open(argv[2], O_RDONLY);
        if (fd < 0) {
            perror(argv[2]);
            return 2;
        }
        char c;
        while (read(fd, &c, 1) > 0)
            ;
        close(fd);
    }
    long sum = 0;
    for (long i = 1; i <= n; i++)
        sum += leafwork(i);
    printf("leafn %ld sum %ld\n", n, sum);
    return 0;
}
