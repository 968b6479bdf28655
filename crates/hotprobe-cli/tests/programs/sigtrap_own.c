// A program with a SIGTRAP handler of its own (issue 22): installed with
// sigaction (SA_SIGINFO | SA_RESTART, SIGUSR1 in its sa_mask), and with
// argument "block" SIGTRAP blocked in the main thread too. Prints
// "ready PID", then serves lines on stdin, printing one line each:
//   report  its own view: the handler (on_trap, default, ignored, other),
//           sa_flags, whether SIGUSR1 is in sa_mask, whether SIGTRAP is
//           blocked, and the SIGTRAPs its handler took;
//   call N  calls probed() N times;
//   sig N   N rounds of sigprocmask (read, block SIGUSR2, unblock it),
//           sigaction(SIGTRAP) read back and set again as read, and
//           sigaction(SIGUSR2) set; each round checks what it read back;
//   raise   raise(SIGTRAP) (held pending where blocked);
//   quit    prints "done calls=C" and exits with status 5.
// Each round of a probe hit, a signal-state call or a raise is what
// hotprobe must serve without changing what the program sees.
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

volatile long sink;
static long calls;
__attribute__((noinline)) void probed(long x) {
    sink += x;
    calls++;
}

static volatile sig_atomic_t handled;
static volatile sig_atomic_t usr1_blocked_inside = -1;

static void on_trap(int s, siginfo_t *info, void *uc) {
    (void)s;
    (void)info;
    (void)uc;
    // The kernel blocks sa_mask (SIGUSR1) while the handler runs.
    sigset_t now;
    sigprocmask(SIG_BLOCK, NULL, &now);
    usr1_blocked_inside = sigismember(&now, SIGUSR1);
    handled++;
}

static void on_usr2(int s) { (void)s; }

static const char *name(const struct sigaction *sa) {
    if (sa->sa_handler == SIG_DFL)
        return "default";
    if (sa->sa_handler == SIG_IGN)
        return "ignored";
    return sa->sa_sigaction == on_trap ? "on_trap" : "other";
}

static void report(void) {
    struct sigaction sa;
    sigaction(SIGTRAP, NULL, &sa);
    sigset_t m;
    sigprocmask(SIG_BLOCK, NULL, &m);
    printf("handler=%s flags=%#x usr1_in_mask=%d trap_blocked=%d handled=%d usr1_inside=%d\n",
           name(&sa), (unsigned)sa.sa_flags, sigismember(&sa.sa_mask, SIGUSR1),
           sigismember(&m, SIGTRAP), (int)handled, (int)usr1_blocked_inside);
}

static int sig_rounds(long n) {
    for (long i = 0; i < n; i++) {
        sigset_t s, old, back;
        sigemptyset(&s);
        sigaddset(&s, SIGUSR2);
        if (sigprocmask(SIG_BLOCK, &s, &old) || sigprocmask(SIG_BLOCK, NULL, &back) ||
            !sigismember(&back, SIGUSR2) || sigprocmask(SIG_SETMASK, &old, NULL))
            return 1;
        struct sigaction sa, again;
        if (sigaction(SIGTRAP, NULL, &sa) || sigaction(SIGTRAP, &sa, NULL) ||
            sigaction(SIGTRAP, NULL, &again))
            return 2;
        if (again.sa_sigaction != sa.sa_sigaction || again.sa_flags != sa.sa_flags ||
            sigismember(&again.sa_mask, SIGUSR1) != sigismember(&sa.sa_mask, SIGUSR1))
            return 3;
        struct sigaction u;
        memset(&u, 0, sizeof u);
        u.sa_handler = on_usr2;
        if (sigaction(SIGUSR2, &u, NULL))
            return 4;
    }
    return 0;
}

int main(int argc, char **argv) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_trap;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaddset(&sa.sa_mask, SIGUSR1);
    if (sigaction(SIGTRAP, &sa, NULL))
        return 2;
    if (argc > 1 && !strcmp(argv[1], "block")) {
        sigset_t s;
        sigemptyset(&s);
        sigaddset(&s, SIGTRAP);
        sigprocmask(SIG_BLOCK, &s, NULL);
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    printf("ready %d\n", (int)getpid());
    char line[64];
    while (fgets(line, sizeof line, stdin)) {
        long n = 0;
        if (!strncmp(line, "report", 6)) {
            report();
        } else if (sscanf(line, "call %ld", &n) == 1) {
            for (long i = 0; i < n; i++)
                probed(i);
            printf("called %ld\n", n);
        } else if (sscanf(line, "sig %ld", &n) == 1) {
            printf("sig %ld: %d\n", n, sig_rounds(n));
        } else if (!strncmp(line, "raise", 5)) {
            raise(SIGTRAP);
            printf("raised handled=%d\n", (int)handled);
        } else {
            break;
        }
    }
    printf("done calls=%ld\n", calls);
    return 5;
}
