/* record --kernel -f (issue 25): the parent calls getppid twice, a forked
 * child 4 times; each prints its role and tid (the child's is its pid). */
#include <stdio.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

__attribute__((noinline)) void calls(const char *who, int n) {
    for (int i = 0; i < n; i++) syscall(SYS_getppid);
    printf("%s %ld\n", who, (long)syscall(SYS_gettid));
    fflush(stdout);
}

int main(void) {
    fflush(stdout);
    pid_t child = fork();
    if (child == 0) {
        calls("child", 4);
        _exit(0);
    }
    waitpid(child, 0, 0);
    calls("parent", 2);
    return 0;
}
