"""A small OTLP/HTTP receiver for the tests: a real HTTP server on a free loopback port that takes
`POST /v1/traces` and `POST /v1/metrics`, decodes the protobuf bodies with the opentelemetry-proto classes
(which the OTLP exporter package depends on) and keeps what it got for the test to read.

It runs on its own thread (`with otlp_receiver() as receiver:`, `receiver.endpoint` is the base URL a
coordinator's `--otlp-endpoint` takes) and is shut down, its port closed, when the block ends.
"""

from __future__ import annotations

import gzip
import threading
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class ReceivedSpan:
    name: str
    trace_id: str  # hex
    span_id: str
    parent_span_id: str  # "" for a root span
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    status_code: int  # 0 unset, 1 ok, 2 error
    status_message: str
    resource: dict[str, Any]

    @property
    def duration_s(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9


@dataclass(frozen=True)
class ReceivedPoint:
    metric: str
    kind: str  # "sum" or "gauge"
    value: float
    attributes: dict[str, Any]
    monotonic: bool


def _value(any_value: Any) -> Any:
    kind = any_value.WhichOneof("value")
    return getattr(any_value, kind) if kind else None


def _attributes(key_values: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in key_values}


class OtlpReceiver:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._spans: list[ReceivedSpan] = []
        self._points: list[ReceivedPoint] = []
        self.requests = 0
        self.bad_requests: list[str] = []  # what it could not decode: a test fails on any
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the name http.server calls
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                encoding = self.headers.get("Content-Encoding", "")
                if encoding == "gzip":
                    body = gzip.decompress(body)
                elif encoding == "deflate":
                    body = zlib.decompress(body)
                try:
                    answer = receiver._take(self.path, body, self.headers.get("Content-Type", ""))
                except Exception as exc:  # noqa: BLE001 - a body that does not decode is the test's finding
                    with receiver._lock:
                        receiver.bad_requests.append(f"{self.path}: {type(exc).__name__}: {exc}")
                    self.send_response(400)
                    self.end_headers()
                    return
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="otlp-receiver", daemon=True)

    def _take(self, path: str, body: bytes, content_type: str) -> bytes:
        from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

        if not content_type.startswith("application/x-protobuf"):
            raise ValueError(f"content type {content_type!r}, not application/x-protobuf")
        if path == "/v1/traces":
            traces = trace_service_pb2.ExportTraceServiceRequest.FromString(body)
            spans = [ReceivedSpan(s.name, s.trace_id.hex(), s.span_id.hex(), s.parent_span_id.hex(),
                                  s.start_time_unix_nano, s.end_time_unix_nano, _attributes(s.attributes),
                                  s.status.code, s.status.message, _attributes(rs.resource.attributes))
                     for rs in traces.resource_spans for ss in rs.scope_spans for s in ss.spans]
            with self._lock:
                self._spans += spans
                self.requests += 1
            return trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
        if path == "/v1/metrics":
            metrics = metrics_service_pb2.ExportMetricsServiceRequest.FromString(body)
            points = []
            for rm in metrics.resource_metrics:
                for sm in rm.scope_metrics:
                    for m in sm.metrics:
                        kind = m.WhichOneof("data")
                        if kind not in ("sum", "gauge"):
                            continue
                        data = getattr(m, kind)
                        for dp in data.data_points:
                            value = dp.as_double if dp.WhichOneof("value") == "as_double" else dp.as_int
                            points.append(ReceivedPoint(m.name, kind, float(value), _attributes(dp.attributes),
                                                        bool(getattr(data, "is_monotonic", False))))
            with self._lock:
                self._points += points
                self.requests += 1
            return metrics_service_pb2.ExportMetricsServiceResponse().SerializeToString()
        raise ValueError(f"no OTLP signal at {path}")

    def spans(self) -> list[ReceivedSpan]:
        with self._lock:
            return list(self._spans)

    def points(self) -> list[ReceivedPoint]:
        with self._lock:
            return list(self._points)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)


@contextmanager
def otlp_receiver() -> Iterator[OtlpReceiver]:
    receiver = OtlpReceiver()
    receiver.start()
    try:
        yield receiver
    finally:
        receiver.stop()
