"""The one place where netstack touches sockets: an asyncio binding of `Connection`.

`Link` is an asyncio.Protocol that feeds received bytes to the sans-IO
`Connection`, hands the resulting events to a `LinkHandler`, and drains
ready `ChannelSender`s into the socket: first every queued priority event of
every channel (the link's priority queue), then data, one item per sender per
round so channels share the link fairly. So a barrier of one channel never
waits behind the data of another channel sharing the TCP connection. When
the kernel buffer is full (`pause_writing`) it stops draining data; the
senders keep their queues, so backpressure reaches the producing tasks
through their bounded output queues. Priority events still go out while
paused: they are few and small, and they exist to overtake that backlog.
Data links also watch their peer's liveness (`watch_liveness`).

A peer that breaks the protocol gets a GOODBYE naming the reason, then the
connection is closed and the reason is logged with the peer's name and
address. Nothing else in the process is affected.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import socket
import ssl
import time
from collections.abc import Callable, Coroutine
from typing import Any, Protocol, TypeVar

from netstack.connection import (
    Connection,
    CreditArrived,
    DataArrived,
    Established,
    EventArrived,
    Liveness,
    LivenessVerdict,
    PeerGoodbye,
    RpcRequest,
    RpcResponse,
)
from netstack.credit import ChannelSender, SendData
from netstack.errors import CloseReason, ConnectionLost, MethodNotFound, NetstackError, RemoteProtocolError, RpcError
from netstack.limits import SHED, Admission, ListenerLimits

log = logging.getLogger("sluice.net")

HANDSHAKE_TIMEOUT_S = 10.0
FLUSH_CHUNK_BYTES = 64 * 1024  # data frames gathered before the transport gets them (Link._flush)

T = TypeVar("T")

# Connections this process closed because the peer broke the protocol, by reason (for metrics).
PROTOCOL_FAILURES: collections.Counter[str] = collections.Counter()
# Links this process closed because the peer fell silent for the link timeout (a cut path), for metrics.
LINK_TIMEOUTS: collections.Counter[str] = collections.Counter()


def run(main: Coroutine[Any, Any, T]) -> T:
    """Run `main` to completion on a new event loop: uvloop when importable, else asyncio's default.

    The one entry every sluice process goes through. It passes uvloop as the
    runner's loop factory rather than installing uvloop's event-loop policy,
    which asyncio deprecates (3.12) and which would leak into every later
    loop of the process.
    """
    try:
        import uvloop
    except ImportError:
        factory: Callable[[], asyncio.AbstractEventLoop] | None = None
    else:
        factory = uvloop.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)


class LinkHandler(Protocol):
    """What the application does with a link's traffic."""

    def on_established(self, link: Link) -> None: ...

    def on_data(self, link: Link, event: DataArrived) -> None: ...

    def on_event(self, link: Link, event: EventArrived) -> None: ...

    def on_sent(self, link: Link, sender: ChannelSender) -> None: ...

    async def on_rpc(self, link: Link, method: str, args: dict[str, Any]) -> Any: ...

    def on_closed(self, link: Link, reason: CloseReason, message: str) -> None: ...


class BaseLinkHandler:
    """A handler for RPC-only links; subclasses override what they use."""

    def on_established(self, link: Link) -> None:
        pass

    def on_data(self, link: Link, event: DataArrived) -> None:
        raise RemoteProtocolError("data on an RPC link", CloseReason.UNKNOWN_CHANNEL)

    def on_event(self, link: Link, event: EventArrived) -> None:
        raise RemoteProtocolError("event on an RPC link", CloseReason.UNKNOWN_CHANNEL)

    def on_sent(self, link: Link, sender: ChannelSender) -> None:
        pass

    async def on_rpc(self, link: Link, method: str, args: dict[str, Any]) -> Any:
        raise MethodNotFound(f"unknown method {method!r}")

    def on_closed(self, link: Link, reason: CloseReason, message: str) -> None:
        pass


class Link(asyncio.Protocol):
    handshake_timeout_s: float | None = None  # None: HANDSHAKE_TIMEOUT_S, read when the connection opens

    def __init__(self, connection: Connection, handler: LinkHandler) -> None:
        self.connection = connection
        self.handler = handler
        self.transport: asyncio.Transport | None = None
        self.peer_address = "?"
        self.established: asyncio.Future[Established] = asyncio.get_running_loop().create_future()
        self.closed = asyncio.get_running_loop().create_future()
        self._calls: dict[int, asyncio.Future[Any]] = {}
        self._call_ids = itertools.count(1)
        self._ready: dict[int, ChannelSender] = {}
        self._urgent: dict[int, ChannelSender] = {}  # senders holding priority events: drained before any data
        self._flush_scheduled = False
        self._paused = False
        self._rpc_tasks: set[asyncio.Task[None]] = set()
        self._close_reason: tuple[CloseReason, str] | None = None
        self._handshake_timer: asyncio.TimerHandle | None = None
        self._liveness: Liveness | None = None
        self._liveness_timer: asyncio.TimerHandle | None = None
        # statistics, read by metrics
        self.bytes_in = 0
        self.bytes_out = 0
        self.frames_in = 0
        self.frames_out = 0

    @property
    def peer_id(self) -> str:
        return self.connection.peer_id

    def describe(self) -> str:
        return f"{self.connection.peer_role} {self.connection.peer_id} at {self.peer_address}"

    # -- asyncio.Protocol -----------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's transports are not subclasses
        peer = transport.get_extra_info("peername")
        self.peer_address = f"{peer[0]}:{peer[1]}" if peer else "?"
        transport.set_write_buffer_limits(high=512 * 1024)  # type: ignore[attr-defined]  # a stream transport
        if self.connection.is_client:
            self._write([self.connection.hello()])
        loop = asyncio.get_running_loop()
        self._handshake_timer = loop.call_later(self.handshake_timeout_s or HANDSHAKE_TIMEOUT_S,
                                                self._handshake_timeout)

    def _handshake_timeout(self) -> None:
        if not self.established.done():
            self.fail(RemoteProtocolError("no handshake within the timeout", CloseReason.TIMEOUT))

    def data_received(self, data: bytes) -> None:
        self.bytes_in += len(data)
        if self._liveness is not None:
            self._liveness.heard(asyncio.get_running_loop().time())
        try:
            events, replies = self.connection.receive_data(data)
            if replies:
                self._write(replies)
            for event in events:
                self.frames_in += 1
                self._dispatch(event)
        except RemoteProtocolError as exc:
            self.fail(exc)

    def eof_received(self) -> bool:
        try:
            self.connection.eof()
        except RemoteProtocolError as exc:
            self.fail(exc)
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if self._handshake_timer:
            self._handshake_timer.cancel()
        if self._liveness_timer:
            self._liveness_timer.cancel()
        reason, message = self._close_reason or (
            (CloseReason.IO_ERROR, str(exc)) if exc else (CloseReason.PEER_CLOSED, "peer closed the connection")
        )
        error = ConnectionLost(f"connection to {self.describe()} lost: {message}", reason)
        if not self.established.done():
            self.established.set_exception(error)
            self.established.exception()  # mark retrieved: nobody may be waiting
        for fut in self._calls.values():
            if not fut.done():
                fut.set_exception(error)
        self._calls.clear()
        if not self.closed.done():
            self.closed.set_result(reason)
        self.handler.on_closed(self, reason, message)

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        self._schedule_flush()

    # -- liveness -------------------------------------------------------------

    def watch_liveness(self, timeout_s: float) -> None:
        """Ping the peer when it is silent and close the link when it stays silent for `timeout_s`.

        The decisions are the sans-IO `Liveness`; this only keeps its timer.
        """
        if self.is_closing() or self._liveness is not None:
            return
        loop = asyncio.get_running_loop()
        self._liveness = Liveness(timeout_s, loop.time())
        self._liveness_timer = loop.call_later(self._liveness.next_poll_in(loop.time()), self._liveness_tick)

    def _liveness_tick(self) -> None:
        live = self._liveness
        if live is None or self.is_closing():
            return
        loop = asyncio.get_running_loop()
        now = loop.time()
        verdict = live.poll(now)
        if verdict is LivenessVerdict.DEAD:
            self._link_timed_out(live.silent_s(now), live.pings_sent)
            return
        if verdict is LivenessVerdict.PING:
            self.frames_out += 1
            self._write([self.connection.ping(live.ping_sent(now))])
        self._liveness_timer = loop.call_later(max(0.01, live.next_poll_in(now)), self._liveness_tick)

    def _link_timed_out(self, silent_s: float, pings: int) -> None:
        message = f"nothing heard for {silent_s:.1f}s ({pings} pings unanswered or late)"
        self._close_reason = (CloseReason.LINK_TIMEOUT, message)
        LINK_TIMEOUTS[self.connection.peer_role] += 1
        log.warning("closing connection with %s: %s", self.describe(), message)
        # abort, not close: close() would wait for the unsent buffer to drain over the cut path, so the
        # application would hear of the loss only when the path came back.
        self.abort()

    # -- dispatch -------------------------------------------------------------

    def _dispatch(self, event: Any) -> None:
        if isinstance(event, DataArrived):
            self.handler.on_data(self, event)
        elif isinstance(event, EventArrived):
            self.handler.on_event(self, event)
        elif isinstance(event, CreditArrived):
            sender = self.connection.directory.outbound(self.peer_id, event.channel)
            if sender is not None:
                self.wake(sender)
        elif isinstance(event, RpcRequest):
            task = asyncio.create_task(self._serve_rpc(event))
            self._rpc_tasks.add(task)
            task.add_done_callback(self._rpc_tasks.discard)
        elif isinstance(event, RpcResponse):
            fut = self._calls.pop(event.call_id, None)
            if fut is not None and not fut.done():
                if event.ok:
                    fut.set_result(event.result)
                else:
                    fut.set_exception(RpcError.from_wire(str(event.result), event.error_type))
        elif isinstance(event, Established):
            if self._handshake_timer:
                self._handshake_timer.cancel()
            log.debug("connection established with %s", self.describe())
            self.established.set_result(event)
            self.handler.on_established(self)
        elif isinstance(event, PeerGoodbye):
            self._close_reason = (CloseReason.PEER_CLOSED, f"peer said goodbye: {event.reason}")
            if self.transport:
                self.transport.close()

    async def _serve_rpc(self, request: RpcRequest) -> None:
        try:
            result = await self.handler.on_rpc(self, request.method, request.args)
            if self.is_closing():
                return  # the link closed while the call ran: nobody is left to answer
            frame = self.connection.rpc_response(request.call_id, True, result)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the caller gets the error; this process keeps serving
            if self.is_closing():
                return  # as above; encoding would raise LocalProtocolError on the closed connection
            if isinstance(exc, RpcError):
                frame = self.connection.rpc_response(request.call_id, False, str(exc), exc.code)
            else:
                log.warning("rpc %s from %s failed: %s: %s", request.method, self.describe(), type(exc).__name__,
                            exc)
                frame = self.connection.rpc_response(request.call_id, False, str(exc), type(exc).__name__)
        self._write([frame])

    # -- sending --------------------------------------------------------------

    def is_closing(self) -> bool:
        return self.transport is None or self.transport.is_closing()

    def _write(self, chunks: list[bytes]) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        for chunk in chunks:
            self.bytes_out += len(chunk)
        self.transport.writelines(chunks)

    async def call(self, method: str, args: dict[str, Any] | None = None, *, timeout_s: float = 30.0) -> Any:
        """Call `method` on the peer and wait for its result."""
        if self.is_closing():
            raise ConnectionLost(f"connection to {self.describe()} is closed", CloseReason.PEER_CLOSED)
        call_id = next(self._call_ids)
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._calls[call_id] = fut
        self.frames_out += 1
        self._write([self.connection.rpc_request(call_id, method, args or {})])
        try:
            return await asyncio.wait_for(fut, timeout_s)
        except TimeoutError:
            raise ConnectionLost(f"{method} to {self.describe()} timed out after {timeout_s}s",
                                 CloseReason.TIMEOUT) from None
        finally:
            self._calls.pop(call_id, None)

    def send_credit(self, channel: int, credits: int) -> None:
        if not self.is_closing():
            self.frames_out += 1
            self._write([self.connection.credit(channel, credits)])

    def wake(self, sender: ChannelSender) -> None:
        """`sender` may have something to send: drain it soon (its priority events before any channel's data)."""
        self._ready[sender.channel_id] = sender
        if sender.has_priority():
            self._urgent[sender.channel_id] = sender
        self._schedule_flush()

    def _schedule_flush(self) -> None:
        if not self._flush_scheduled and (self._urgent or (self._ready and not self._paused)):
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self.is_closing():
            self._ready.clear()
            self._urgent.clear()
            return
        touched: dict[int, ChannelSender] = {}
        encode = self.connection.encode_outbound
        # Frames are gathered and handed to the transport together (one write, so one send, for a checkpoint's
        # barriers on all of a link's channels instead of one each); the data rounds hand them over every
        # FLUSH_CHUNK_BYTES, so a full transport still pauses them within that much.
        out: list[bytes] = []
        frames = 0
        # The link's priority queue first, paused or not: every priority event of every channel leaves
        # before the next data frame of any channel.
        while self._urgent:
            cid = next(iter(self._urgent))
            sender = self._urgent.pop(cid)
            while sender.has_priority():
                item = sender.pop_sendable()  # the priority lane comes first
                assert item is not None
                touched[cid] = sender
                frames += 1
                out += encode(cid, item)
        pending = 0
        while self._ready and not self._paused:
            for cid, sender in list(self._ready.items()):
                item = sender.pop_sendable()
                if item is None:
                    del self._ready[cid]
                    continue
                touched[cid] = sender
                frames += 1
                chunks = encode(cid, item)
                out += chunks
                if isinstance(item, SendData):
                    pending += len(item.buffer.data)
                elif sender.has_priority():  # a fence left: the priority events behind it are urgent now
                    self._urgent[cid] = sender
                if pending >= FLUSH_CHUNK_BYTES:
                    pending = 0
                    self._write(out)
                    out = []
                    if self._paused:
                        break
        if out:
            self._write(out)
        self.frames_out += frames
        for sender in touched.values():
            self.handler.on_sent(self, sender)
        if self._urgent:  # released by a fence after the priority round, and the data rounds paused since
            self._schedule_flush()

    def fail(self, exc: NetstackError) -> None:
        """Close because of `exc`, logging who broke what."""
        if self._close_reason is not None:
            return
        self._close_reason = (exc.reason, str(exc))
        PROTOCOL_FAILURES[exc.reason.value] += 1
        log.warning("closing connection with %s: %s (%s)", self.describe(), exc.reason.value, exc)
        if self.transport and not self.transport.is_closing():
            self.transport.write(self.connection.goodbye(f"{exc.reason.value}: {exc}"))
            self.transport.close()

    def close(self, reason: str = "closing") -> None:
        if self._close_reason is None:
            self._close_reason = (CloseReason.NORMAL, reason)
        if self.transport and not self.transport.is_closing():
            self.transport.write(self.connection.goodbye(reason))
            self.transport.close()

    def abort(self) -> None:
        if self.transport:
            self.transport.abort()


ConnectionFactory = Callable[[], Connection]


class _AdmittedLink(Link):
    """A link accepted by a listener: it takes a place in the listener's `Admission` until it closes."""

    def __init__(self, connection: Connection, handler: LinkHandler, listener: _Listener) -> None:
        super().__init__(connection, handler)
        self._listener = listener
        self.handshake_timeout_s = listener.limits.handshake_timeout_s

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if not self._listener.admit(self, transport):
            self.transport = transport  # type: ignore[assignment]
            self._close_reason = (CloseReason.NORMAL, "listener at its connection limit")
            return
        super().connection_made(transport)
        self.established.add_done_callback(lambda _: self._listener.admission.activate(self))

    def connection_lost(self, exc: Exception | None) -> None:
        self._listener.admission.release(self)
        super().connection_lost(exc)


class _Listener:
    """One listening socket's admission, and the warning that says it is shedding connections."""

    def __init__(self, name: str, limits: ListenerLimits) -> None:
        self.name = name
        self.limits = limits
        self.admission: Admission[Link] = Admission(limits.max_connections, limits.max_pending)
        self._warned_at = -1e9

    def admit(self, link: Link, transport: asyncio.BaseTransport) -> bool:
        admitted, evicted = self.admission.admit(link)
        for old in evicted:
            SHED["evicted"] += 1
            old._close_reason = old._close_reason or (CloseReason.TIMEOUT, "evicted while awaiting its handshake")
            old.abort()
        if not admitted:
            SHED["refused"] += 1
            transport.abort()  # type: ignore[attr-defined]  # a stream transport
        if (evicted or not admitted) and time.monotonic() - self._warned_at > 10.0:
            self._warned_at = time.monotonic()  # once in a while: a flood must not flood the log too
            stats = self.admission.statistics()
            log.warning("%s listener shedding connections: %d pending, %d active (limits %d pending, %d in all); "
                        "%d evicted, %d refused so far", self.name, stats.pending, stats.active,
                        self.admission.max_pending, self.admission.max_connections, stats.evicted, stats.refused)
        return admitted


async def serve(
    host: str, port: int, make_connection: ConnectionFactory, handler: LinkHandler, *,
    limits: ListenerLimits | None = None, ssl_context: ssl.SSLContext | None = None, name: str = "rpc",
) -> tuple[asyncio.Server, int]:
    """Listen for links; returns the server and the bound port (port 0 picks one).

    `limits` bounds the connections held (see netstack/limits.py); `ssl_context` makes every link TLS.
    """
    loop = asyncio.get_running_loop()
    listener = _Listener(name, limits or ListenerLimits())

    def make_link() -> _AdmittedLink:
        return _AdmittedLink(make_connection(), handler, listener)

    if ssl_context is not None:
        tls = _TlsServer(_listening_socket(host, port), make_link, ssl_context,
                         listener.limits.handshake_timeout_s or HANDSHAKE_TIMEOUT_S, name)
        return tls, tls.port  # type: ignore[return-value]  # serves what callers use of an asyncio.Server
    server = await loop.create_server(make_link, host, port, backlog=1024)
    bound = server.sockets[0].getsockname()[1]
    return server, bound


def _listening_socket(host: str, port: int) -> socket.socket:
    info = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    sock = socket.create_server(info[4][:2], family=info[0], backlog=1024)
    sock.setblocking(False)
    return sock


class _TlsServer:
    """A TLS listener that accepts TCP itself and runs each TLS handshake in its own task.

    asyncio's (and uvloop's) server-side TLS drops a failed handshake without a word: a peer without the
    cluster's certificate, a plain-TCP client, or one that stalled past the handshake timeout left nothing in
    the log. Here every refusal is one warning line naming the peer's address and the reason. Offers what
    callers use of an asyncio.Server: `sockets`, `close`, `wait_closed`, `is_serving`."""

    def __init__(self, sock: socket.socket, make_link: Callable[[], _AdmittedLink], context: ssl.SSLContext,
                 timeout_s: float, name: str) -> None:
        self.sockets = [sock]
        self.port = sock.getsockname()[1]
        self._sock, self._make_link, self._context, self._timeout_s, self._name = (sock, make_link, context,
                                                                                   timeout_s, name)
        self._handshakes: set[asyncio.Future[None]] = set()
        self._accepting = asyncio.ensure_future(self._accept_loop())

    async def _accept_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, address = await loop.sock_accept(self._sock)
            except OSError as exc:  # EMFILE and the like: the listener lives on
                log.warning("%s listener: accept failed: %s", self._name, exc)
                await asyncio.sleep(0.1)
                continue
            task = asyncio.ensure_future(self._handshake(conn, address))
            self._handshakes.add(task)
            task.add_done_callback(self._handshakes.discard)

    async def _handshake(self, conn: socket.socket, address: Any) -> None:
        try:
            await asyncio.get_running_loop().connect_accepted_socket(
                self._make_link, conn, ssl=self._context, ssl_handshake_timeout=self._timeout_s)
        except (OSError, TimeoutError, EOFError) as exc:
            where = f"{address[0]}:{address[1]}" if isinstance(address, tuple) else str(address)
            reason = getattr(exc, "reason", None) or str(exc) or type(exc).__name__
            log.warning("%s listener: TLS handshake from %s refused: %s", self._name, where, reason)
            conn.close()

    def is_serving(self) -> bool:
        return not self._accepting.done()

    def close(self) -> None:
        self._accepting.cancel()
        for task in list(self._handshakes):
            task.cancel()
        self._sock.close()

    async def wait_closed(self) -> None:
        await asyncio.gather(self._accepting, *self._handshakes, return_exceptions=True)


async def dial(host: str, port: int, connection: Connection, handler: LinkHandler, *,
               timeout_s: float = 10.0, ssl_context: ssl.SSLContext | None = None) -> Link:
    """Connect and complete the handshake, or raise ConnectionLost."""
    loop = asyncio.get_running_loop()
    try:
        _, link = await asyncio.wait_for(
            loop.create_connection(lambda: Link(connection, handler), host, port, ssl=ssl_context,
                                   server_hostname=host if ssl_context else None,
                                   ssl_handshake_timeout=timeout_s if ssl_context else None), timeout_s)
    except ssl.SSLError as exc:
        raise ConnectionLost(f"TLS handshake with {host}:{port} failed: {exc}", CloseReason.BAD_HANDSHAKE) from exc
    except (OSError, TimeoutError) as exc:
        raise ConnectionLost(f"cannot connect to {host}:{port}: {exc}", CloseReason.IO_ERROR) from exc
    try:
        await asyncio.wait_for(asyncio.shield(link.established), timeout_s)
    except TimeoutError:
        link.abort()
        raise ConnectionLost(f"no handshake from {host}:{port}", CloseReason.TIMEOUT) from None
    except ConnectionLost as exc:
        if ssl_context is None or link.bytes_in:
            raise
        # With TLS 1.3 a listener checks our certificate after our side of the TLS handshake is done; a
        # refusal then arrives as a closed connection before the listener said a word.
        raise ConnectionLost(f"TLS: {host}:{port} closed the connection after the TLS handshake without a "
                             f"word: it refused this process's certificate (none, or not signed by the CA it "
                             f"trusts, its --tls-ca) ({exc})", CloseReason.BAD_HANDSHAKE) from exc
    return link


