/* Issue 24, count -f with conditions and aggregations: the parent and its
 * forked child each call work() with known arguments, and print their
 * pids. Child: work(0) .. work(9); parent, after the child ended:
 * work(0) .. work(7). */
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

__attribute__((noinline)) int work(int n) {
    asm volatile("");
    return n * 2;
}

int main(void) {
    int sum = 0;
    pid_t c = fork();
    if (c == 0) {
        for (int i = 0; i < 10; i++) sum += work(i);
        printf("child %d sum %d\n", getpid(), sum);
        return 0;
    }
    waitpid(c, NULL, 0);
    for (int i = 0; i < 8; i++) sum += work(i);
    printf("parent %d sum %d\n", getpid(), sum);
    return 0;
}
