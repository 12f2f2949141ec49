"""The two ends of tests/suite/traces.rs, with the OpenTelemetry project's own packages.

    python traces.py receive DIR
        An OTLP/HTTP receiver on 127.0.0.1 (its port printed on the first line): every
        POST body is decoded strictly into the official ExportTraceServiceRequest (PyPI
        `opentelemetry-proto`; OTLP/JSON's hex trace and span ids turned into the
        protobuf JSON mapping's base64 first, unknown fields refused). Each span goes to
        DIR/spans.jsonl, each raw body to DIR/bodies.jsonl, and a body that does not decode
        is answered 400 and written to DIR/errors.txt.

    python traces.py call URL MARKER [CODE]
        The official MCP SDK's Client (default mode: 2026-07-28 over HTTP), with
        `opentelemetry-sdk` as the tracer provider, so the SDK's own client span puts its
        `traceparent` into the request's `_meta`; one execute_code of CODE (default: a
        print of MARKER). Prints
        one JSON line: the client's trace id and the id of the SDK's span (the parent the
        server must continue), and the call's text.

    python traces.py legacy URL MARKER
        As `call`, in the SDK's legacy mode (2025-11-25 over a protocol session).

    python traces.py forward URL_A URL_B MARKER
        An execute_python session opened on replica A (a cell setting `m = MARKER`), then,
        traced as `call` is, a cell printing `m` sent to replica B with that session_id:
        B forwards it to A. The same JSON line, of the second call.
"""

import asyncio
import base64
import json
import os
import re
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

HEX = re.compile(r"^[0-9a-fA-F]*$")


def receive(out_dir):
    from google.protobuf import json_format
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    lock = threading.Lock()

    def to_b64(value):
        if not isinstance(value, str) or not HEX.match(value) or len(value) % 2:
            raise ValueError(f"not a hex id: {value!r}")
        return base64.b64encode(bytes.fromhex(value)).decode()

    def decode(body):
        doc = json.loads(body)
        for rs in doc.get("resourceSpans", []):
            for ss in rs.get("scopeSpans", []):
                for sp in ss.get("spans", []):
                    for k in ("traceId", "spanId", "parentSpanId"):
                        if k in sp:
                            sp[k] = to_b64(sp[k])
        req = ExportTraceServiceRequest()
        json_format.ParseDict(doc, req, ignore_unknown_fields=False)
        return req

    def value_of(v):
        kind = v.WhichOneof("value")
        return getattr(v, kind) if kind else None

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            try:
                if self.path != "/v1/traces":
                    raise ValueError(f"POST to {self.path}")
                if self.headers.get("Content-Type") != "application/json":
                    raise ValueError(f"content type {self.headers.get('Content-Type')}")
                req = decode(body)
            except Exception as e:  # every malformed export fails the test
                with lock, open(os.path.join(out_dir, "errors.txt"), "a") as f:
                    f.write(f"{type(e).__name__}: {e}\n")
                self.send_response(400)
                self.end_headers()
                return
            lines = []
            for rs in req.resource_spans:
                service = {a.key: value_of(a.value) for a in rs.resource.attributes}
                for ss in rs.scope_spans:
                    for sp in ss.spans:
                        lines.append(json.dumps({
                            "service": service.get("service.name"),
                            "trace_id": sp.trace_id.hex(),
                            "span_id": sp.span_id.hex(),
                            "parent_span_id": sp.parent_span_id.hex(),
                            "name": sp.name,
                            "kind": int(sp.kind),
                            "start": sp.start_time_unix_nano,
                            "end": sp.end_time_unix_nano,
                            "status": int(sp.status.code),
                            "attributes": {a.key: value_of(a.value) for a in sp.attributes},
                        }))
            with lock:
                with open(os.path.join(out_dir, "spans.jsonl"), "a") as f:
                    f.write("".join(line + "\n" for line in lines))
                with open(os.path.join(out_dir, "bodies.jsonl"), "ab") as f:
                    f.write(body + b"\n")
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    print(server.server_address[1], flush=True)
    server.serve_forever()


def tracing():
    """opentelemetry-sdk as the tracer provider, its spans kept in memory."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    trace.set_tracer_provider(provider)
    return spans, trace.get_tracer("traces-test")


async def traced(spans, tracer, client, tool, args):
    """Call `tool` in a span of the test's own; the JSON line that describes it."""
    with tracer.start_as_current_span("the test's request") as mine:
        result = await client.call_tool(tool, args)
        trace_id = format(mine.get_span_context().trace_id, "032x")
    sends = [s for s in spans.get_finished_spans()
             if s.name.startswith("MCP send tools/call")
             and format(s.context.trace_id, "032x") == trace_id]
    if len(sends) != 1:
        raise SystemExit(f"expected one SDK span of the call, got {[s.name for s in spans.get_finished_spans()]}")
    return {
        "trace_id": trace_id,
        "parent_span_id": format(sends[0].context.span_id, "016x"),
        "version": client.protocol_version,
        "text": "".join(getattr(c, "text", "") for c in result.content),
    }


async def call(url, marker, code=None, mode="auto"):
    spans, tracer = tracing()
    from mcp.client.client import Client

    async with Client(url, mode=mode) as client:
        line = await traced(spans, tracer, client, "execute_code",
                            {"code": code or f"print('{marker}')"})
    print(json.dumps(line), flush=True)


async def forward(url_a, url_b, marker):
    spans, tracer = tracing()
    from mcp.client.client import Client

    async with Client(url_a) as a:
        r = await a.call_tool("execute_python", {"code": f"m = '{marker}'"})
        sid = r.structured_content["session_id"]
    async with Client(url_b) as b:
        line = await traced(spans, tracer, b, "execute_python",
                            {"code": "print(m)", "session_id": sid})
    print(json.dumps(line), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "receive":
        receive(sys.argv[2])
    elif sys.argv[1] == "call":
        asyncio.run(call(*sys.argv[2:5]))
    elif sys.argv[1] == "legacy":
        asyncio.run(call(*sys.argv[2:4], mode="legacy"))
    elif sys.argv[1] == "forward":
        asyncio.run(forward(*sys.argv[2:5]))
    else:
        raise SystemExit(f"unknown command {sys.argv[1]}")
