"""Checks of the Python API on tests/programs/compute.c (built -no-pie):
    api_checks.py PROGRAM LAST_ADDR OUT_PATH
Prints one line per check; the Rust test compares them exactly."""
import sys

import hotprobe

prog, last_addr, out_path = sys.argv[1], int(sys.argv[2], 0), sys.argv[3]

# A missing function: HotprobeError naming it.
s = hotprobe.Session()
with open(out_path, "w") as out:
    t = s.spawn([prog, "10"], stdout=out)
try:
    s.probe(t, "no_such_function", pre=print)
    print("missing: no error")
except hotprobe.HotprobeError as e:
    print("missing:", "no_such_function" in str(e))
try:
    s.probe(t, "compute", pre=42)
except ValueError as e:
    print("not callable:", e)

seen = []
lasts = []
kept = []


def pre(ctx):
    seen.append(ctx.rdi)
    kept.append(ctx)
    if ctx.kind != "pre" or ctx.arg(0) != ctx.rdi:
        raise AssertionError("pre context")
    if len(seen) == 4:
        ctx.stop()


def ret(ctx):
    # compute(x) set last = x and returns x*x.
    last = int.from_bytes(ctx.read(last_addr, 8), "little")
    assert ctx.read_u64(last_addr) == last
    assert ctx.rax == last * last == ctx.return_value
    assert ctx.regs()["rax"] == ctx.rax
    lasts.append(last)
    if last == 9:
        ctx.write(last_addr, (4242).to_bytes(8, "little"))
        ctx.rax = 0


p = s.probe(t, "compute", pre=pre)
r = s.retprobe(t, "compute", ret=ret, maxactive=8)
print("mechanisms:", p.mechanism, r.mechanism)
print("run:", s.run())
print("seen:", seen, "lasts:", lasts)
try:
    kept[0].rdi
except RuntimeError as e:
    print("stale context:", e)
# The session cannot be changed from one of its handlers.
nested = []


def nested_call(ctx):
    try:
        s.probe(t, "compute")
    except RuntimeError as e:
        nested.append(str(e))


s.probe(t, "twice", pre=nested_call)
p.disable()
print("run:", s.run())
print("seen:", seen, "lasts:", lasts)
print("nested:", nested)
print("stats:", p.stats, r.stats)
print("exit:", s.exit_status(t))
print("out:", open(out_path).read().strip())

# A handler's exception stops the run and comes out of run().
s = hotprobe.Session()
t = s.spawn([prog, "10"], stdout=open(out_path, "w"))


def bad(ctx):
    if ctx.rdi == 3:
        raise KeyError("boom at 3")


s.probe(t, "compute", pre=bad)
try:
    s.run()
    print("raised: no")
except KeyError as e:
    print("raised:", e)
# Session.stop() from a handler; then the rest of the run.
hits = []
s2 = hotprobe.Session()
t2 = s2.spawn([prog, "6"], stdout=open(out_path, "w"))


def stopper(ctx):
    hits.append(ctx.rdi)
    if ctx.rdi == 2:
        s2.stop()


q = s2.probe(t2, "compute", pre=stopper)
print("stop:", s2.run(), hits)
print("rest:", s2.run(), hits, q.hits)
try:
    hotprobe.Session(mechanism="teleport")
except ValueError as e:
    print("bad mechanism:", e)
