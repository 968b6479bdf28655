/* The parent calls work() 4 times, forks N children (argv[1], default 1),
 * each calling work() 5 times, calls work() 6 more times, waits for them
 * in order and prints their statuses. Prints "parent PID", "child PID
 * work 5" (each child), "child PID exit S" or "child PID signal S" (the
 * parent, after waiting), "parent PID work 10". */
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static volatile long sink;

__attribute__((noinline)) long work(long x) {
    sink += x;
    return sink * 3 + x;
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 1;
    pid_t *kids = calloc(n, sizeof *kids);
    long calls = 0;
    printf("parent %d\n", (int)getpid());
    fflush(stdout);
    for (int i = 0; i < 4; i++, calls++)
        work(i);
    for (int k = 0; k < n; k++) {
        pid_t c = fork();
        if (c == 0) {
            long mine = 0;
            for (int i = 0; i < 5; i++, mine++)
                work(i);
            printf("child %d work %ld\n", (int)getpid(), mine);
            exit(0);
        }
        if (c < 0) {
            perror("fork");
            return 1;
        }
        kids[k] = c;
    }
    for (int i = 0; i < 6; i++, calls++)
        work(i);
    for (int k = 0; k < n; k++) {
        int st;
        if (waitpid(kids[k], &st, 0) != kids[k]) {
            perror("waitpid");
            return 1;
        }
        if (WIFEXITED(st))
            printf("child %d exit %d\n", (int)kids[k], WEXITSTATUS(st));
        else
            printf("child %d signal %d\n", (int)kids[k], WTERMSIG(st));
    }
    printf("parent %d work %ld\n", (int)getpid(), calls);
    return 0;
}
