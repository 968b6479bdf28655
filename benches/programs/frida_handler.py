"""Frida's peer of the handler benchmark: Interceptor.attach on FUNCTION of
PROGRAM with a JS onEnter handler counting hits.
    frida_handler.py FUNCTION PROGRAM [ARGS...]   prints "hits N" after PROGRAM's output
PROGRAM's stdout is this process's (frida spawns with stdio inherited)."""
import sys
import threading

import frida

func, argv = sys.argv[1], sys.argv[2:]
JS = """
let n = 0;
const f = DebugSymbol.getFunctionByName(%r);
Interceptor.attach(f, { onEnter() { n++; } });
// At exit, hand the count over and wait for the answer before dying.
const ex = Process.getModuleByName('libc.so.6').getExportByName('exit');
Interceptor.attach(ex, { onEnter() { send(n); recv('ack', () => {}).wait(); } });
""" % func
done = threading.Event()
hits = []
pid = frida.spawn(argv)
session = frida.attach(pid)
script = session.create_script(JS)


def on_message(msg, data):
    if msg["type"] == "send":
        hits.append(msg["payload"])
        script.post({"type": "ack"})
        done.set()
    elif msg["type"] == "error":
        print(msg, file=sys.stderr)
        done.set()


script.on("message", on_message)
script.load()
frida.resume(pid)
done.wait(600)
try:
    session.detach()
except Exception:
    pass
sys.stdout.flush()
print(f"hits {hits[0] if hits else -1}")
