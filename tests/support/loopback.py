"""Real loopback links for the netstack tests: servers on port 0 of 127.0.0.1 and links dialled to them (`Net`
closes all of them), a handler that records what happens and serves a few RPC methods, and waiting with a
deadline inside the event loop."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from netstack.connection import Connection, DataArrived, EventArrived
from netstack.credit import ChannelSender, CreditLedger
from netstack.errors import CloseReason, RpcError
from netstack.transport import BaseLinkHandler, Link, dial, serve

TOKEN = "loopback-secret"
DEADLINE_S = 5.0
HOST = "127.0.0.1"


async def wait_until(predicate: Callable[[], bool], *, timeout_s: float = DEADLINE_S, what: str = "") -> None:
    """Poll `predicate` until it holds; fail after `timeout_s` (never sleep and hope)."""

    async def poll() -> None:
        while not predicate():  # noqa: ASYNC110 - polling a predicate under a deadline is the point
            await asyncio.sleep(0.002)

    try:
        await asyncio.wait_for(poll(), timeout_s)
    except TimeoutError:
        raise AssertionError(f"timed out after {timeout_s}s waiting for {what or predicate}") from None


class Directory:
    def __init__(self) -> None:
        self.ledgers: dict[tuple[str, int], CreditLedger] = {}
        self.senders: dict[tuple[str, int], ChannelSender] = {}

    def inbound(self, peer_id: str, channel_id: int) -> CreditLedger | None:
        return self.ledgers.get((peer_id, channel_id))

    def outbound(self, peer_id: str, channel_id: int) -> ChannelSender | None:
        return self.senders.get((peer_id, channel_id))


class Recorder(BaseLinkHandler):
    """Records what happens on its links and serves a few RPC methods."""

    def __init__(self) -> None:
        self.links: list[Link] = []
        self.closed: list[tuple[Link, CloseReason, str]] = []
        self.data: list[DataArrived] = []
        self.events: list[EventArrived] = []
        self.release = asyncio.Event()

    def on_established(self, link: Link) -> None:
        self.links.append(link)

    def on_closed(self, link: Link, reason: CloseReason, message: str) -> None:
        self.closed.append((link, reason, message))

    def reasons(self) -> list[CloseReason]:
        return [reason for _, reason, _ in self.closed]

    async def on_rpc(self, link: Link, method: str, args: dict[str, Any]) -> Any:
        if method == "echo":
            return {"from": link.connection.local_id, "args": args}
        if method == "fail":
            raise ValueError(f"cannot do {args.get('what')}")
        if method == "refuse":
            raise RpcError("not now", "Busy")
        if method == "unencodable":
            return object()
        if method == "wait":
            await self.release.wait()
            return "released"
        if method == "ask_back":  # a call from inside a call, in the other direction
            return await link.call("echo", {"nested": True}, timeout_s=DEADLINE_S)
        return await super().on_rpc(link, method, args)


class Net:
    """Starts servers and dials links; `aclose` shuts all of them down."""

    def __init__(self) -> None:
        self.servers: list[asyncio.Server] = []
        self.links: list[Link] = []
        self.handlers: list[Recorder] = []

    async def serve(self, handler: Recorder, *, token: str = TOKEN, directory: Directory | None = None,
                    max_frame_bytes: int = 1 << 20, local_id: str = "srv") -> int:
        def make() -> Connection:
            return Connection(local_id=local_id, role="coordinator", token=token, is_client=False,
                              directory=directory, max_frame_bytes=max_frame_bytes)

        server, port = await serve(HOST, 0, make, handler)
        assert port > 0
        self.servers.append(server)
        self.handlers.append(handler)
        return port

    async def dial(self, port: int, handler: Recorder | None = None, *, token: str = TOKEN,
                   directory: Directory | None = None, local_id: str = "cli") -> Link:
        handler = handler or Recorder()
        self.handlers.append(handler)
        conn = Connection(local_id=local_id, role="worker", token=token, is_client=True, directory=directory,
                          info={"pid": 1})
        link = await dial(HOST, port, conn, handler, timeout_s=DEADLINE_S)
        self.links.append(link)
        return link

    async def aclose(self) -> None:
        links = list(self.links) + [lk for h in self.handlers for lk in h.links]
        for link in links:
            link.close("test over")
        for link in links:
            try:
                await asyncio.wait_for(asyncio.shield(link.closed), DEADLINE_S)
            except TimeoutError:
                link.abort()
        for server in self.servers:
            server.close()
            await asyncio.wait_for(server.wait_closed(), DEADLINE_S)


def payload(i: int) -> bytes:
    return f"buffer-{i:05d}".encode() * 50  # ~600 bytes, distinct per buffer
