// vfork children the agent's interposers do not see (issue 22): made by a
// `syscall` instruction of the program's own (`raw`: clone3 with
// CLONE_VM | CLONE_VFORK and a stack of its own, inline assembly, not
// libc's syscall()) or inside glibc (`system`: its internal posix_spawn,
// whose child calls execve once). `raw`: the parent calls `leaf` 600
// times, the child 400 times and exits with 3, the parent 400 times more.
// `system`: the parent calls `leaf` 600 times, runs system("exit 4"),
// then calls `leaf` 400 times more. `spawn`: posix_spawn of /bin/true with
// 25 dup2 file actions (the child calls dup2 25 times, then execve); the
// parent calls dup2 7 times itself. `vfork`: as `raw`, the child made by
// libc's vfork(). With a second argument `wait`, it first prints
// "ready" and waits for a line on stdin (a tracer attaches meanwhile).
// Each prints what it did, then the
// pids on a line of their own; exit status 7.
#define _GNU_SOURCE
#include <fcntl.h>
#include <linux/sched.h>
#include <signal.h>
#include <spawn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

volatile long sink;
__attribute__((noinline)) void leaf(long x) { sink += x; }

static void calls(int n) {
    for (int i = 0; i < n; i++)
        leaf(i);
}

static char stack[1 << 16] __attribute__((aligned(16)));

static void child_main(void) {
    calls(400);
    syscall(SYS_exit, 3);
    __builtin_unreachable();
}

/* clone3 by the program's own `syscall` instruction: the child starts on
   its stack and calls `fn`, which never returns. */
static long raw_clone3(struct clone_args *a, void (*fn)(void)) {
    long ret;
    register void (*f)(void) __asm__("r12") = fn;
    __asm__ volatile("syscall\n\t"
                     "test %%rax, %%rax\n\t"
                     "jnz 1f\n\t"
                     "and $-16, %%rsp\n\t"
                     "call *%%r12\n\t"
                     "ud2\n"
                     "1:"
                     : "=a"(ret)
                     : "0"((long)SYS_clone3), "D"(a), "S"(sizeof *a), "r"(f)
                     : "rcx", "r11", "memory");
    return ret;
}

extern char **environ;

int main(int argc, char **argv) {
    const char *how = argc > 1 ? argv[1] : "raw";
    if (argc > 2 && strcmp(argv[2], "wait") == 0) {
        char line[16];
        printf("ready\n");
        fflush(stdout);
        if (!fgets(line, sizeof line, stdin))
            return 1;
    }
    int st = 0;
    pid_t c = 0;
    if (strcmp(how, "raw") == 0) {
        calls(600);
        struct clone_args a;
        memset(&a, 0, sizeof a);
        a.flags = CLONE_VM | CLONE_VFORK;
        a.exit_signal = SIGCHLD;
        a.stack = (uint64_t)(uintptr_t)stack;
        a.stack_size = sizeof stack;
        c = raw_clone3(&a, child_main);
        if (c < 0 || waitpid(c, &st, 0) != c)
            return 1;
        calls(400);
        printf("raw: parent calls=1000 child calls=400 child status=%d\n", WEXITSTATUS(st));
    } else if (strcmp(how, "vfork") == 0) {
        calls(600);
        c = vfork();
        if (c == 0) {
            calls(400);
            _exit(3);
        }
        if (c < 0 || waitpid(c, &st, 0) != c)
            return 1;
        calls(400);
        printf("vfork: parent calls=1000 child calls=400 child status=%d\n", WEXITSTATUS(st));
    } else if (strcmp(how, "system") == 0) {
        calls(600);
        st = system("exit 4");
        calls(400);
        printf("system: parent calls=1000 child status=%d\n", WEXITSTATUS(st));
    } else if (strcmp(how, "spawn") == 0) {
        posix_spawn_file_actions_t fa;
        posix_spawn_file_actions_init(&fa);
        for (int i = 0; i < 25; i++)
            posix_spawn_file_actions_adddup2(&fa, 2, 100 + i);
        char *av[] = {"/bin/true", NULL};
        if (posix_spawn(&c, "/bin/true", &fa, NULL, av, environ) != 0 || waitpid(c, &st, 0) != c)
            return 1;
        for (int i = 0; i < 7; i++) {
            dup2(2, 200);
            close(200);
        }
        printf("spawn: parent dup2=7 child dup2=25 child status=%d\n", WEXITSTATUS(st));
    } else {
        return 2;
    }
    printf("pids parent=%d child=%d\n", getpid(), c);
    return 7;
}
