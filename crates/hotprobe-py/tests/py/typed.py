"""A typed capture from Python on crates/hotprobe-capi/tests/programs/typed.c,
whose work(int, double, const char *) logs "work I D S = R" per call:
    typed.py PROGRAM MECHANISM OUT_PATH
Prints one line per check; the Rust test compares them with what the
program logged."""
import sys

import hotprobe

prog, mechanism, out_path = sys.argv[1], sys.argv[2], sys.argv[3]

s = hotprobe.Session(mechanism=mechanism)
with open(out_path, "w") as out:
    t = s.spawn([prog], stdout=out)
every = s.record(t, "work", typed=True)
# A second typed capture of the function: on the trap it joins the first;
# where the first copies its values in the target (a recording jump), it
# is refused with the reason (two return hooks on one frame lost exits).
try:
    named = s.record(t, "work(s, i)", typed=True)
except hotprobe.HotprobeError as e:
    named = None
    print("second: refused:", "needs the trap" in str(e))
print("types:", type(every).__name__, type(named).__name__)
# Refused before anything is placed.
for spec in ["work(nosuch)", "work%return"]:
    try:
        s.record(t, spec, typed=True)
        print("refused: no error")
    except ValueError as e:
        print("refused:", str(e).split(";")[0])
print("run:", s.run())
for rec in (r for r in (every, named) if r is not None):
    for function, kind, tid, values in rec.calls:
        print(function, kind, tid > 0, " ".join(values))
print("untyped:", every.untyped)
