"""A conditional count from Python on tests/programs/sizes.c, which calls
take() 10 times with 0, 100, 300, 1000, 256, 257, -5, 4096, 1, 999:
    cond_count.py PROGRAM MECHANISM OUT_PATH
Prints one line per check; the Rust test compares them exactly."""
import sys

import hotprobe

prog, mechanism, out_path = sys.argv[1], sys.argv[2], sys.argv[3]

s = hotprobe.Session(mechanism=mechanism)
with open(out_path, "w") as out:
    t = s.spawn([prog], stdout=out)
big = s.count(t, "take", cond="arg0 > 256")
plain = s.count(t, "take")
print("types:", type(big).__name__, type(plain).__name__)
# Refused before anything is placed.
for spec, cond in [("take", "arg0 >"), ("take", "arg6 == 1"), ("take%return", "arg0 > 1")]:
    try:
        s.count(t, spec, cond=cond)
        print("refused: no error")
    except ValueError as e:
        print("refused:", e)
print("run:", s.run())
print("conditional:", big.hits, big.by_label(), big.cond, big.lost, len(big.probes))
print("unconditional:", plain.hits)
with open(out_path) as f:
    print("program:", f.read().strip())
