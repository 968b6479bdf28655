/* The parent calls child_work() 3 times, forks; the child calls it 5 times
 * and exits 0; the parent waits and prints how the child ended. */
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

volatile long sink;

__attribute__((noinline)) long child_work(long x) {
    sink += x;
    return x * 2;
}

int main(void) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    for (int i = 0; i < 3; i++)
        child_work(i);
    pid_t pid = fork();
    if (pid == 0) {
        long s = 0;
        for (int i = 0; i < 5; i++)
            s += child_work(i);
        printf("child sum %ld\n", s);
        _exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    if (WIFEXITED(status))
        printf("child exited %d\n", WEXITSTATUS(status));
    else if (WIFSIGNALED(status))
        printf("child killed by signal %d\n", WTERMSIG(status));
    return 0;
}
