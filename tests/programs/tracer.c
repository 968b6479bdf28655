/* A minimal tracer: PTRACE_SEIZE the pid given (without stopping it), say
 * "seized PID" on stdout, hold it until stdin ends, then exit (the kernel
 * detaches a tracer's tracees when it exits). */
#include <stdio.h>
#include <stdlib.h>
#include <sys/ptrace.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc != 2) return 2;
    pid_t pid = (pid_t)atoi(argv[1]);
    if (ptrace(PTRACE_SEIZE, pid, 0, 0) != 0) {
        perror("PTRACE_SEIZE");
        return 1;
    }
    printf("seized %d\n", (int)pid);
    fflush(stdout);
    char c;
    while (read(0, &c, 1) > 0) {
    }
    return 0;
}
