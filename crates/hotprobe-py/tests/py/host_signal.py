"""The host's own SIGRTMIN+6 handler survives a session (issue 21: library
code installs no process-wide signal handler; SIGRTMIN+6 is the signal the
target's timed waits used to take over):
    host_signal.py PROGRAM OUT_DIR
installs a handler of its own with signal.signal, runs a session with
mechanism "trap" then "auto" on two children (tests/programs/compute.c,
2000 calls of compute each) to their exit, and checks after each that the
handler is still its own, at the Python and the C level (sigaction), and
still runs on os.kill(os.getpid(), SIGRTMIN+6). Prints one line per check;
the Rust test compares them exactly."""
import ctypes
import os
import signal
import sys

import hotprobe

prog, out_dir = sys.argv[1], sys.argv[2]
SIG = signal.SIGRTMIN + 6


class Sigaction(ctypes.Structure):
    """glibc's struct sigaction on x86-64."""

    _fields_ = [
        ("handler", ctypes.c_void_p),
        ("mask", ctypes.c_ulong * 16),
        ("flags", ctypes.c_int),
        ("restorer", ctypes.c_void_p),
    ]


libc = ctypes.CDLL(None, use_errno=True)


def c_action():
    """(handler address, flags) installed for SIG at the C level now."""
    old = Sigaction()
    if libc.sigaction(SIG, None, ctypes.byref(old)) != 0:
        raise OSError(ctypes.get_errno(), "sigaction")
    return (old.handler, old.flags)


calls = []


def own(signum, frame):
    calls.append(signum)


signal.signal(SIG, own)
before = c_action()
print("installed:", signal.getsignal(SIG) is own, before[0] is not None)

for mechanism in ["trap", "auto"]:
    s = hotprobe.Session(mechanism=mechanism)
    targets, counts = [], []
    for i in range(2):
        with open(os.path.join(out_dir, f"out-{mechanism}-{i}"), "w") as out:
            t = s.spawn([prog, "2000"], stdout=out)
        targets.append(t)
        counts.append(s.count(t, "compute"))
    print(mechanism, "run:", s.run())
    print(mechanism, "hits:", [c.hits for c in counts])
    print(mechanism, "exit:", [s.exit_status(t) for t in targets])
    del s
    for i in range(2):
        with open(os.path.join(out_dir, f"out-{mechanism}-{i}")) as f:
            print(mechanism, "program:", f.read().strip())
    # The session ran no handler of ours, and left it in place.
    print(mechanism, "ran during the session:", len(calls))
    print(mechanism, "python handler kept:", signal.getsignal(SIG) is own)
    print(mechanism, "C handler kept:", c_action() == before)
    os.kill(os.getpid(), SIG)
    print(mechanism, "handler runs:", calls == [SIG])
    calls.clear()
