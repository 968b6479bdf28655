/* The C handler of the handler benchmark: a pre probe on FUNCTION of
 * PROGRAM whose C handler counts hits through the C API.
 *   c_handler FUNCTION PROGRAM [ARGS...]   prints "hits N" after PROGRAM's output */
#include <hotprobe.h>
#include <inttypes.h>
#include <stdio.h>

static void count(hotprobe_ctx *ctx, void *user) {
    (void)ctx;
    ++*(uint64_t *)user;
}

int main(int argc, char **argv) {
    if (argc < 3)
        return 2;
    uint64_t n = 0;
    hotprobe_session *s = hotprobe_open(NULL);
    hotprobe_target t;
    hotprobe_probe p;
    if (!s || hotprobe_spawn(s, argv[2], (const char *const *)&argv[3], &t) != HOTPROBE_OK
        || hotprobe_register_probe(s, t, argv[1], count, NULL, &n, &p) != HOTPROBE_OK
        || hotprobe_run(s) < 0) {
        fprintf(stderr, "c_handler: %s\n", hotprobe_last_error());
        return 1;
    }
    fflush(stdout);
    printf("hits %" PRIu64 "\n", n);
    hotprobe_close(s);
    return 0;
}
