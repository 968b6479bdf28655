"""Frida Interceptor with a CModule counter on one function of a program.
Usage: frida_count.py PROG FUNC_OFFSET ARGS...  (prints the program's output
and the counter)."""
import sys
import threading

import frida

prog, offset, args = sys.argv[1], int(sys.argv[2], 0), sys.argv[3:]
dev = frida.get_local_device()
done = threading.Event()
out = []


def on_output(pid, fd, data):
    if data:
        out.append(data.decode())


dev.on("output", on_output)
pid = dev.spawn([prog] + args, stdio="pipe")
session = dev.attach(pid)
session.on("detached", lambda *a: done.set())
script = session.create_script(
    """
const hits = Memory.alloc(8);
const cm = new CModule(`
#include <gum/guminterceptor.h>
extern volatile gint64 hits;
void onEnter(GumInvocationContext *ic) { hits++; }
`, { hits });
Interceptor.attach(Process.mainModule.base.add(%d), cm);
rpc.exports = { hits: () => hits.readU64().toString() };
"""
    % offset
)
script.load()
dev.resume(pid)
done.wait(600)
sys.stdout.write("".join(out))
