#!/usr/bin/env python3
"""A tiny OTLP/HTTP receiver for hotprobe's tests.

Usage: otlp_receiver.py OUT.jsonl

Listens on 127.0.0.1 (a free port, printed as "PORT <n>" on stdout once
listening), decodes every POST to /v1/traces and /v1/metrics with the
opentelemetry-proto package (protobuf bodies) and appends what it decoded
to OUT.jsonl, one JSON object per span or metric data point, before it
answers 200. A body that does not decode is answered 400 and logged as
{"signal": "error"}. Runs until killed (the test kills it), or 120 s.
"""
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2


def value(v):
    kind = v.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [value(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: value(kv.value) for kv in v.kvlist_value.values}
    if kind == "bytes_value":
        return v.bytes_value.hex()
    return getattr(v, kind)


def attrs(kvs):
    return {kv.key: value(kv.value) for kv in kvs}


class Handler(BaseHTTPRequestHandler):
    out = None
    lock = threading.Lock()

    def log_message(self, *args):
        pass

    def write(self, objs):
        with self.lock, open(self.out, "a") as f:
            for o in objs:
                f.write(json.dumps(o) + "\n")

    def answer(self, code, body=b"", ctype="application/x-protobuf"):
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        n = int(self.headers.get("Content-Length", "0"))
        body = self.rfile.read(n)
        try:
            if self.path == "/v1/traces":
                req = trace_service_pb2.ExportTraceServiceRequest.FromString(body)
                objs = []
                for rs in req.resource_spans:
                    res = attrs(rs.resource.attributes)
                    for ss in rs.scope_spans:
                        for s in ss.spans:
                            objs.append({
                                "signal": "span",
                                "resource": res,
                                "scope": ss.scope.name,
                                "trace_id": s.trace_id.hex(),
                                "span_id": s.span_id.hex(),
                                "parent_span_id": s.parent_span_id.hex(),
                                "name": s.name,
                                "kind": s.kind,
                                "start": s.start_time_unix_nano,
                                "end": s.end_time_unix_nano,
                                "attributes": attrs(s.attributes),
                            })
                self.write(objs)
                resp = trace_service_pb2.ExportTraceServiceResponse()
            elif self.path == "/v1/metrics":
                req = metrics_service_pb2.ExportMetricsServiceRequest.FromString(body)
                objs = []
                for rm in req.resource_metrics:
                    res = attrs(rm.resource.attributes)
                    for sm in rm.scope_metrics:
                        for m in sm.metrics:
                            data = m.WhichOneof("data")
                            for p in getattr(m, data).data_points:
                                objs.append({
                                    "signal": "metric",
                                    "resource": res,
                                    "name": m.name,
                                    "unit": m.unit,
                                    "type": data,
                                    "monotonic": getattr(getattr(m, data), "is_monotonic", None),
                                    "temporality": getattr(getattr(m, data), "aggregation_temporality", None),
                                    "value": getattr(p, p.WhichOneof("value")),
                                    "start": p.start_time_unix_nano,
                                    "time": p.time_unix_nano,
                                    "attributes": attrs(p.attributes),
                                })
                self.write(objs)
                resp = metrics_service_pb2.ExportMetricsServiceResponse()
            else:
                self.answer(404, b"unknown path", "text/plain")
                return
        except Exception as e:  # a body that does not decode
            self.write([{"signal": "error", "path": self.path, "error": str(e)}])
            self.answer(400, str(e).encode(), "text/plain")
            return
        self.answer(200, resp.SerializeToString())


def main():
    Handler.out = sys.argv[1]
    srv = HTTPServer(("127.0.0.1", 0), Handler)
    print("PORT", srv.server_address[1], flush=True)
    stop = threading.Timer(120, lambda: threading.Thread(target=srv.shutdown).start())
    stop.daemon = True
    stop.start()
    srv.serve_forever()


if __name__ == "__main__":
    main()
