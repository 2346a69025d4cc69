"""netstack/http.py over real loopback sockets: keep-alive, bodies within the limit, a handler's failure, and a
flood of idle connections that gives way to a real request."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from netstack.http import HttpLimits, HttpRequest, HttpResponse, HttpServer

DEADLINE_S = 10.0


async def echo(request: HttpRequest) -> HttpResponse:
    if request.path == "/boom":
        raise RuntimeError("handler bug")
    return HttpResponse(200, f"{request.method} {request.path} {request.body.decode()}".encode())


@pytest.fixture
async def server() -> AsyncIterator[HttpServer]:
    s = HttpServer(echo, HttpLimits(max_connections=16, max_idle=4, idle_timeout_s=5.0, max_body_bytes=16),
                   name="test")
    await s.start("127.0.0.1", 0)
    try:
        yield s
    finally:
        s.close()


async def exchange(port: int, raw: bytes, *, responses: int = 1) -> list[bytes]:
    """Send `raw` on one connection and read `responses` whole responses (head and body)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(raw)
        out = []
        for _ in range(responses):
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), DEADLINE_S)
            length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length"))
            out.append(head.split(b"\r\n")[0] + b" | " + await reader.readexactly(length))
        return out
    finally:
        writer.close()


async def test_two_requests_on_one_keep_alive_connection(server: HttpServer) -> None:
    got = await exchange(server.port, b"GET /a HTTP/1.1\r\n\r\nPOST /b HTTP/1.1\r\nContent-Length: 2\r\n\r\nhi",
                         responses=2)
    assert got == [b"HTTP/1.1 200 OK | GET /a ", b"HTTP/1.1 200 OK | POST /b hi"]


async def test_a_body_over_the_limit_is_refused_and_a_handler_bug_is_a_500(server: HttpServer) -> None:
    assert await exchange(server.port, b"POST /x HTTP/1.1\r\nContent-Length: 17\r\n\r\n") == [
        b"HTTP/1.1 413 Content Too Large | request bodies are limited to 16 bytes here\n"]
    assert await exchange(server.port, b"GET /boom HTTP/1.1\r\n\r\n") == [
        b"HTTP/1.1 500 Internal Server Error | internal error\n"]
    assert await exchange(server.port, b"GET /still-here HTTP/1.1\r\n\r\n") == [
        b"HTTP/1.1 200 OK | GET /still-here "]


async def test_idle_connections_give_way_to_a_real_request(server: HttpServer) -> None:
    idle = [await asyncio.open_connection("127.0.0.1", server.port) for _ in range(40)]
    try:
        assert await exchange(server.port, b"GET /real HTTP/1.1\r\n\r\n") == [b"HTTP/1.1 200 OK | GET /real "]
        stats = server.admission.statistics()
        assert stats.evicted >= 40 - 4 and stats.pending <= 4
    finally:
        for _, writer in idle:
            writer.close()
