"""The Python handler of the handler benchmark: a pre probe on FUNCTION of
PROGRAM whose Python handler counts hits.
    py_handler.py FUNCTION PROGRAM [ARGS...]   prints "hits N" after PROGRAM's output"""
import sys

import hotprobe

n = 0


def count(ctx):
    global n
    n += 1


s = hotprobe.Session()
t = s.spawn(sys.argv[2:])
s.probe(t, sys.argv[1], pre=count)
s.run()
sys.stdout.flush()
print(f"hits {n}")
