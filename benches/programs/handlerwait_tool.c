/* The tool of `hotprobe-bench handlerwait` (issue 22), on the C API:
 *   handlerwait_tool [--no-h] TARGET IDLE_MS N
 * spawns TARGET IDLE_MS N (benches/programs/handlerwait_target.c), puts a
 * pre handler on `h` (hotprobe_register_probe: the session picks the
 * cheapest mechanism; on `h`, 2 bytes, that is the in-process trap, its
 * handler calls served through shared memory) and a return probe on `t`
 * (hotprobe_register_retprobe: always the engine's ptrace trap, a stop at
 * the entry and one at the return), runs to the end and prints
 *   h_runs H
 *   t_returns R
 *   t_stats hits X returns Y nmissed Z
 *   target_exit KIND CODE    (hotprobe_exit_status: 1 and the exit code)
 * With --no-h, `h` is left unprobed (the reference: the ptrace-trap probe
 * alone, no shared-memory handler in the process). */
#include <hotprobe.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

static void count(hotprobe_ctx *ctx, void *user) {
    (void)ctx;
    ++*(uint64_t *)user;
}

int main(int argc, char **argv) {
    int with_h = 1;
    int i = 1;
    if (argc > 1 && strcmp(argv[1], "--no-h") == 0) {
        with_h = 0;
        i = 2;
    }
    if (argc - i != 3) {
        fprintf(stderr, "usage: handlerwait_tool [--no-h] TARGET IDLE_MS N\n");
        return 2;
    }
    const char *args[] = {argv[i + 1], argv[i + 2], NULL};
    uint64_t h_runs = 0, t_returns = 0;
    hotprobe_session *s = hotprobe_open(NULL);
    hotprobe_target tg;
    hotprobe_probe ph, pt;
    if (!s || hotprobe_spawn(s, argv[i], args, &tg) != HOTPROBE_OK
        || (with_h && hotprobe_register_probe(s, tg, "h", count, NULL, &h_runs, &ph) != HOTPROBE_OK)
        || hotprobe_register_retprobe(s, tg, "t", NULL, count, &t_returns, 1, &pt) != HOTPROBE_OK) {
        fprintf(stderr, "handlerwait_tool: %s\n", hotprobe_last_error());
        return 1;
    }
    int end = hotprobe_run(s);
    if (end != HOTPROBE_END_EXITED) {
        fprintf(stderr, "handlerwait_tool: run ended with %d: %s\n", end, hotprobe_last_error());
        return 1;
    }
    hotprobe_stats st;
    int code = -1;
    if (hotprobe_stats_of(s, pt, &st) != HOTPROBE_OK) {
        fprintf(stderr, "handlerwait_tool: %s\n", hotprobe_last_error());
        return 1;
    }
    int kind = hotprobe_exit_status(s, tg, &code);
    fflush(stdout);
    printf("h_runs %" PRIu64 "\n", h_runs);
    printf("t_returns %" PRIu64 "\n", t_returns);
    printf("t_stats hits %" PRIu64 " returns %" PRIu64 " nmissed %" PRIu64 "\n", st.hits,
           st.returns, st.nmissed);
    printf("target_exit %d %d\n", kind, code);
    hotprobe_close(s);
    return 0;
}
