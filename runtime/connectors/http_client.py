"""A small asyncio HTTP/1.1 client for `async_map` functions: GET with keep-alive connections, JSON answers.

Enough to call a local or internal service from a job without another package (aiohttp or httpx do more; use
them when they are installed). Connections are opened on the running loop when first needed and reused; at
most `max_connections` are open at once, the rest of the callers wait for one. Bodies need a Content-Length
(no chunked encoding). A connection that fails mid-request is dropped, never reused.
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
            reader, writer = self._idle.pop() if self._idle else await asyncio.open_connection(self.host, self.port)
            try:
                writer.write(f"GET {path} HTTP/1.1\r\nHost: {self.host}\r\n\r\n".encode())
                status, body, keep = await _read_response(reader)
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


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, bytes, bool]:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as e:
        raise ConnectionError("the service closed the connection") from e
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
        raise HttpError(f"not an HTTP answer: {lines[0][:80]!r}")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
    length = int(headers.get("content-length", "0"))
    body = await reader.readexactly(length) if length else b""
    keep = headers.get("connection", "").lower() != "close" and parts[0] == "HTTP/1.1"
    return int(parts[1]), body, keep
