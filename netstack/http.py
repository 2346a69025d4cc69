"""A small HTTP/1.1 server on the process's event loop: the one place HTTP meets a socket.

Both HTTP listeners use it: every process's Prometheus /metrics
(netstack/metrics_http.py) and the coordinator's REST API and web UI
(coordinator/rest.py). They differ only in the handler they pass, an
`async (HttpRequest) -> HttpResponse`, and in their `HttpLimits`.

Why not prometheus_client's or http.server's thread-per-connection servers:
they kept every idle connection (and a thread) forever, and a thousand of
them used up the process's open files and with them its RPC port. Here
connections are admitted through an `Admission` of their own (an idle
connection gives way to a new one; see netstack/limits.py), a connection
that does not send a complete request head (and body) within
`idle_timeout_s` is closed, and keep-alive connections are closed after the
same idle time between requests. Bodies are only accepted up to
`max_body_bytes` (0 for /metrics) and only with a Content-Length.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, unquote, urlsplit

from netstack.limits import SHED, Admission

log = logging.getLogger("sluice.http")

MAX_HEAD_BYTES = 8 * 1024
REASONS = {200: "OK", 202: "Accepted", 400: "Bad Request", 401: "Unauthorized", 403: "Forbidden",
           404: "Not Found", 405: "Method Not Allowed", 408: "Request Timeout", 409: "Conflict",
           413: "Content Too Large", 500: "Internal Server Error", 503: "Service Unavailable",
           504: "Gateway Timeout"}


@dataclass(frozen=True)
class HttpLimits:
    max_connections: int = 64
    max_idle: int = 32  # connections without a request under way; the oldest gives way to a new one
    idle_timeout_s: float = 10.0
    max_body_bytes: int = 0  # 0: no request bodies at all


@dataclass(frozen=True)
class HttpRequest:
    method: str
    path: str  # decoded, without the query
    query: dict[str, str]
    headers: dict[str, str]  # names lower-cased, values as sent
    body: bytes = b""


@dataclass(frozen=True)
class HttpResponse:
    status: int
    body: bytes = b""
    content_type: str = "text/plain; charset=utf-8"
    headers: tuple[tuple[str, str], ...] = field(default=())


Handler = Callable[[HttpRequest], Awaitable[HttpResponse]]


class BadRequest(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def parse_head(head: bytes, max_body_bytes: int) -> tuple[HttpRequest, int, bool]:
    """A request head -> (the request without its body, the body length, keep-alive); BadRequest if malformed.

    Pure, so the parsing rules are tested without sockets.
    """
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise BadRequest(400, "bad request line")
    method, target, version = parts
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    connection = headers.get("connection", "").lower()
    keep_alive = connection != "close" if version == "HTTP/1.1" else connection == "keep-alive"
    if "transfer-encoding" in headers:
        raise BadRequest(400, "chunked request bodies are not accepted; send a Content-Length")
    try:
        length = int(headers.get("content-length", "0"))
    except ValueError:
        raise BadRequest(400, "Content-Length is not a number") from None
    if length < 0:
        raise BadRequest(400, "Content-Length is negative")
    if length > max_body_bytes:
        raise BadRequest(413 if max_body_bytes else 400,
                         f"request bodies are limited to {max_body_bytes} bytes here" if max_body_bytes
                         else "no request bodies here")
    url = urlsplit(target)
    query = dict(parse_qsl(url.query, keep_blank_values=True))
    return HttpRequest(method, unquote(url.path) or "/", query, headers), length, keep_alive


class HttpServer:
    """Serves `handler` under `limits`; `port` is the bound port after `start`."""

    def __init__(self, handler: Handler, limits: HttpLimits, name: str = "http") -> None:
        self.handler = handler
        self.limits = limits
        self.name = name
        self.admission: Admission[asyncio.StreamWriter] = Admission(limits.max_connections, limits.max_idle)
        self._server: asyncio.Server | None = None
        self._warned_at = -1e9
        self.port = 0

    async def start(self, host: str, port: int, *, ssl_context: ssl.SSLContext | None = None) -> int:
        """Listen (HTTPS with `ssl_context`); returns the bound port."""
        self._server = await asyncio.start_server(self._serve, host, port, limit=MAX_HEAD_BYTES, backlog=1024,
                                                  ssl=ssl_context, ssl_handshake_timeout=10.0 if ssl_context else None)
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
            log.warning("%s listener shedding connections: %d idle, %d busy; %d evicted, %d refused so far",
                        self.name, stats.pending, stats.active, stats.evicted, stats.refused)
        if not admitted:
            return
        try:
            while await self._one_request(reader, writer):
                self.admission.idle(writer)
        except (ConnectionError, TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass  # the peer went away, sent too much, or sat idle: nothing to tell anyone
        except Exception as exc:  # never a traceback for one connection; the listener keeps serving
            log.warning("%s request failed: %s: %s", self.name, type(exc).__name__, exc)
        finally:
            self.admission.release(writer)
            writer.transport.abort()

    async def _one_request(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """Serve one request; True to wait for another on this connection."""
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), self.limits.idle_timeout_s)
        self.admission.activate(writer)
        try:
            request, length, keep_alive = parse_head(head, self.limits.max_body_bytes)
        except BadRequest as exc:
            await self._respond(writer, HttpResponse(exc.status, f"{exc}\n".encode()), head_only=False,
                                keep_alive=False)
            return False
        if length:
            body = await asyncio.wait_for(reader.readexactly(length), self.limits.idle_timeout_s)
            request = HttpRequest(request.method, request.path, request.query, request.headers, body)
        try:
            response = await self.handler(request)
        except Exception as exc:  # a handler bug is a 500 for this request, not a dead listener
            log.warning("%s handler failed on %s %s: %s: %s", self.name, request.method, request.path,
                        type(exc).__name__, exc)
            response = HttpResponse(500, b"internal error\n")
            keep_alive = False
        await self._respond(writer, response, head_only=request.method == "HEAD", keep_alive=keep_alive)
        return keep_alive

    async def _respond(self, writer: asyncio.StreamWriter, response: HttpResponse, *, head_only: bool,
                       keep_alive: bool) -> None:
        reason = REASONS.get(response.status, "Unknown")
        extra = "".join(f"{name}: {value}\r\n" for name, value in response.headers)
        head = (f"HTTP/1.1 {response.status} {reason}\r\nContent-Type: {response.content_type}\r\n"
                f"Content-Length: {len(response.body)}\r\n{extra}"
                f"Connection: {'keep-alive' if keep_alive else 'close'}\r\n\r\n")
        writer.write(head.encode("latin-1") + (b"" if head_only else response.body))
        # a reader that never reads must not hold the connection (and its buffer) forever
        await asyncio.wait_for(writer.drain(), self.limits.idle_timeout_s)
