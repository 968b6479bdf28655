// A child that runs in its parent's memory until it exits: made by
// vfork() (`vfork`), glibc's clone(CLONE_VM | CLONE_VFORK) with a stack
// of its own (`clone`), or clone3(CLONE_VM | CLONE_VFORK) through
// syscall() with a stack of its own (`clone3`: the child returns from
// syscall() on that stack, into child_calls, whose address is the word at
// its top). The parent calls `leaf` (7 bytes) and `leaf4` (4 bytes) 1000
// times each, makes the child, which calls both 1000 times and exits with
// 3, then calls both 500 times more and exits with 7. It prints what it
// did, then the two pids on a line of their own. `vfork0`: as `vfork`, but
// the parent's 1500 calls all come after the child's (its thread has made
// no probed call before the child's). `vfork4`: as `vfork`, but the
// child calls only `leaf4` (an in-process trap's site: its first hit is
// there). `spawn`: posix_spawn of
// /bin/true (glibc makes its child with an internal clone(CLONE_VM |
// CLONE_VFORK); the child calls libc's execve once), before any probed
// call of the parent's, then the parent calls both 1500 times. `many`: a
// second thread calls both 200000 times while the main thread makes N
// vfork children (argv[2], 50 by default) one after the other, each
// calling both 100 times, and calls both once after each.
#define _GNU_SOURCE
#include <linux/sched.h>
#include <pthread.h>
#include <sched.h>
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
__attribute__((noinline)) int leaf4(int x) { return x + 1; }

static void calls(int n) {
    for (int i = 0; i < n; i++) {
        leaf(i);
        sink += leaf4(i);
    }
}

static void child_calls(void) {
    calls(1000);
    _exit(3);
}

static void child_calls4(void) {
    for (int i = 0; i < 1000; i++)
        sink += leaf4(i);
    _exit(3);
}

static int clone_child(void *arg) {
    (void)arg;
    child_calls();
    return 0;
}

extern char **environ;

static char stack[1 << 16] __attribute__((aligned(16)));

static void *background(void *arg) {
    calls(200000);
    return arg;
}

static int many(int n) {
    pthread_t t;
    if (pthread_create(&t, NULL, background, NULL) != 0)
        return 1;
    for (int k = 0; k < n; k++) {
        pid_t c = vfork();
        if (c == 0) {
            calls(100);
            _exit(0);
        }
        if (c < 0 || waitpid(c, NULL, 0) != c)
            return 1;
        calls(1);
    }
    pthread_join(t, NULL);
    printf("many: parent calls=%d children=%d child calls=100\n", 200000 + n, n);
    printf("pids parent=%d child=0\n", getpid());
    return 7;
}

int main(int argc, char **argv) {
    const char *how = argc > 1 ? argv[1] : "vfork";
    if (strcmp(how, "many") == 0)
        return many(argc > 2 ? atoi(argv[2]) : 50);
    pid_t c;
    int spawn = strcmp(how, "spawn") == 0;
    int late = spawn || strcmp(how, "vfork0") == 0;
    if (spawn) {
        char *av[] = {"/bin/true", NULL};
        int e = posix_spawn(&c, "/bin/true", NULL, NULL, av, environ);
        if (e != 0) {
            fprintf(stderr, "posix_spawn: %s\n", strerror(e));
            return 1;
        }
    } else if (!late) {
        calls(1000);
    }
    if (spawn) {
        /* made above */
    } else if (strcmp(how, "vfork4") == 0) {
        c = vfork();
        if (c == 0)
            child_calls4();
    } else if (strcmp(how, "vfork") == 0 || strcmp(how, "vfork0") == 0) {
        c = vfork();
        if (c == 0)
            child_calls();
    } else if (strcmp(how, "clone") == 0) {
        c = clone(clone_child, stack + sizeof stack, CLONE_VM | CLONE_VFORK | SIGCHLD, NULL);
    } else {
        struct clone_args a;
        memset(&a, 0, sizeof a);
        a.flags = CLONE_VM | CLONE_VFORK;
        a.exit_signal = SIGCHLD;
        uint64_t *top = (uint64_t *)(stack + sizeof stack) - 2;
        top[0] = (uint64_t)(uintptr_t)child_calls;
        a.stack = (uint64_t)(uintptr_t)stack;
        a.stack_size = (uint64_t)((char *)top - stack);
        c = syscall(SYS_clone3, &a, sizeof a);
    }
    if (c < 0) {
        perror(how);
        return 1;
    }
    int st;
    if (waitpid(c, &st, 0) != c) {
        perror("waitpid");
        return 1;
    }
    calls(late ? 1500 : 500);
    if (spawn)
        printf("%s: parent calls=1500 child execve=1 child status=%d\n", how, WEXITSTATUS(st));
    else if (strcmp(how, "vfork4") == 0)
        printf("%s: parent calls=1500 child leaf4=1000 child status=%d\n", how, WEXITSTATUS(st));
    else
        printf("%s: parent calls=1500 child calls=1000 child status=%d\n", how, WEXITSTATUS(st));
    printf("pids parent=%d child=%d\n", getpid(), c);
    return 7;
}
