#!/usr/bin/env python3
"""hotprobe from Python: count the calls of a function and change what one
call returns (the Python twin of examples/c/count_and_patch.c).

    count_and_patch.py FUNCTION ARG VALUE PROGRAM [ARGS...]

Starts PROGRAM with a probe on FUNCTION's entry whose pre handler counts
the calls and sums their first argument, and a return probe whose return
handler makes the call whose first argument is ARG return VALUE; prints the
counts once PROGRAM has exited.
"""
import sys

import hotprobe


def main(argv):
    if len(argv) < 5:
        print(__doc__, file=sys.stderr)
        return 2
    func, arg, value, cmd = argv[1], int(argv[2], 0), int(argv[3], 0), argv[4:]
    state = {"calls": 0, "arg_sum": 0, "patched": 0}

    def on_entry(ctx):
        state["calls"] += 1
        state["arg_sum"] += ctx.rdi

    def on_return(ctx):
        # In a return handler the arguments are those of the call returning.
        if ctx.arg(0) == arg:
            ctx.rax = value
            state["patched"] += 1

    s = hotprobe.Session()
    t = s.spawn(cmd)
    try:
        entry = s.probe(t, func, pre=on_entry)
        ret = s.retprobe(t, func, ret=on_return, maxactive=16)
    except hotprobe.HotprobeError as e:
        print(f"count_and_patch.py: {e}", file=sys.stderr)
        return 1
    end = s.run()
    es, rs = entry.stats, ret.stats
    sys.stdout.flush()
    print(f"calls {state['calls']} arg_sum {state['arg_sum']} patched {state['patched']}")
    print(f"probe hits {es.hits} nmissed {es.nmissed}")
    print(f"retprobe hits {rs.hits} returns {rs.returns} nmissed {rs.nmissed}")
    status = s.exit_status(t)
    print(f"end {end} exit {status[1] if status and status[0] == 'exited' else -1}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
