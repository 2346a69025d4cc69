"""A worker's data plane: one TCP link per peer worker, multiplexing every channel between the two.

The worker with the smaller id dials; the other waits for the incoming
link. Both ends watch the link's liveness (`link_timeout_s`): a cut path
closes the link within the timeout instead of stalling the job silently,
and `on_link_lost` lets the worker fail the tasks that used it. This
object is also the `ChannelDirectory` the sans-IO connection consults, so
a frame for a channel that this worker does not share with that peer is
refused at the protocol layer.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from netstack.connection import Connection, DataArrived, EventArrived
from netstack.credit import ChannelSender, CreditLedger
from netstack.errors import CloseReason, ConnectionLost
from netstack.frames import DEFAULT_MAX_FRAME_BYTES
from netstack.limits import ListenerLimits
from netstack.tls import TlsFiles, client_context, server_context
from netstack.transport import BaseLinkHandler, Link, dial, serve
from runtime.execution.channels import InputGate, Subpartition

log = logging.getLogger("sluice.network")


class NetworkEnvironment(BaseLinkHandler):
    def __init__(self, worker_id: str, *, token: str, host: str,
                 max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES, limits: ListenerLimits | None = None,
                 tls: TlsFiles | None = None, link_timeout_s: float | None = 10.0) -> None:
        self.worker_id = worker_id
        self.limits = limits
        self.server_ssl = server_context(tls) if tls else None  # built once: a bad file fails at start-up
        self.client_ssl = client_context(tls) if tls else None
        self.token = token
        self.host = host
        self.max_frame_bytes = max_frame_bytes
        self.link_timeout_s = link_timeout_s  # None or 0: never time a silent link out
        self.links: dict[str, Link] = {}
        self._link_waiters: dict[str, asyncio.Future[Link]] = {}
        self._dials: dict[str, asyncio.Future[Link]] = {}  # one dial per peer at a time
        self._out: dict[int, tuple[str, Subpartition]] = {}
        self._in: dict[int, tuple[str, InputGate]] = {}
        self.server: asyncio.Server | None = None
        self.port = 0
        self.on_link_lost: Callable[[str, str], None] = lambda peer, why: None
        self.all_links: list[Link] = []  # every link ever made, for connection metrics while open

    def _connection(self, is_client: bool) -> Connection:
        return Connection(local_id=self.worker_id, role="worker", token=self.token, is_client=is_client,
                          directory=self, max_frame_bytes=self.max_frame_bytes)

    async def start(self, port: int) -> int:
        self.server, self.port = await serve(self.host, port, lambda: self._connection(False), self,
                                             limits=self.limits, ssl_context=self.server_ssl, name="data")
        return self.port

    async def close(self) -> None:
        for link in list(self.links.values()):
            link.close("worker shutting down")
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()

    # -- ChannelDirectory ---------------------------------------------------------

    def inbound(self, peer_id: str, channel_id: int) -> CreditLedger | None:
        entry = self._in.get(channel_id)
        if entry is None or entry[0] != peer_id:
            return None
        return entry[1].ledger

    def outbound(self, peer_id: str, channel_id: int) -> ChannelSender | None:
        entry = self._out.get(channel_id)
        if entry is None or entry[0] != peer_id:
            return None
        return entry[1].sender

    def register_outbound(self, channel_id: int, peer_id: str, sub: Subpartition) -> None:
        self._out[channel_id] = (peer_id, sub)

    def register_inbound(self, channel_id: int, peer_id: str, gate: InputGate) -> None:
        self._in[channel_id] = (peer_id, gate)

    def unregister(self, channel_ids: list[int]) -> None:
        for cid in channel_ids:
            self._out.pop(cid, None)
            self._in.pop(cid, None)

    def outbound_channels(self) -> list[tuple[str, Subpartition]]:
        """(peer, subpartition) of every channel this worker sends on over TCP."""
        return list(self._out.values())

    def outbound_peer(self, channel_id: int) -> str | None:
        entry = self._out.get(channel_id)
        return entry[0] if entry else None

    def peers_in_use(self) -> set[str]:
        return {p for p, _ in self._out.values()} | {p for p, _ in self._in.values()}

    # -- links --------------------------------------------------------------------

    async def link_to(self, peer_id: str, host: str, port: int, *, timeout_s: float = 15.0) -> Link:
        link = self.links.get(peer_id)
        if link is not None and not link.is_closing():
            return link
        if self.worker_id < peer_id:
            # Two tasks deploying at once (two jobs, or two vertices) both ask for the link before
            # either dial finished. Each dialing would make two links, the second replacing the
            # first, and the frames already on the first would be lost with it: so they share one.
            dialing = self._dials.get(peer_id)
            if dialing is None or dialing.done():
                dialing = self._dials[peer_id] = asyncio.ensure_future(self._dial(peer_id, host, port, timeout_s))
                dialing.add_done_callback(_retrieve)
            return await asyncio.shield(dialing)
        waiter = self._link_waiters.get(peer_id)
        if waiter is None or waiter.done():
            waiter = self._link_waiters[peer_id] = asyncio.get_running_loop().create_future()
        try:
            return await asyncio.wait_for(asyncio.shield(waiter), timeout_s)
        except TimeoutError:
            raise ConnectionLost(f"worker {peer_id} did not connect within {timeout_s}s",
                                 CloseReason.TIMEOUT) from None

    async def _dial(self, peer_id: str, host: str, port: int, timeout_s: float) -> Link:
        try:
            link = await dial(host, port, self._connection(True), self, timeout_s=timeout_s,
                              ssl_context=self.client_ssl)
            self._adopt(link)
            return link
        finally:
            self._dials.pop(peer_id, None)

    def _adopt(self, link: Link) -> None:
        old = self.links.get(link.peer_id)
        if old is not None and old is not link and not old.is_closing():
            old.close("replaced by a newer link")
        self.links[link.peer_id] = link
        self.all_links = [x for x in self.all_links if not x.is_closing()] + [link]
        waiter = self._link_waiters.pop(link.peer_id, None)
        if waiter is not None and not waiter.done():
            waiter.set_result(link)

    # -- LinkHandler --------------------------------------------------------------

    def on_established(self, link: Link) -> None:
        if self.link_timeout_s:
            link.watch_liveness(self.link_timeout_s)
        if not link.connection.is_client:
            if link.connection.peer_role != "worker":
                from netstack.errors import RemoteProtocolError
                link.fail(RemoteProtocolError(f"role {link.connection.peer_role!r} on a data port",
                                              CloseReason.BAD_HANDSHAKE))
                return
            self._adopt(link)

    def on_data(self, link: Link, event: DataArrived) -> None:
        self._in[event.channel][1].deliver_data(event.channel, event.seq, event.buffer)

    def on_event(self, link: Link, event: EventArrived) -> None:
        self._in[event.channel][1].deliver_event(event.channel, event.seq, event.event, event.priority)

    def on_sent(self, link: Link, sender: ChannelSender) -> None:
        entry = self._out.get(sender.channel_id)
        if entry is not None:
            entry[1].on_sent()

    def on_closed(self, link: Link, reason: CloseReason, message: str) -> None:
        peer = link.peer_id
        if self.links.get(peer) is link:
            del self.links[peer]
            if peer in self.peers_in_use():
                self.on_link_lost(peer, f"{reason.value}: {message}")


def _retrieve(dialing: asyncio.Future[Link]) -> None:
    """Mark a failed shared dial's error as seen: every caller that still waits gets it; one
    that gave up (cancelled) must not leave asyncio logging it as never retrieved."""
    if not dialing.cancelled():
        dialing.exception()
