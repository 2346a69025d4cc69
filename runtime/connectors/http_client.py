"""A small asyncio HTTP/1.1 client for `async_map` functions: GET with keep-alive connections, JSON answers.

Enough to call a local or internal service from a job without another package (aiohttp or httpx do more; use
them when they are installed). Connections are opened on the running loop when first needed and reused; at
most `max_connections` are open at once, the rest of the callers wait for one. Bodies need a Content-Length
(no chunked encoding). A connection that fails mid-request is dropped, never reused; a kept-alive connection
the service closed while it was idle is replaced, and the GET sent again once (the service restarted).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any


class HttpError(Exception):
    """The service answered with an error status (`status`), or not with HTTP."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class HttpClient:
    def __init__(self, host: str, port: int, *, max_connections: int = 100) -> None:
        self.host = host
        self.port = port
        self.max_connections = max_connections
        self._idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        self._slots: asyncio.Semaphore | None = None

    async def get_json(self, path: str) -> Any:
        """GET `path`; the decoded JSON body of a 2xx answer, else HttpError."""
        status, body = await self.get(path)
        if not 200 <= status < 300:
            raise HttpError(f"GET {path}: HTTP {status} {body[:200]!r}", status)
        return json.loads(body)

    async def get(self, path: str) -> tuple[int, bytes]:
        """GET `path`: (status, body)."""
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.max_connections)
        async with self._slots:
            try:
                return await self._send(path, fresh=not self._idle)
            except _NoAnswer:
                # A kept-alive connection the service closed while idle (it restarted, or timed the connection
                # out) fails before any byte of an answer; the others in the pool are likely as dead. A GET may
                # be sent again: once, on a new connection, whose failure is the caller's.
                self.close()
                return await self._send(path, fresh=True)

    async def _send(self, path: str, *, fresh: bool) -> tuple[int, bytes]:
        reader, writer = await asyncio.open_connection(self.host, self.port) if fresh else self._idle.pop()
        try:
            writer.write(f"GET {path} HTTP/1.1\r\nHost: {self.host}\r\n\r\n".encode())
            status, body, keep = await _read_response(reader)
        except (_NoAnswer, ConnectionResetError, BrokenPipeError) as e:
            writer.close()
            if fresh:
                raise ConnectionError("the service closed the connection without answering") from e
            raise _NoAnswer() from e
        except BaseException:  # a timeout or cancel mid-request too: the stream position is unknown
            writer.close()
            raise
        if keep:
            self._idle.append((reader, writer))
        else:
            writer.close()
        return status, body

    def close(self) -> None:
        for _, writer in self._idle:
            writer.close()
        self._idle.clear()


class _NoAnswer(Exception):
    """The connection ended before any byte of an answer."""


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, bytes, bool]:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as e:
        if not e.partial:
            raise _NoAnswer() from e
        raise ConnectionError(f"the service closed the connection in the middle of an answer's head "
                              f"({len(e.partial)} bytes)") from e
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
        raise HttpError(f"not an HTTP answer: {lines[0][:80]!r}")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
    length = int(headers.get("content-length", "0"))
    try:
        body = await reader.readexactly(length) if length else b""
    except asyncio.IncompleteReadError as e:
        raise ConnectionError(f"the service closed the connection after {len(e.partial)} of the {length} bytes "
                              f"of an answer's body") from e
    keep = headers.get("connection", "").lower() != "close" and parts[0] == "HTTP/1.1"
    return int(parts[1]), body, keep
