// The program's SIGTRAP state against hotprobe's traps, round 3 (issue
// 22). Each case prints only what it decides itself (stdout, the same
// natively and probed) and the number of probed calls it made on stderr
// ("CASE calls=N"); exit status 5.
//
//   late:  a worker blocks SIGTRAP (pthread_sigmask) while SIGTRAP has no
//          handler; then main installs one (sigaction). The worker calls
//          tiny() 3000 times while main raises SIGTRAP at itself over and
//          over: every raise is handled (a trap of the tracer's in a
//          thread blocking SIGTRAP resets the handler to SIG_DFL: a raise
//          meanwhile killed the program). Then main sends SIGTRAP to the
//          worker (pthread_kill): held pending there, handled in the
//          worker once it unblocks it. The phases are ordered by pipes.
//   attach: late, but the handler is in and the worker blocks SIGTRAP
//          when hotprobe attaches: main prints "ready PID" and waits for
//          a line on stdin before the worker's calls and its raises.
//   stepq: an SA_SIGINFO handler; the main thread calls stepped() (its
//          first instruction an indirect call: the ptrace trap
//          single-steps it) until a child process has queued 100
//          SIGTRAPs to it with sigqueue, values 1..100, each sent once
//          main has made 3 more calls and acknowledged by the handler
//          through a pipe before the next. The handler sees each value
//          once, in order, with SI_QUEUE and the sender's pid. (A
//          process-directed signal: one sent to a thread in the instant
//          a trap's own SIGTRAP is pending there is merged with it by the
//          kernel, which keeps one pending SIGTRAP per thread.)
#define _GNU_SOURCE
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

__attribute__((noinline)) int tiny(int x) { return x + 1; }

static volatile long bumps;
static void bump(void) { bumps++; }

// Its first instruction is an indirect call, which the trap mechanism
// single-steps out of line (neither boosted nor emulated).
__attribute__((naked, noinline)) void stepped(void (*f)(void)) {
    __asm__ volatile("call *%rdi\n\tret\n");
}

static pthread_t worker_thread;
static volatile sig_atomic_t handled_main, handled_worker;
static volatile int worker_done;
static int ready[2], go[2], ack[2];

static void on_trap(int s) {
    (void)s;
    if (pthread_equal(pthread_self(), worker_thread))
        handled_worker++;
    else
        handled_main++;
}

static void wait_byte(int fd) {
    char c;
    while (read(fd, &c, 1) != 1)
        ;
}

static void send_byte(int fd) {
    while (write(fd, "x", 1) != 1)
        ;
}

static int trap_in(const sigset_t *s) { return sigismember(s, SIGTRAP); }

static void *late_worker(void *arg) {
    sigset_t s, now;
    sigemptyset(&s);
    sigaddset(&s, SIGTRAP);
    pthread_sigmask(SIG_BLOCK, &s, NULL);
    send_byte(ready[1]); // blocked, no handler yet
    wait_byte(go[0]);    // main installed its handler
    long sum = 0;
    for (int i = 0; i < 3000; i++)
        sum += tiny(i);
    fprintf(stderr, "late calls=3000\n");
    worker_done = 1;
    wait_byte(go[0]); // main sent SIGTRAP to this thread
    pthread_sigmask(SIG_BLOCK, NULL, &now);
    sigpending(&s);
    printf("worker: sum=%ld blocked=%d pending=%d handled here=%d\n", sum, trap_in(&now),
           trap_in(&s), (int)handled_worker);
    sigemptyset(&s);
    sigaddset(&s, SIGTRAP);
    pthread_sigmask(SIG_UNBLOCK, &s, NULL);
    sigpending(&s);
    printf("worker: unblocked pending=%d handled here=%d\n", trap_in(&s), (int)handled_worker);
    return arg;
}

static int late(int attach) {
    if (pipe(ready) || pipe(go))
        return 1;
    if (pthread_create(&worker_thread, NULL, late_worker, NULL))
        return 1;
    wait_byte(ready[0]);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_trap;
    sigaction(SIGTRAP, &sa, NULL);
    if (attach) {
        // Attached to now, the worker blocking SIGTRAP already.
        char line[16];
        printf("ready %d\n", (int)getpid());
        if (!fgets(line, sizeof line, stdin))
            return 1;
    }
    send_byte(go[1]);
    long raised = 0;
    do {
        raise(SIGTRAP);
        raised++;
    } while (!worker_done);
    printf("main: every raise handled=%d\n", raised == handled_main);
    pthread_kill(worker_thread, SIGTRAP);
    send_byte(go[1]);
    pthread_join(worker_thread, NULL);
    printf("main: handled in main=%d, in the worker=%d\n", handled_main == raised,
           (int)handled_worker);
    return 5;
}

// What the sender and the stepping process share.
struct shared {
    volatile long calls;
    volatile int queued_value, stop;
};
static struct shared *sh;
static volatile int in_order = 1, right_code = 1, right_pid = 1;
static pid_t sender;

static void on_info(int s, siginfo_t *si, void *uc) {
    (void)s;
    (void)uc;
    in_order &= si->si_value.sival_int == sh->queued_value;
    right_code &= si->si_code == SI_QUEUE;
    right_pid &= si->si_pid == sender;
    handled_main++;
    send_byte(ack[1]);
}

// The sender (a child process): queues 1..100, each once the stepping
// process has made 3 more calls since the last was handled. Its exit
// status: the signals lost.
static int send_all(void) {
    pid_t to = getppid();
    for (int k = 1; k <= 100; k++) {
        long mark = sh->calls;
        while (sh->calls < mark + 3)
            sched_yield();
        sh->queued_value = k;
        union sigval v;
        v.sival_int = k;
        if (sigqueue(to, SIGTRAP, v))
            return 100;
        // Natively the handler answers within microseconds: a signal
        // not handled within 10 s is lost.
        struct pollfd p = {ack[0], POLLIN, 0};
        if (poll(&p, 1, 10000) != 1) {
            sh->stop = 1;
            return 101 - k;
        }
        wait_byte(ack[0]);
    }
    sh->stop = 1;
    return 0;
}

static int stepq(void) {
    sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (sh == MAP_FAILED || pipe(ack))
        return 1;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_info;
    sa.sa_flags = SA_SIGINFO;
    sigaction(SIGTRAP, &sa, NULL);
    sender = fork();
    if (sender == 0)
        _exit(send_all());
    while (!sh->stop) {
        stepped(bump);
        sh->calls++;
    }
    int st;
    waitpid(sender, &st, 0);
    fprintf(stderr, "stepq calls=%ld\n", sh->calls);
    printf("main: every call made its indirect call=%d\n", sh->calls == bumps);
    printf("main: lost=%d handled=%d in order=%d SI_QUEUE=%d from the sender=%d\n",
           WIFEXITED(st) ? WEXITSTATUS(st) : -1, (int)handled_main, in_order, right_code,
           right_pid);
    return 5;
}

int main(int argc, char **argv) {
    const char *how = argc > 1 ? argv[1] : "late";
    setvbuf(stdout, NULL, _IONBF, 0);
    if (!strcmp(how, "late"))
        return late(0);
    if (!strcmp(how, "attach"))
        return late(1);
    if (!strcmp(how, "stepq"))
        return stepq();
    return 2;
}
