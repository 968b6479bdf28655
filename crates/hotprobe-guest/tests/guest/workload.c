/* Guest workload for hotprobe-guest's tests: a static program run by the
 * initramfs /init on the serial console. It prints READY, then obeys one
 * command per line read from stdin (the console), so the test knows exactly
 * which system calls were made after it attached its probes:
 *   getppid N [ARG] -> N getppid system calls (ARG, default 0, as their
 *                  unused first argument: a probe can filter on it),
 *                  then "getppid N done"
 *   open PATH   -> openat(AT_FDCWD, PATH, O_RDONLY), "open PATH fd=FD" (or -errno), close
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
#include <sys/reboot.h>
#include <termios.h>

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

int main(void) {
    char line[512];
    if (getpid() == 1) {
        be_init();
    }
    setvbuf(stdout, NULL, _IONBF, 0);
    printf("@READY\n");
    while (fgets(line, sizeof line, stdin)) {
        line[strcspn(line, "\r\n")] = 0;
        if (strncmp(line, "getppid ", 8) == 0) {
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
            printf("@BYE\n");
            return finish(0);
        } else if (line[0] != 0) {
            printf("@unknown %s\n", line);
        }
    }
    printf("@EOF\n");
    return finish(0);
}
