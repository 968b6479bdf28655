#!/usr/bin/env python3
"""hotprobe from Python without handlers: count the calls of a function and
record its entries (argument) and exits (return value) while PROGRAM runs.

    count_and_record.py COUNT_SPEC RECORD_SPEC PROGRAM [ARGS...]

Prints the count per probe, then one line per recorded event.
"""
import sys

import hotprobe


def main(argv):
    if len(argv) < 4:
        print(__doc__, file=sys.stderr)
        return 2
    s = hotprobe.Session(record_args=1)
    t = s.spawn(argv[3:])
    counted = s.count(t, argv[1])
    recording = s.record(t, argv[2])
    s.run()
    sys.stdout.flush()
    for label, st in sorted(counted.by_label().items()):
        print(f"count {label} {st.hits}")
    print(f"total {counted.hits}")
    for ev in recording.events:
        if ev.kind == "entry":
            print(f"entry {ev.function} {ev.args[0]}")
        elif ev.kind == "exit":
            print(f"exit {ev.function} {ev.ret}")
    print(f"lost {recording.lost}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
