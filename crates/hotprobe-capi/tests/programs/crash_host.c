/* A C API host whose handler crashes (issue 22: "an int3 left by a
 * crashed handler is removed, or its probe is said to be disabled"):
 *   crash_host MECHANISM attach PID
 *   crash_host MECHANISM spawn PROGRAM
 * attaches to PID, or starts PROGRAM (its standard input and output the
 * host's, its standard error /dev/null), puts a probe with a pre handler on `work`, prints "probed" and
 * runs. The handler prints "pre N arg A" for its Nth call (A: work's
 * first argument) and, at its 3rd call, writes through a null pointer:
 * the host dies of SIGSEGV inside hotprobe_run, its probes in. The host
 * prints on its standard error. */
#include <fcntl.h>
#include <hotprobe.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int calls;

static void pre(hotprobe_ctx *ctx, void *user) {
    (void)user;
    uint64_t a = 0;
    if (hotprobe_ctx_arg(ctx, 0, &a) != HOTPROBE_OK)
        a = (uint64_t)-1;
    calls++;
    fprintf(stderr, "pre %d arg %" PRIu64 "\n", calls, a);
    if (calls == 3) {
        volatile int *nowhere = (volatile int *)(uintptr_t)(calls - 3);
        *nowhere = 1;
    }
}

static int fail(const char *what) {
    fprintf(stderr, "crash_host: %s: %s\n", what, hotprobe_last_error());
    return 1;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s MECHANISM attach PID | spawn PROGRAM\n", argv[0]);
        return 2;
    }
    hotprobe_config cfg;
    hotprobe_config_default(&cfg);
    cfg.mechanism = (uint32_t)atoi(argv[1]);
    hotprobe_session *s = hotprobe_open(&cfg);
    if (!s)
        return fail("open");
    hotprobe_target t;
    if (strcmp(argv[2], "attach") == 0) {
        if (hotprobe_attach(s, atoi(argv[3]), &t) != HOTPROBE_OK)
            return fail("attach");
    } else {
        const char *const args[] = {NULL};
        int null = open("/dev/null", O_WRONLY);
        if (null < 0 || hotprobe_spawn_io(s, argv[3], args, -1, -1, null, &t) != HOTPROBE_OK)
            return fail("spawn");
        close(null);
    }
    hotprobe_probe p;
    if (hotprobe_register_probe(s, t, "work", pre, NULL, NULL, &p) != HOTPROBE_OK)
        return fail("probe");
    fprintf(stderr, "probed\n");
    int end = hotprobe_run(s);
    /* Not reached: the handler crashed the host. */
    fprintf(stderr, "run ended %d\n", end);
    hotprobe_close(s);
    return 0;
}
