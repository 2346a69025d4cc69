"""The Prometheus /metrics listener every process serves, and the netstack's own metrics.

It lives in netstack because it is a socket: the coordinator and the worker
both serve it, and neither should import the other's code to do so.

A small HTTP/1.1 server on the process's event loop rather than
prometheus_client's thread-per-connection server, which kept every idle
connection (and a thread) forever: a thousand of them used up the process's
open files and with them its RPC port. Here connections are admitted
through an `Admission` of their own (an idle connection gives way to a new
one; see netstack/limits.py), a connection that does not send a complete
request head within `idle_timeout_s` is closed, and keep-alive connections
are closed after the same idle time between requests. Collecting runs in a
worker thread, one scrape at a time, so a slow collector or a scrape storm
never stalls the loop the RPC and data links run on.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from netstack.limits import SHED, Admission
from netstack.transport import LINK_TIMEOUTS, PROTOCOL_FAILURES

log = logging.getLogger("sluice.metrics")

MAX_HEAD_BYTES = 8 * 1024


@dataclass(frozen=True)
class MetricsLimits:
    max_connections: int = 64
    max_idle: int = 32  # connections without a request under way; the oldest gives way to a new one
    idle_timeout_s: float = 10.0


class MetricsServer:
    """Serves `registry` on GET (any path but /favicon.ico, as prometheus_client did)."""

    def __init__(self, registry: CollectorRegistry, limits: MetricsLimits) -> None:
        self.registry = registry
        self.limits = limits
        self.admission: Admission[asyncio.StreamWriter] = Admission(limits.max_connections, limits.max_idle)
        self._collect_lock = asyncio.Lock()
        self._server: asyncio.Server | None = None
        self._warned_at = -1e9
        self.port = 0

    async def start(self, host: str, port: int) -> int:
        self._server = await asyncio.start_server(self._serve, host, port, limit=MAX_HEAD_BYTES, backlog=1024)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self.port

    def close(self) -> None:
        if self._server is not None:
            self._server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        admitted, evicted = self.admission.admit(writer)
        for old in evicted:
            SHED["evicted"] += 1
            old.transport.abort()
        if not admitted:
            SHED["refused"] += 1
            writer.transport.abort()
        if (evicted or not admitted) and time.monotonic() - self._warned_at > 10.0:
            self._warned_at = time.monotonic()
            stats = self.admission.statistics()
            log.warning("metrics listener shedding connections: %d idle, %d busy; %d evicted, %d refused so far",
                        stats.pending, stats.active, stats.evicted, stats.refused)
        if not admitted:
            return
        try:
            while await self._one_request(reader, writer):
                self.admission.idle(writer)
        except (ConnectionError, TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass  # the peer went away, sent too much, or sat idle: nothing to tell anyone
        except Exception as exc:  # never a traceback for one connection; the listener keeps serving
            log.warning("metrics request failed: %s: %s", type(exc).__name__, exc)
        finally:
            self.admission.release(writer)
            writer.transport.abort()

    async def _one_request(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """Serve one request; True to wait for another on this connection."""
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), self.limits.idle_timeout_s)
        self.admission.activate(writer)
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        headers = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if sep:
                headers[name.strip().lower()] = value.strip().lower()
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            await self._respond(writer, 400, b"bad request\n", "text/plain", keep_alive=False)
            return False
        method, path, version = parts
        keep_alive = headers.get("connection") != "close" if version == "HTTP/1.1" else \
            headers.get("connection") == "keep-alive"
        if headers.get("content-length", "0") != "0" or "transfer-encoding" in headers:
            await self._respond(writer, 400, b"no request bodies here\n", "text/plain", keep_alive=False)
            return False
        if method not in ("GET", "HEAD"):
            await self._respond(writer, 405, b"method not allowed\n", "text/plain", keep_alive=False)
            return False
        if path.split("?", 1)[0] == "/favicon.ico":
            await self._respond(writer, 404, b"", "text/plain", keep_alive=keep_alive)
            return keep_alive
        async with self._collect_lock:
            body = await asyncio.to_thread(generate_latest, self.registry)
        await self._respond(writer, 200, b"" if method == "HEAD" else body, CONTENT_TYPE_LATEST,
                            keep_alive=keep_alive, length=len(body))
        return keep_alive

    async def _respond(self, writer: asyncio.StreamWriter, status: int, body: bytes, content_type: str, *,
                       keep_alive: bool, length: int | None = None) -> None:
        reason = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed"}[status]
        head = (f"HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\n"
                f"Content-Length: {len(body) if length is None else length}\r\n"
                f"Connection: {'keep-alive' if keep_alive else 'close'}\r\n\r\n")
        writer.write(head.encode("latin-1") + body)
        # a reader that never reads must not hold the connection (and its buffer) forever
        await asyncio.wait_for(writer.drain(), self.limits.idle_timeout_s)


class _NetstackCollector(Collector):
    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily("sluice_connections_shed", "Connections a listener closed to stay within its "
                                     "limits: 'evicted' (waiting for a handshake or request, made room for a newer "
                                     "one) or 'refused' (the listener was full of active connections)",
                                     labels=["reason"])
        for reason in ("evicted", "refused"):
            family.add_metric([reason], SHED[reason])
        yield family


async def serve_metrics(registry: CollectorRegistry, host: str, port: int,
                        limits: MetricsLimits | None = None) -> MetricsServer:
    """Serve /metrics on the running loop; the server's `port` is the bound one (port 0 picks one)."""
    registry.register(_NetstackCollector())
    server = MetricsServer(registry, limits or MetricsLimits())
    await server.start(host, port)
    return server


def protocol_failures() -> Metric:
    family = CounterMetricFamily("sluice_connections_refused", "Connections closed because the peer broke the "
                                 "protocol (bad frame, wrong token, data without credit...)", labels=["reason"])
    for reason, n in sorted(PROTOCOL_FAILURES.items()):
        family.add_metric([reason], n)
    return family


def link_timeouts() -> Metric:
    family = CounterMetricFamily("sluice_link_timeouts", "Links closed because the peer stayed silent for the "
                                 "link timeout (a cut network path), by the peer's role", labels=["peer_role"])
    for role, n in sorted(LINK_TIMEOUTS.items()):
        family.add_metric([role], n)
    return family
