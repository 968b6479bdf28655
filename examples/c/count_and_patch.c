/* hotprobe from C: count the calls of a function and change what one call
 * returns.
 *
 *   count_and_patch FUNCTION ARG VALUE PROGRAM [ARGS...]
 *
 * Starts PROGRAM, puts a probe on FUNCTION's entry whose pre handler counts
 * the calls and sums their first argument, and a return probe whose return
 * handler makes the call whose first argument is ARG return VALUE. Prints
 * the counts once PROGRAM has exited.
 *
 * Build (from the build tree):
 *   cargo build -p hotprobe-capi
 *   gcc count_and_patch.c $(PKG_CONFIG_PATH=target/debug pkg-config --cflags --libs hotprobe)
 */
#include <hotprobe.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

struct state {
    uint64_t calls;    /* pre handler runs */
    uint64_t arg_sum;  /* sum of the first arguments */
    uint64_t patched;  /* returns changed */
    uint64_t arg, value;
};

static void on_entry(hotprobe_ctx *ctx, void *user) {
    struct state *st = user;
    uint64_t a;
    if (hotprobe_ctx_arg(ctx, 0, &a) == HOTPROBE_OK) {
        st->calls++;
        st->arg_sum += a;
    }
}

static void on_return(hotprobe_ctx *ctx, void *user) {
    struct state *st = user;
    uint64_t a;
    /* In a return handler the arguments are those of the call returning. */
    if (hotprobe_ctx_arg(ctx, 0, &a) == HOTPROBE_OK && a == st->arg) {
        hotprobe_ctx_set_reg(ctx, HOTPROBE_REG_RAX, st->value);
        st->patched++;
    }
}

static int fail(const char *what) {
    fprintf(stderr, "count_and_patch: %s: %s\n", what, hotprobe_last_error());
    return 1;
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: %s FUNCTION ARG VALUE PROGRAM [ARGS...]\n", argv[0]);
        return 2;
    }
    struct state st = {0};
    st.arg = strtoull(argv[2], NULL, 0);
    st.value = strtoull(argv[3], NULL, 0);

    hotprobe_session *s = hotprobe_open(NULL);
    if (!s)
        return fail("open");
    hotprobe_target t;
    /* argv[5..] are PROGRAM's arguments; argv[argc] is NULL. */
    if (hotprobe_spawn(s, argv[4], (const char *const *)&argv[5], &t) != HOTPROBE_OK)
        return fail("spawn");
    hotprobe_probe entry, ret;
    if (hotprobe_register_probe(s, t, argv[1], on_entry, NULL, &st, &entry) != HOTPROBE_OK)
        return fail("probe");
    if (hotprobe_register_retprobe(s, t, argv[1], NULL, on_return, &st, 16, &ret) != HOTPROBE_OK)
        return fail("retprobe");
    int end = hotprobe_run(s);
    if (end < 0)
        return fail("run");
    hotprobe_stats es, rs;
    if (hotprobe_stats_of(s, entry, &es) != HOTPROBE_OK || hotprobe_stats_of(s, ret, &rs) != HOTPROBE_OK)
        return fail("stats");
    int code = 0;
    int how = hotprobe_exit_status(s, t, &code);
    printf("calls %" PRIu64 " arg_sum %" PRIu64 " patched %" PRIu64 "\n", st.calls, st.arg_sum, st.patched);
    printf("probe hits %" PRIu64 " nmissed %" PRIu64 "\n", es.hits, es.nmissed);
    printf("retprobe hits %" PRIu64 " returns %" PRIu64 " nmissed %" PRIu64 "\n", rs.hits, rs.returns, rs.nmissed);
    printf("end %s exit %d\n", end == HOTPROBE_END_EXITED ? "exited" : "stopped", how == 1 ? code : -1);
    hotprobe_close(s);
    return 0;
}
