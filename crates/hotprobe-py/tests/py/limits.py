"""Refusals of the Python API on tests/programs/compute.c:
    limits.py PROGRAM
A Session used from another thread raises HotprobeError (not a Rust
panic); a read above 1 MiB raises ValueError (nothing allocated, the
interpreter lives on). Prints one line per check; the Rust test compares
them exactly."""
import os
import sys
import threading

import hotprobe

prog = sys.argv[1]
s = hotprobe.Session()
with open(os.devnull, "w") as null:
    t = s.spawn([prog, "3"], stdout=null)

seen = []


def other_thread():
    try:
        s.probe(t, "compute", pre=print)
        seen.append("thread: no error")
    except hotprobe.HotprobeError as e:
        seen.append(f"thread: HotprobeError: {e}")


th = threading.Thread(target=other_thread)
th.start()
th.join()
print(seen[0])

reads = []


def pre(ctx):
    if reads:
        return
    for what, read in [
        ("read", lambda n: ctx.read(ctx.rsp, n)),
        ("read_cstr", lambda n: ctx.read_cstr(ctx.rsp, n)),
    ]:
        try:
            read(1 << 40)
            reads.append(f"{what}: no error")
        except ValueError as e:
            reads.append(f"{what}: ValueError: {e}")
    reads.append(f"read 8: {len(ctx.read(ctx.rsp, 8))} bytes")


s.probe(t, "compute", pre=pre)
print("run:", s.run())
for r in reads:
    print(r)
print("exit:", s.exit_status(t))
