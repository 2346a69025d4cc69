"""A real HTTP/1.1 lookup service that misbehaves on chosen requests, for the Async I/O fault tests.

`GET /lookup/<key>` answers `{"key": <key>, "score": score(key)}` (runtime/examples/lookup_service.py's score,
so the expected output is computable). The service counts the requests it reads (1-based, over all
connections) and asks `plan(n)` how to answer request n: a `Fault`, or None for a good answer. A test switches
the misbehaviour per request count, e.g. `faults_first(2, Fault.ANSWER_503)`.

It runs on the caller's event loop (`async with FaultyHttpService(plan) as service`) for tests that drive the
operator in-process, or on its own thread and loop (`serving_in_thread(plan)`) for a job on a real cluster
whose workers call it from their processes. Either way it listens on a free loopback port (`service.port`)
and every connection it accepted is closed when the block ends.
"""

from __future__ import annotations

import asyncio
import enum
import json
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager

from runtime.examples.lookup_service import score


class Fault(enum.Enum):
    DELAY = "delay"  # answer correctly, but only after `delay_s` (past the caller's timeout)
    ANSWER_503 = "503"  # HTTP 503 with a JSON error body
    GARBAGE_BODY = "garbage"  # HTTP 200 whose body is not JSON
    NOT_HTTP = "not-http"  # bytes that are not an HTTP answer at all, then close
    TRUNCATED_JSON = "truncated-json"  # HTTP 200, a complete body that is the first half of the JSON
    CUT_OFF = "cut-off"  # HTTP 200 announcing the whole body, half of it sent, then the connection closed
    NEVER = "never"  # read the request and never answer (the connection stays open)


Plan = Callable[[int], "Fault | None"]


def faults_first(count: int, fault: Fault) -> Plan:
    """Requests 1..count get `fault`, the rest good answers: a service that recovers."""
    return lambda n: fault if n <= count else None


def always(fault: Fault) -> Plan:
    return lambda n: fault


class FaultyHttpService:
    def __init__(self, plan: Plan, *, delay_s: float = 1.0) -> None:
        self.plan = plan
        self.delay_s = delay_s
        self.requests = 0  # requests read so far
        self.faults: list[tuple[int, Fault]] = []  # (request number, fault) for each misbehaving answer
        self.port = 0
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    async def start(self, port: int = 0) -> None:
        """Listen on `port` (0: a free one); a stopped service may start again on its old port (a restart)."""
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        assert self._server is not None
        self._server.close()
        for writer in list(self._writers):  # connections held open (NEVER) end too
            writer.close()
        await self._server.wait_closed()

    async def __aenter__(self) -> FaultyHttpService:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                self.requests += 1
                n = self.requests
                fault = self.plan(n)
                if fault is not None:
                    self.faults.append((n, fault))
                if not await self._answer(reader, writer, head.split(b" ", 2)[1].decode(), fault):
                    return
        except ConnectionError:
            return
        finally:
            self._writers.discard(writer)
            writer.close()

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, path: str,
                      fault: Fault | None) -> bool:
        """Write the answer for `fault`; False when the connection ends after it."""
        key = path.rsplit("/", 1)[1]
        good = json.dumps({"key": key, "score": score(key)}).encode()
        if fault is Fault.NEVER:
            await reader.read()  # no answer: wait until the caller gives up and closes, or stop() closes
            return False
        if fault is Fault.DELAY:
            await asyncio.sleep(self.delay_s)
        if fault is Fault.NOT_HTTP:
            writer.write(b"\x00\x13garbage, not HTTP\r\n\r\n")
            await writer.drain()
            return False
        if fault is Fault.CUT_OFF:
            writer.write(_response(200, good[:len(good) // 2], length=len(good)))
            await writer.drain()
            return False
        body = {Fault.ANSWER_503: b'{"error": "unavailable"}', Fault.GARBAGE_BODY: b"<html>oops</html>",
                Fault.TRUNCATED_JSON: good[:len(good) // 2]}.get(fault, good)  # type: ignore[arg-type]
        writer.write(_response(503 if fault is Fault.ANSWER_503 else 200, body))
        await writer.drain()
        return True


def _response(status: int, body: bytes, *, length: int | None = None) -> bytes:
    """A keep-alive HTTP/1.1 answer; `length` announces another body length than the one sent."""
    return (b"HTTP/1.1 %d X\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
            % (status, len(body) if length is None else length, body))


@asynccontextmanager
async def faulty_service(plan: Plan, *, delay_s: float = 1.0) -> AsyncIterator[FaultyHttpService]:
    async with FaultyHttpService(plan, delay_s=delay_s) as service:
        yield service


@contextmanager
def serving_in_thread(plan: Plan, *, delay_s: float = 1.0, timeout_s: float = 10.0) -> Iterator[FaultyHttpService]:
    """The service on a thread of its own (its own loop), for worker processes to call; stopped and joined
    when the block ends."""
    service = FaultyHttpService(plan, delay_s=delay_s)
    loop = asyncio.new_event_loop()
    started = threading.Event()
    done: asyncio.Future[None] | None = None

    async def run() -> None:
        nonlocal done
        await service.start()
        done = loop.create_future()
        started.set()
        await done
        await service.stop()

    thread = threading.Thread(target=loop.run_until_complete, args=(run(),), name="faulty-http", daemon=True)
    thread.start()
    try:
        assert started.wait(timeout_s), "the faulty HTTP service did not start"
        yield service
    finally:
        assert done is not None
        loop.call_soon_threadsafe(done.set_result, None)
        thread.join(timeout_s)
        assert not thread.is_alive(), "the faulty HTTP service did not stop"
        loop.close()
