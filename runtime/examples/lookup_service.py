"""A local HTTP lookup service for the Async I/O example, its tests and scripts/bench_async_io.py.

    python -m runtime.examples.lookup_service --port 8099 --latency-ms 20

`GET /lookup/<key>` answers `{"key": <key>, "score": <a number derived from the key>}` after `--latency-ms`
(keep-alive HTTP/1.1, any number of requests at once, on asyncio). Faults for tests: `--fail-every N` answers
every N-th lookup with 503; `GET /outage/<seconds>` makes every lookup in the next `seconds` hang until the
outage ends. `GET /stats` gives the number of lookups answered and failed. It prints `listening on <port>`
once it accepts connections (`--port 0` picks a free one).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import zlib


def score(key: str) -> int:
    """The value the service holds for `key` (deterministic, so tests can compute the expected output)."""
    return zlib.crc32(key.encode()) % 1000


class LookupService:
    def __init__(self, latency_s: float, fail_every: int = 0) -> None:
        self.latency_s = latency_s
        self.fail_every = fail_every
        self.outage_until = 0.0
        self.lookups = 0
        self.failed = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                path = head.split(b" ", 2)[1].decode()
                status, body = await self.answer(path)
                writer.write(b"HTTP/1.1 %d X\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                             % (status, len(body), body))
                await writer.drain()
        except ConnectionError:
            return
        finally:
            writer.close()

    async def answer(self, path: str) -> tuple[int, bytes]:
        loop = asyncio.get_running_loop()
        if path.startswith("/outage/"):
            self.outage_until = loop.time() + float(path.rsplit("/", 1)[1])
            return 200, b"{}"
        if path == "/stats":
            return 200, json.dumps({"lookups": self.lookups, "failed": self.failed}).encode()
        if not path.startswith("/lookup/"):
            return 404, b'{"error": "no such path"}'
        if loop.time() < self.outage_until:
            await asyncio.sleep(self.outage_until - loop.time())
        await asyncio.sleep(self.latency_s)
        self.lookups += 1
        if self.fail_every and self.lookups % self.fail_every == 0:
            self.failed += 1
            return 503, b'{"error": "injected failure"}'
        key = path[len("/lookup/"):]
        return 200, json.dumps({"key": key, "score": score(key)}).encode()


async def serve(port: int, latency_s: float, fail_every: int) -> None:
    service = LookupService(latency_s, fail_every)
    server = await asyncio.start_server(service.handle, "127.0.0.1", port, backlog=1024)
    print(f"listening on {server.sockets[0].getsockname()[1]}", flush=True)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=8099)
    parser.add_argument("--latency-ms", type=float, default=20.0)
    parser.add_argument("--fail-every", type=int, default=0, help="answer every N-th lookup with 503")
    args = parser.parse_args()
    try:
        import uvloop  # the workers' loop; the service keeps up with many clients on one core
        uvloop.install()
    except ImportError:
        pass
    try:
        asyncio.run(serve(args.port, args.latency_ms / 1000, args.fail_every))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
