/* A tracer of its own (issue 22): `passing_tracer PID` seizes PID's main thread
 * (PTRACE_SEIZE), prints "seized PID", and passes every signal on to it
 * as gdb does after `handle SIGTRAP nostop noprint pass`, counting the SIGTRAPs.
 * When its stdin closes it detaches and prints "passed N SIGTRAPs". It
 * waits for the tracee's stops and its stdin at once (ppoll, SIGCHLD
 * unblocked only there: no stop is missed). */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/ptrace.h>
#include <sys/wait.h>
#include <unistd.h>

static void on_chld(int s) { (void)s; }

/* Handles every stop waiting; -1 when the tracee is gone. */
static int serve(pid_t pid, long *traps) {
    int st;
    pid_t w;
    while ((w = waitpid(pid, &st, WNOHANG | __WALL)) > 0) {
        if (WIFEXITED(st) || WIFSIGNALED(st))
            return -1;
        if (!WIFSTOPPED(st))
            continue;
        int sig = WSTOPSIG(st);
        if (st >> 16 == PTRACE_EVENT_STOP) {
            ptrace(PTRACE_CONT, pid, 0, 0);
            continue;
        }
        if (sig == SIGTRAP)
            (*traps)++;
        ptrace(PTRACE_CONT, pid, 0, (void *)(long)sig);
    }
    return 0;
}

int main(int argc, char **argv) {
    pid_t pid = argc > 1 ? atoi(argv[1]) : 0;
    sigset_t chld, open_mask;
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    sigprocmask(SIG_BLOCK, &chld, &open_mask);
    sigdelset(&open_mask, SIGCHLD);
    struct sigaction sa = {0};
    sa.sa_handler = on_chld;
    sigaction(SIGCHLD, &sa, NULL);
    if (ptrace(PTRACE_SEIZE, pid, 0, 0) != 0) {
        perror("PTRACE_SEIZE");
        return 1;
    }
    printf("seized %d\n", (int)pid);
    fflush(stdout);
    long traps = 0;
    for (;;) {
        if (serve(pid, &traps) < 0) {
            printf("gone after %ld SIGTRAPs\n", traps);
            return 2;
        }
        struct pollfd p = {.fd = 0, .events = POLLIN};
        int n = ppoll(&p, 1, NULL, &open_mask);
        if (n < 0 && errno == EINTR)
            continue;
        char buf[64];
        if (n > 0 && read(0, buf, sizeof buf) <= 0)
            break;
    }
    /* Detach: stop it (PTRACE_INTERRUPT), pass on a signal it stopped with. */
    ptrace(PTRACE_INTERRUPT, pid, 0, 0);
    for (;;) {
        int st;
        if (waitpid(pid, &st, __WALL) < 0)
            return 3;
        if (WIFEXITED(st) || WIFSIGNALED(st))
            return 2;
        if (!WIFSTOPPED(st))
            continue;
        int sig = WSTOPSIG(st);
        if (st >> 16 == PTRACE_EVENT_STOP) {
            ptrace(PTRACE_DETACH, pid, 0, 0);
            break;
        }
        if (sig == SIGTRAP)
            traps++;
        ptrace(PTRACE_DETACH, pid, 0, (void *)(long)sig);
        break;
    }
    printf("passed %ld SIGTRAPs\n", traps);
    return 0;
}
