/* Guest workload for hotprobe-guest's tests: a static program run by the
 * initramfs /init on the serial console. It prints READY, then obeys one
 * command per line read from stdin (the console), so the test knows exactly
 * which system calls were made after it attached its probes:
 *   getppid N [ARG] -> N getppid system calls (ARG, default 0, as their
 *                  unused first argument: a probe can filter on it),
 *                  then "getppid N done"
 *   open PATH   -> openat(AT_FDCWD, PATH, O_RDONLY), "open PATH fd=FD" (or -errno), close
 *   cat PATH    -> openat(AT_FDCWD, PATH, O_RDONLY), read(fd, buf, 64), close(fd)
 *                  (each a direct system call), "cat PATH fd=FD n=N rc=RC"
 *                  (negative errno for a failure; no read/close if openat failed)
 *   fork CMD    -> a child process runs CMD then exits; the parent waits,
 *                  then "fork pid=CHILD done"
 *   timed N     -> N getppid system calls, then "timed N ns=T": T the guest's
 *                  own CLOCK_MONOTONIC time for the loop (guest time)
 *   exit        -> "BYE", exit 0
 * Every reply line starts with "@" so the test can tell it from tty echo.
 *
 * Booted with rdinit=/workload it is init itself (no shell: nothing but
 * the workload makes a system call), mounts /proc and /dev, takes the
 * console, and powers the machine off when it is done. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <errno.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <sys/reboot.h>
#include <termios.h>
#include <time.h>

/* PID 1: what init.sh does for the workload, without a shell. */
static void be_init(void) {
    mkdir("/proc", 0755);
    mkdir("/dev", 0755);
    mount("proc", "/proc", "proc", 0, NULL);
    mount("dev", "/dev", "devtmpfs", 0, NULL);
    int fd = open("/dev/console", O_RDWR);
    if (fd >= 0) {
        dup2(fd, 0);
        dup2(fd, 1);
        dup2(fd, 2);
        if (fd > 2) {
            close(fd);
        }
    }
    struct termios t;
    if (tcgetattr(0, &t) == 0) {
        t.c_lflag &= ~(tcflag_t)ECHO;
        tcsetattr(0, TCSANOW, &t);
    }
}

static int finish(int rc) {
    if (getpid() == 1) {
        printf("@FINAL rc=%d\n", rc);
        sync();
        reboot(RB_POWER_OFF);
    }
    return rc;
}

static long neg(long r) {
    return r < 0 ? -errno : r;
}

/* One command; 1 for "exit". */
static int command(char *line) {
    if (strncmp(line, "fork ", 5) == 0) {
        pid_t c = fork();
        if (c == 0) {
            command(line + 5);
            _exit(0);
        }
        waitpid(c, NULL, 0);
        printf("@fork pid=%d done\n", (int)c);
    } else if (strncmp(line, "cat ", 4) == 0) {
        const char *path = line + 4;
        char buf[64];
        long fd = neg(syscall(SYS_openat, AT_FDCWD, path, O_RDONLY));
        long n = 0, rc = 0;
        if (fd >= 0) {
            n = neg(syscall(SYS_read, fd, buf, sizeof buf));
            rc = neg(syscall(SYS_close, fd));
        }
        printf("@cat %s fd=%ld n=%ld rc=%ld\n", path, fd, n, rc);
    } else if (strncmp(line, "timed ", 6) == 0) {
        long n = strtol(line + 6, NULL, 10);
        struct timespec a, b;
        clock_gettime(CLOCK_MONOTONIC, &a);
        for (long i = 0; i < n; i++) {
            syscall(SYS_getppid, 0);
        }
        clock_gettime(CLOCK_MONOTONIC, &b);
        long long ns = (b.tv_sec - a.tv_sec) * 1000000000LL + (b.tv_nsec - a.tv_nsec);
        printf("@timed %ld ns=%lld\n", n, ns);
    } else if (strncmp(line, "getppid ", 8) == 0) {
        char *end;
        long n = strtol(line + 8, &end, 10);
        long arg = strtol(end, NULL, 0);
        for (long i = 0; i < n; i++) {
            syscall(SYS_getppid, arg);
        }
        printf("@getppid %ld done\n", n);
    } else if (strncmp(line, "open ", 5) == 0) {
        const char *path = line + 5;
        long fd = syscall(SYS_openat, AT_FDCWD, path, O_RDONLY);
        if (fd < 0) {
            fd = -errno;
        }
        printf("@open %s fd=%ld\n", path, fd);
        if (fd >= 0) {
            close((int)fd);
        }
    } else if (strcmp(line, "exit") == 0) {
        return 1;
    } else if (line[0] != 0) {
        printf("@unknown %s\n", line);
    }
    return 0;
}

int main(void) {
    char line[512];
    if (getpid() == 1) {
        be_init();
    }
    setvbuf(stdout, NULL, _IONBF, 0);
    printf("@READY pid=%d\n", (int)getpid());
    while (fgets(line, sizeof line, stdin)) {
        line[strcspn(line, "\r\n")] = 0;
        if (command(line)) {
            printf("@BYE\n");
            return finish(0);
        }
    }
    printf("@EOF\n");
    return finish(0);
}
