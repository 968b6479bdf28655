"""Conditional counts naming a parameter on a library the program loads
later: the CLI tests' dlopen_twice.c calls libtest.c's libfn(x) for
x = 0, 1, 2, unloads the library, loads it again and calls libfn(x) for
x = 0 .. 3:
    pending_cond.py PROGRAM LIBRARY MECHANISM OUT_PATH
Prints one line per check; the Rust test compares them exactly."""
import sys

import hotprobe

prog, lib, mechanism, out_path = sys.argv[1:5]

s = hotprobe.Session(mechanism=mechanism)
with open(out_path, "w") as out:
    t = s.spawn([prog, lib], stdout=out)
some = s.count(t, "libtest.so:libfn", cond="x >= 1")
nosuch = s.count(t, "libtest.so:libfn", cond="size >= 1")
print("placed:", [p.mechanism for p in some.probes + nosuch.probes])
print("run:", s.run())
print("x >= 1:", some.hits, some.by_label())
try:
    print("size >= 1:", nosuch.hits)
except ValueError as e:
    print("size >= 1:", str(e).split(": ", 1)[1])
with open(out_path) as f:
    print("program:", f.read().strip().replace("\n", "; "))
