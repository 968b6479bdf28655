"""hotprobe: probes on any instruction of a running Linux process, with
handlers in Python.

    import hotprobe
    s = hotprobe.Session()
    t = s.spawn(["./prog", "10"])
    calls = s.probe(t, "compute", pre=lambda ctx: print("x =", ctx.rdi))
    def ret(ctx):
        ctx.rax = 5                      # what compute returns
    s.retprobe(t, "compute", ret=ret, maxactive=16)
    s.run()                               # until the program exits
    print(calls.stats.hits)

Handlers receive a Context: registers as attributes (ctx.rdi, ctx.rax = 5),
ctx.arg(n), ctx.read(addr, n), ctx.write(addr, data), ctx.stop(). The GIL is
taken for each hit; a handler's exception stops the run and is raised by
Session.run().

Session.count(t, spec) and Session.record(t, spec) place probes that run
without a handler (patch or jump where the fast path can, traps elsewhere):
their results are Count (.hits, .by_label()) and Recording (.events) objects.
Session.count(t, spec, cond="arg0 > 256") counts only the calls whose
arguments satisfy the condition (arg0 to arg5, signed, or the function's
parameters by name from its DWARF, cond="size > 256"; == != < <= > >=, &&,
||, !, parentheses): a ConditionalCount (.hits, .by_label(), .lost).
Session.record(t, spec, typed=True) records each call with its parameters
and return value typed from DWARF ("work", or "work(i, s)" for those): a
TypedRecording whose .calls are (function, "entry" | "return", tid, values).
read_trace(dir) reads a trace written by `hotprobe record` into rows, and
trace_frame(dir) into a pandas DataFrame.
"""

import threading
from collections import namedtuple

from . import _native
from ._native import (  # noqa: F401
    ConditionalCount,
    Context,
    Count,
    Event,
    HotprobeError,
    Probe,
    Recording,
    Stats,
    TypedRecording,
)
from ._native import read_trace as _read_trace

__all__ = [
    "ConditionalCount",
    "Context",
    "Count",
    "Event",
    "HotprobeError",
    "Probe",
    "Recording",
    "Session",
    "Stats",
    "TraceRow",
    "TypedRecording",
    "read_trace",
    "trace_frame",
]

class Session:
    """A probing session: targets, probes, the event loop (see the module's
    documentation). It belongs to the thread that made it (ptrace ties a
    traced process to the thread that attached it): used from another
    thread, it raises HotprobeError."""

    __slots__ = ("_native", "_owner")

    def __init__(self, *args, **kwargs):
        object.__setattr__(self, "_owner", threading.get_ident())
        object.__setattr__(self, "_native", _native.Session(*args, **kwargs))

    def __getattr__(self, name):
        if threading.get_ident() != self._owner:
            raise HotprobeError(
                "a Session is used from the thread that made it only "
                "(ptrace ties the targets to that thread)"
            )
        return getattr(self._native, name)

    def __setattr__(self, name, value):
        raise AttributeError(f"Session has no settable attribute {name!r}")


TraceRow = namedtuple(
    "TraceRow", ["tid", "kind", "function", "ts_ns", "dur_ns", "args", "ret", "lost"]
)
TraceRow.__doc__ = """One record of a trace: kind is "call" (an entry and its exit,
with dur_ns), "entry", "exit", "hit" or "lost" (lost events, counted in lost).
A typed probe's args and ret are its values (int, float, bool, str, None for
a null pointer or a value not available); other probes' are the raw
registers, as ints. Times leave the probes' calibrated costs out where the
trace has them, as `hotprobe report` does."""


def read_trace(path):
    """The records of the trace directory `path` (written by `hotprobe
    record`) as TraceRow tuples: threads one after the other, each in time
    order."""
    return [TraceRow(*r) for r in _read_trace(str(path))]


def trace_frame(path):
    """The records of a trace as a pandas DataFrame (one row per record,
    the TraceRow columns). Needs pandas."""
    try:
        import pandas
    except ImportError as e:
        raise ImportError("trace_frame needs pandas: pip install pandas") from e
    return pandas.DataFrame(read_trace(path), columns=TraceRow._fields)
