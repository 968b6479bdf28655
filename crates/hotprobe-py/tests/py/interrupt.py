"""Ctrl-C during Session.run(): KeyboardInterrupt, counts still readable,
detach lets the program run on.
    interrupt.py PROGRAM   prints "pid N", then waits for SIGINT"""
import os
import sys

import hotprobe

s = hotprobe.Session()
t = s.spawn([sys.argv[1], "1000000000000"], stdout=open(os.devnull, "w"))
c = s.count(t, "compute")
print("pid", s.pid(t), flush=True)
try:
    s.run()
    print("run ended")
except KeyboardInterrupt as e:
    print("interrupted:", e)
print("counted:", c.hits > 0)
s.detach()
print("detached, exit status:", s.exit_status(t))
