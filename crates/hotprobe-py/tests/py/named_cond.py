"""Conditional counts naming parameters from Python, on
tests/programs/params.c, which calls put(int key, unsigned size) 8 times
with keys 1, -2, 3, -4, 5, 6, -7, 8 and sizes 100, 300, 4096, 0, 257, 256,
1000, 4000000000:
    named_cond.py PROGRAM MECHANISM OUT_PATH
Prints one line per check; the Rust test compares them exactly."""
import sys

import hotprobe

prog, mechanism, out_path = sys.argv[1], sys.argv[2], sys.argv[3]

s = hotprobe.Session(mechanism=mechanism)
with open(out_path, "w") as out:
    t = s.spawn([prog], stdout=out)
negative = s.count(t, "put", cond="key < 0")
big = s.count(t, "put", cond="size > 256")
both = s.count(t, "put", cond="size > 256 && key > 0")
mixed = s.count(t, "put", cond="key == 3 || arg1 == 0")
# Refused, and nothing left placed.
for cond in ["nosuch > 1", "key > 1 &&"]:
    try:
        s.count(t, "put", cond=cond)
        print("refused: no error")
    except ValueError as e:
        print("refused:", e)
print("run:", s.run())
for name, c in [("key < 0", negative), ("size > 256", big), ("both", both), ("mixed", mixed)]:
    print(name + ":", c.hits, c.by_label(), c.lost)
with open(out_path) as f:
    print("program:", f.read().strip())
