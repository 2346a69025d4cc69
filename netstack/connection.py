"""Per-connection protocol state machine, without I/O.

Feed it bytes with `receive_data`, get back a list of protocol events; ask it
for the bytes of frames to send. It runs the handshake (protocol version and
cluster token), checks that each frame is allowed in the current state (a
table, not nested ifs), and checks data-plane frames against the channel
directory: a data buffer must name a channel this process consumes from that
peer and must be covered by credit.

Any violation raises `RemoteProtocolError` with a `CloseReason`; the caller
(the transport) logs it with the peer's name and closes only this connection.
"""

from __future__ import annotations

import enum
import hmac
from dataclasses import dataclass
from typing import Any, Protocol

import msgpack

from netstack.credit import Buffer, ChannelSender, CreditLedger, Event, SendData, SendEvent
from netstack.errors import CloseReason, LocalProtocolError, RemoteProtocolError
from netstack.frames import (
    CREDIT_PAYLOAD,
    DATA_PREFIX,
    DEFAULT_MAX_FRAME_BYTES,
    FLAG_PRIORITY,
    NO_RECORD_START,
    PROTOCOL_VERSION,
    Frame,
    FrameDecoder,
    FrameType,
    encode_frame,
    encode_header,
)


class State(enum.Enum):
    AWAIT_HELLO = "await hello"  # server side, before the peer introduced itself
    AWAIT_ACK = "await ack"  # client side, hello sent
    OPEN = "open"
    CLOSED = "closed"


_OPEN_FRAMES = frozenset({
    FrameType.DATA, FrameType.EVENT, FrameType.CREDIT, FrameType.RPC_REQUEST, FrameType.RPC_RESPONSE,
    FrameType.GOODBYE, FrameType.PING, FrameType.PONG,
})
ALLOWED: dict[State, frozenset[FrameType]] = {
    State.AWAIT_HELLO: frozenset({FrameType.HELLO}),
    State.AWAIT_ACK: frozenset({FrameType.HELLO_ACK, FrameType.GOODBYE}),
    State.OPEN: _OPEN_FRAMES,
    State.CLOSED: frozenset(),
}


class ChannelDirectory(Protocol):
    """What this process knows about the logical channels it shares with a peer."""

    def inbound(self, peer_id: str, channel_id: int) -> CreditLedger | None: ...

    def outbound(self, peer_id: str, channel_id: int) -> ChannelSender | None: ...


class NoChannels:
    """Directory of a connection that carries RPC only."""

    def inbound(self, peer_id: str, channel_id: int) -> CreditLedger | None:
        return None

    def outbound(self, peer_id: str, channel_id: int) -> ChannelSender | None:
        return None


# -- events handed to the transport -------------------------------------------------


@dataclass(frozen=True, slots=True)
class Established:
    peer_id: str
    peer_role: str
    peer_info: dict[str, Any]


@dataclass(frozen=True, slots=True)
class DataArrived:
    channel: int
    seq: int
    buffer: Buffer
    backlog: int


@dataclass(frozen=True, slots=True)
class EventArrived:
    channel: int
    seq: int
    event: Event
    priority: bool


@dataclass(frozen=True, slots=True)
class CreditArrived:
    channel: int
    credits: int


@dataclass(frozen=True, slots=True)
class RpcRequest:
    call_id: int
    method: str
    args: dict[str, Any]


@dataclass(frozen=True, slots=True)
class RpcResponse:
    call_id: int
    ok: bool
    result: Any
    error_type: str


@dataclass(frozen=True, slots=True)
class PeerGoodbye:
    reason: str


@dataclass(frozen=True, slots=True)
class PingArrived:
    nonce: int  # answered already: the PONG is among the replies of `receive_data`


@dataclass(frozen=True, slots=True)
class PongArrived:
    nonce: int


ProtocolEvent = (Established | DataArrived | EventArrived | CreditArrived | RpcRequest | RpcResponse | PeerGoodbye
                 | PingArrived | PongArrived)


class LivenessVerdict(enum.Enum):
    QUIET = "quiet"  # heard from recently: nothing to do
    PING = "ping"  # silent for a while: send a PING so a healthy peer answers
    DEAD = "dead"  # silent for the whole timeout: the link is broken


class Liveness:
    """When to ping a silent peer and when to give up on it; time is passed in, never read.

    A TCP connection whose path is cut (a pulled cable, a dropped veth, a
    partition) raises nothing for many minutes: the kernel keeps retransmitting.
    So every byte received counts as a sign of life, a peer silent for
    `ping_every_s` is sent a PING (which any healthy peer answers at once with
    a PONG, however idle its channels), and a peer silent for `timeout_s` is
    declared dead. Both ends run this, so each detects the cut on its own.
    """

    def __init__(self, timeout_s: float, now: float, *, ping_every_s: float | None = None) -> None:
        if timeout_s <= 0:
            raise LocalProtocolError(f"link timeout must be positive, not {timeout_s}")
        self.timeout_s = timeout_s
        self.ping_every_s = ping_every_s if ping_every_s is not None else timeout_s / 3
        self.last_heard = now
        self._last_ping = float("-inf")
        self._nonce = 0
        self.pings_sent = 0

    def heard(self, now: float) -> None:
        self.last_heard = max(self.last_heard, now)

    def silent_s(self, now: float) -> float:
        return now - self.last_heard

    def poll(self, now: float) -> LivenessVerdict:
        silent = now - self.last_heard
        if silent >= self.timeout_s:
            return LivenessVerdict.DEAD
        if silent >= self.ping_every_s and now - self._last_ping >= self.ping_every_s:
            return LivenessVerdict.PING
        return LivenessVerdict.QUIET

    def ping_sent(self, now: float) -> int:
        """Record a PING sent at `now`; returns its nonce."""
        self._last_ping = now
        self._nonce += 1
        self.pings_sent += 1
        return self._nonce

    def next_poll_in(self, now: float) -> float:
        """Seconds until `poll` can give a different verdict (the transport sleeps that long)."""
        deadline = self.last_heard + self.timeout_s
        ping_at = max(self.last_heard + self.ping_every_s, self._last_ping + self.ping_every_s)
        return max(0.0, min(deadline, ping_at) - now)


def _unpack(payload: bytes, what: str) -> Any:
    try:
        return msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises several types for bad input, some with an empty message
        why = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        raise RemoteProtocolError(f"{what} payload does not decode: {why}", CloseReason.BAD_PAYLOAD) from None


class Connection:
    """Sans-IO protocol for one TCP connection, from this process's side."""

    def __init__(
        self,
        *,
        local_id: str,
        role: str,
        token: str,
        is_client: bool,
        directory: ChannelDirectory | None = None,
        info: dict[str, Any] | None = None,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
    ) -> None:
        self.local_id = local_id
        self.role = role
        self._token = token
        self.is_client = is_client
        self.directory: ChannelDirectory = directory or NoChannels()
        self._info = info or {}
        self._decoder = FrameDecoder(max_frame_bytes=max_frame_bytes)
        self.state = State.AWAIT_ACK if is_client else State.AWAIT_HELLO
        self.peer_id = "?"
        self.peer_role = "?"
        # An event is often the same on many channels (a checkpoint's barrier on every subpartition of a task,
        # 500 at parallelism 500): it is encoded once for all of them, and a payload equal to the last one
        # received is not decoded again (the same `Event` is handed on; bodies are read-only by contract).
        self._sent_event: tuple[Event, bytes] | None = None
        self._received_event: tuple[bytes, Event] | None = None

    # -- sending --------------------------------------------------------------

    def hello(self) -> bytes:
        if not self.is_client:
            raise LocalProtocolError("only the dialling side says hello")
        body = {"version": PROTOCOL_VERSION, "token": self._token, "id": self.local_id, "role": self.role,
                "info": self._info}
        return encode_frame(FrameType.HELLO, msgpack.packb(body))

    def _require_open(self) -> None:
        if self.state is not State.OPEN:
            raise LocalProtocolError(f"cannot send in state {self.state.value}")

    def encode_outbound(self, channel: int, item: SendData | SendEvent) -> list[bytes]:
        """Frame bytes for one item popped from a ChannelSender (header and payload kept apart)."""
        self._require_open()
        if isinstance(item, SendData):
            buf = item.buffer
            offset = NO_RECORD_START if buf.first_record_offset < 0 else buf.first_record_offset
            prefix = DATA_PREFIX.pack(item.backlog, offset)
            header = encode_header(FrameType.DATA, 0, channel, item.seq, len(prefix) + len(buf.data))
            return [header, prefix, buf.data]
        flags = FLAG_PRIORITY if item.priority else 0
        sent = self._sent_event
        if sent is not None and sent[0] is item.event:
            payload = sent[1]
        else:
            payload = msgpack.packb(item.event.body)
            self._sent_event = (item.event, payload)
        return [encode_header(FrameType.EVENT, flags, channel, item.seq, len(payload)), payload]

    def credit(self, channel: int, credits: int) -> bytes:
        self._require_open()
        return encode_frame(FrameType.CREDIT, CREDIT_PAYLOAD.pack(credits), channel=channel)

    def rpc_request(self, call_id: int, method: str, args: dict[str, Any]) -> bytes:
        self._require_open()
        return encode_frame(FrameType.RPC_REQUEST, msgpack.packb([method, args]), seq=call_id)

    def rpc_response(self, call_id: int, ok: bool, result: Any, error_type: str = "") -> bytes:
        self._require_open()
        return encode_frame(FrameType.RPC_RESPONSE, msgpack.packb([ok, result, error_type]), seq=call_id)

    def ping(self, nonce: int) -> bytes:
        self._require_open()
        return encode_frame(FrameType.PING, seq=nonce)

    def goodbye(self, reason: str) -> bytes:
        """Last words before closing; allowed in any state so a refused peer learns why."""
        self.state = State.CLOSED
        return encode_frame(FrameType.GOODBYE, msgpack.packb({"reason": reason}))

    # -- receiving ------------------------------------------------------------

    def receive_data(self, data: bytes) -> tuple[list[ProtocolEvent], list[bytes]]:
        """Events for the transport, and bytes to send back (the handshake reply)."""
        self._decoder.receive_data(data)
        events: list[ProtocolEvent] = []
        replies: list[bytes] = []
        while self.state is not State.CLOSED:
            frame = self._decoder.next_frame()
            if frame is None:
                break
            events.append(self._handle(frame, replies))
        return events, replies

    def eof(self) -> None:
        self._decoder.eof()
        self.state = State.CLOSED

    def _handle(self, frame: Frame, replies: list[bytes]) -> ProtocolEvent:
        if frame.type not in ALLOWED[self.state]:
            raise RemoteProtocolError(
                f"{frame.type.name} frame not allowed while {self.state.value}", CloseReason.UNEXPECTED
            )
        handler = _HANDLERS[frame.type]
        return handler(self, frame, replies)

    def _on_hello(self, frame: Frame, replies: list[bytes]) -> ProtocolEvent:
        body = _unpack(frame.payload, "hello")
        if not isinstance(body, dict) or not isinstance(body.get("id"), str) or "token" not in body:
            raise RemoteProtocolError("hello without id and token", CloseReason.BAD_HANDSHAKE)
        self.peer_id = body["id"]
        self.peer_role = str(body.get("role", "?"))
        if body.get("version") != PROTOCOL_VERSION:
            raise RemoteProtocolError(f"hello for protocol version {body.get('version')}", CloseReason.BAD_VERSION)
        token = body["token"]
        if not isinstance(token, str) or not hmac.compare_digest(token.encode(), self._token.encode()):
            raise RemoteProtocolError("wrong cluster token", CloseReason.BAD_TOKEN)
        self.state = State.OPEN
        replies.append(encode_frame(FrameType.HELLO_ACK, msgpack.packb({"id": self.local_id, "role": self.role,
                                                                         "info": self._info})))
        info = body.get("info")
        return Established(self.peer_id, self.peer_role, info if isinstance(info, dict) else {})

    def _on_hello_ack(self, frame: Frame, replies: list[bytes]) -> ProtocolEvent:
        body = _unpack(frame.payload, "hello ack")
        if not isinstance(body, dict) or not isinstance(body.get("id"), str):
            raise RemoteProtocolError("hello ack without id", CloseReason.BAD_HANDSHAKE)
        self.peer_id = body["id"]
        self.peer_role = str(body.get("role", "?"))
        self.state = State.OPEN
        info = body.get("info")
        return Established(self.peer_id, self.peer_role, info if isinstance(info, dict) else {})

    def _on_data(self, frame: Frame, replies: list[bytes]) -> ProtocolEvent:
        ledger = self.directory.inbound(self.peer_id, frame.channel)
        if ledger is None:
            raise RemoteProtocolError(f"data for unknown channel {frame.channel}", CloseReason.UNKNOWN_CHANNEL)
        if len(frame.payload) < DATA_PREFIX.size:
            raise RemoteProtocolError("data frame shorter than its prefix", CloseReason.BAD_PAYLOAD)
        backlog, offset = DATA_PREFIX.unpack_from(frame.payload)
        ledger.on_data(frame.channel, frame.seq, backlog)
        data = frame.payload[DATA_PREFIX.size :]
        if offset != NO_RECORD_START and offset > len(data):
            raise RemoteProtocolError(f"record offset {offset} beyond buffer of {len(data)}", CloseReason.BAD_PAYLOAD)
        first = -1 if offset == NO_RECORD_START else offset
        return DataArrived(frame.channel, frame.seq, Buffer(data, first), backlog)

    def _on_event(self, frame: Frame, replies: list[bytes]) -> ProtocolEvent:
        ledger = self.directory.inbound(self.peer_id, frame.channel)
        if ledger is None:
            raise RemoteProtocolError(f"event for unknown channel {frame.channel}", CloseReason.UNKNOWN_CHANNEL)
        priority = bool(frame.flags & FLAG_PRIORITY)
        received = self._received_event
        if received is not None and received[0] == frame.payload:
            event = received[1]
        else:
            body = _unpack(frame.payload, "event")
            if not isinstance(body, dict):
                raise RemoteProtocolError("event body is not a map", CloseReason.BAD_PAYLOAD)
            event = Event(body)
            self._received_event = (frame.payload, event)
        ledger.on_event(frame.channel, frame.seq, priority)
        return EventArrived(frame.channel, frame.seq, event, priority)

    def _on_credit(self, frame: Frame, replies: list[bytes]) -> ProtocolEvent:
        sender = self.directory.outbound(self.peer_id, frame.channel)
        if sender is None:
            raise RemoteProtocolError(f"credit for unknown channel {frame.channel}", CloseReason.UNKNOWN_CHANNEL)
        if len(frame.payload) != CREDIT_PAYLOAD.size:
            raise RemoteProtocolError("credit frame of wrong size", CloseReason.BAD_PAYLOAD)
        (credits,) = CREDIT_PAYLOAD.unpack(frame.payload)
        sender.add_credit(credits)
        return CreditArrived(frame.channel, credits)

    def _on_rpc_request(self, frame: Frame, replies: list[bytes]) -> ProtocolEvent:
        body = _unpack(frame.payload, "rpc request")
        if not (isinstance(body, list) and len(body) == 2 and isinstance(body[0], str) and isinstance(body[1], dict)):
            raise RemoteProtocolError("rpc request is not [method, args]", CloseReason.BAD_PAYLOAD)
        return RpcRequest(frame.seq, body[0], body[1])

    def _on_rpc_response(self, frame: Frame, replies: list[bytes]) -> ProtocolEvent:
        body = _unpack(frame.payload, "rpc response")
        if not (isinstance(body, list) and len(body) == 3):
            raise RemoteProtocolError("rpc response is not [ok, result, error_type]", CloseReason.BAD_PAYLOAD)
        return RpcResponse(frame.seq, bool(body[0]), body[1], str(body[2]))

    def _on_goodbye(self, frame: Frame, replies: list[bytes]) -> ProtocolEvent:
        body = _unpack(frame.payload, "goodbye")
        self.state = State.CLOSED
        return PeerGoodbye(str(body.get("reason", "")) if isinstance(body, dict) else "")

    def _on_ping(self, frame: Frame, replies: list[bytes]) -> ProtocolEvent:
        # Answered here, not by the application: liveness must not depend on any task being responsive.
        replies.append(encode_frame(FrameType.PONG, seq=frame.seq))
        return PingArrived(frame.seq)

    def _on_pong(self, frame: Frame, replies: list[bytes]) -> ProtocolEvent:
        return PongArrived(frame.seq)


_HANDLERS = {
    FrameType.HELLO: Connection._on_hello,
    FrameType.HELLO_ACK: Connection._on_hello_ack,
    FrameType.DATA: Connection._on_data,
    FrameType.EVENT: Connection._on_event,
    FrameType.CREDIT: Connection._on_credit,
    FrameType.RPC_REQUEST: Connection._on_rpc_request,
    FrameType.RPC_RESPONSE: Connection._on_rpc_response,
    FrameType.GOODBYE: Connection._on_goodbye,
    FrameType.PING: Connection._on_ping,
    FrameType.PONG: Connection._on_pong,
}
