"""The sans-IO Connection: handshake, frame admission by state, data-plane checks, RPC framing, goodbye.

Two Connection objects are wired back to back in memory (h11's ConnectionPair);
hostile input is built frame by frame with `encode_frame`.
"""

from __future__ import annotations

from typing import Any

import msgpack
import pytest

from netstack.connection import (
    Connection,
    CreditArrived,
    DataArrived,
    Established,
    EventArrived,
    PeerGoodbye,
    ProtocolEvent,
    RpcRequest,
    RpcResponse,
    State,
)
from netstack.credit import Buffer, ChannelSender, CreditLedger, Event, SendData, SendEvent
from netstack.errors import CloseReason, LocalProtocolError, RemoteProtocolError
from netstack.frames import (
    CREDIT_PAYLOAD,
    DATA_PREFIX,
    FLAG_PRIORITY,
    NO_RECORD_START,
    PROTOCOL_VERSION,
    FrameType,
    encode_frame,
)

TOKEN = "s3cret-token"


class Directory:
    """A tiny ChannelDirectory: ledgers and senders registered by (peer, channel)."""

    def __init__(self) -> None:
        self.ledgers: dict[tuple[str, int], CreditLedger] = {}
        self.senders: dict[tuple[str, int], ChannelSender] = {}

    def add_inbound(self, peer_id: str, channel: int, *, exclusive: int = 2, floating: int = 0) -> CreditLedger:
        ledger = CreditLedger([channel], exclusive=exclusive, floating=floating)
        self.ledgers[(peer_id, channel)] = ledger
        return ledger

    def add_outbound(self, peer_id: str, channel: int) -> ChannelSender:
        sender = ChannelSender(channel)
        self.senders[(peer_id, channel)] = sender
        return sender

    def inbound(self, peer_id: str, channel_id: int) -> CreditLedger | None:
        return self.ledgers.get((peer_id, channel_id))

    def outbound(self, peer_id: str, channel_id: int) -> ChannelSender | None:
        return self.senders.get((peer_id, channel_id))


class ConnectionPair:
    """A client and a server Connection joined in memory."""

    def __init__(self, *, client_token: str = TOKEN, server_token: str = TOKEN, **server_kwargs: Any) -> None:
        self.client_dir = Directory()
        self.server_dir = Directory()
        self.client = Connection(local_id="w1", role="worker", token=client_token, is_client=True,
                                 directory=self.client_dir, info={"slots": 4})
        self.server = Connection(local_id="w2", role="worker", token=server_token, is_client=False,
                                 directory=self.server_dir, info={"zone": "a"}, **server_kwargs)

    def handshake(self) -> tuple[list[ProtocolEvent], list[ProtocolEvent]]:
        server_events, replies = self.server.receive_data(self.client.hello())
        assert len(replies) == 1
        client_events, client_replies = self.client.receive_data(b"".join(replies))
        assert client_replies == []
        return client_events, server_events

    def to_server(self, *chunks: bytes) -> list[ProtocolEvent]:
        events, replies = self.server.receive_data(b"".join(chunks))
        assert replies == []
        return events

    def to_client(self, *chunks: bytes) -> list[ProtocolEvent]:
        events, replies = self.client.receive_data(b"".join(chunks))
        assert replies == []
        return events


def open_pair(**kwargs: Any) -> ConnectionPair:
    pair = ConnectionPair(**kwargs)
    pair.handshake()
    return pair


def refused(conn: Connection, data: bytes) -> RemoteProtocolError:
    with pytest.raises(RemoteProtocolError) as info:
        conn.receive_data(data)
    return info.value


_DROP = object()  # marks a hello field to leave out


def hello_frame(**overrides: Any) -> bytes:
    body: dict[str, Any] = {"version": PROTOCOL_VERSION, "token": TOKEN, "id": "w9", "role": "worker", "info": {}}
    body.update(overrides)
    body = {k: v for k, v in body.items() if v is not _DROP}
    return encode_frame(FrameType.HELLO, msgpack.packb(body))


# -- handshake ------------------------------------------------------------------------


def test_handshake_opens_both_sides_and_exchanges_identities() -> None:
    pair = ConnectionPair()
    assert pair.client.state is State.AWAIT_ACK
    assert pair.server.state is State.AWAIT_HELLO
    client_events, server_events = pair.handshake()
    assert server_events == [Established("w1", "worker", {"slots": 4})]
    assert client_events == [Established("w2", "worker", {"zone": "a"})]
    assert pair.client.state is State.OPEN and pair.server.state is State.OPEN
    assert (pair.client.peer_id, pair.server.peer_id) == ("w2", "w1")


def test_handshake_fed_byte_by_byte() -> None:
    pair = ConnectionPair()
    hello = pair.client.hello()
    events: list[ProtocolEvent] = []
    replies: list[bytes] = []
    for i in range(len(hello)):
        ev, rep = pair.server.receive_data(hello[i : i + 1])
        events += ev
        replies += rep
    assert events == [Established("w1", "worker", {"slots": 4})]
    assert len(replies) == 1


def test_only_the_client_says_hello() -> None:
    with pytest.raises(LocalProtocolError):
        ConnectionPair().server.hello()


def test_nothing_can_be_sent_before_the_handshake() -> None:
    pair = ConnectionPair()
    with pytest.raises(LocalProtocolError):
        pair.client.rpc_request(1, "ping", {})
    with pytest.raises(LocalProtocolError):
        pair.server.credit(1, 1)
    with pytest.raises(LocalProtocolError):
        pair.client.encode_outbound(1, SendEvent(0, Event({}), True))


def test_wrong_token_is_refused_without_reply() -> None:
    pair = ConnectionPair(client_token="guess")
    with pytest.raises(RemoteProtocolError) as info:
        pair.server.receive_data(pair.client.hello())
    assert info.value.reason is CloseReason.BAD_TOKEN
    assert pair.server.state is State.AWAIT_HELLO  # never opened
    # The refused peer's claimed id is known, so the log can name it.
    assert pair.server.peer_id == "w1"


@pytest.mark.parametrize("token", [123, None, b"s3cret-token", ""])
def test_token_of_wrong_type_or_empty_is_refused(token: Any) -> None:
    server = ConnectionPair().server
    assert refused(server, hello_frame(token=token)).reason is CloseReason.BAD_TOKEN


@pytest.mark.parametrize("version", [PROTOCOL_VERSION + 1, 0, "1", _DROP])
def test_wrong_protocol_version_in_hello(version: Any) -> None:
    server = ConnectionPair().server
    assert refused(server, hello_frame(version=version)).reason is CloseReason.BAD_VERSION
    assert server.state is State.AWAIT_HELLO


def test_version_is_checked_before_the_token() -> None:
    server = ConnectionPair().server
    assert refused(server, hello_frame(version=99, token="wrong")).reason is CloseReason.BAD_VERSION


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (msgpack.packb(["not", "a", "map"]), CloseReason.BAD_HANDSHAKE),
        (msgpack.packb({"token": TOKEN, "version": PROTOCOL_VERSION}), CloseReason.BAD_HANDSHAKE),
        (msgpack.packb({"id": 7, "token": TOKEN, "version": PROTOCOL_VERSION}), CloseReason.BAD_HANDSHAKE),
        (msgpack.packb({"id": "w9", "version": PROTOCOL_VERSION}), CloseReason.BAD_HANDSHAKE),
        (b"\xc1", CloseReason.BAD_PAYLOAD),  # 0xc1 is never valid msgpack
        (b"\x92\x01", CloseReason.BAD_PAYLOAD),  # truncated array
    ],
)
def test_malformed_hello(payload: bytes, reason: CloseReason) -> None:
    server = ConnectionPair().server
    assert refused(server, encode_frame(FrameType.HELLO, payload)).reason is reason


def test_malformed_hello_ack() -> None:
    pair = ConnectionPair()
    pair.client.hello()
    err = refused(pair.client, encode_frame(FrameType.HELLO_ACK, msgpack.packb({"role": "x"})))
    assert err.reason is CloseReason.BAD_HANDSHAKE
    assert pair.client.state is State.AWAIT_ACK


def test_hello_info_that_is_not_a_map_is_ignored() -> None:
    server = ConnectionPair().server
    events, _ = server.receive_data(hello_frame(info=[1, 2]))
    assert events == [Established("w9", "worker", {})]


@pytest.mark.parametrize(
    "ftype",
    [FrameType.DATA, FrameType.EVENT, FrameType.CREDIT, FrameType.RPC_REQUEST, FrameType.RPC_RESPONSE,
     FrameType.HELLO_ACK, FrameType.GOODBYE],
)
def test_server_accepts_nothing_but_hello_first(ftype: FrameType) -> None:
    server = ConnectionPair().server
    err = refused(server, encode_frame(ftype, msgpack.packb({}), channel=1, seq=1))
    assert err.reason is CloseReason.UNEXPECTED
    assert server.state is State.AWAIT_HELLO


@pytest.mark.parametrize("ftype", [FrameType.HELLO, FrameType.DATA, FrameType.RPC_REQUEST, FrameType.CREDIT])
def test_client_accepts_only_ack_or_goodbye_before_open(ftype: FrameType) -> None:
    pair = ConnectionPair()
    pair.client.hello()
    assert refused(pair.client, encode_frame(ftype, msgpack.packb({}))).reason is CloseReason.UNEXPECTED


@pytest.mark.parametrize("ftype", [FrameType.HELLO, FrameType.HELLO_ACK])
def test_no_second_handshake_once_open(ftype: FrameType) -> None:
    pair = open_pair()
    assert refused(pair.server, encode_frame(ftype, msgpack.packb({}))).reason is CloseReason.UNEXPECTED
    assert refused(pair.client, encode_frame(ftype, msgpack.packb({}))).reason is CloseReason.UNEXPECTED


def test_refused_client_hears_why_in_a_goodbye() -> None:
    pair = ConnectionPair()
    pair.client.hello()
    events = pair.to_client(pair.server.goodbye("wrong cluster token"))
    assert events == [PeerGoodbye("wrong cluster token")]
    assert pair.client.state is State.CLOSED and pair.server.state is State.CLOSED


def test_oversized_frame_is_refused() -> None:
    pair = open_pair(max_frame_bytes=128)  # the handshake fits
    assert pair.to_server(pair.client.rpc_request(1, "x", {"blob": "x" * 64})) == [
        RpcRequest(1, "x", {"blob": "x" * 64})
    ]
    err = refused(pair.server, pair.client.rpc_request(2, "x", {"blob": "x" * 200}))
    assert err.reason is CloseReason.OVERSIZED


# -- data plane -------------------------------------------------------------------------


def data_pair(*, exclusive: int = 2) -> tuple[ConnectionPair, ChannelSender, CreditLedger]:
    """Client w1 produces on channel 5; server w2 consumes it."""
    pair = open_pair()
    sender = pair.client_dir.add_outbound("w2", 5)
    ledger = pair.server_dir.add_inbound("w1", 5, exclusive=exclusive)
    return pair, sender, ledger


def announce(pair: ConnectionPair, ledger: CreditLedger) -> list[ProtocolEvent]:
    frames = [pair.server.credit(ch, n) for ch, n in ledger.take_announcements().items()]
    return pair.to_client(*frames)


def send_ready(pair: ConnectionPair, sender: ChannelSender) -> list[ProtocolEvent]:
    chunks: list[bytes] = []
    while (item := sender.pop_sendable()) is not None:
        chunks += pair.client.encode_outbound(sender.channel_id, item)
    return pair.to_server(*chunks)


def test_credit_then_data_and_events_flow_in_order() -> None:
    pair, sender, ledger = data_pair(exclusive=2)
    sender.add_buffer(Buffer(b"first", 0))
    sender.add_buffer(Buffer(b"second", -1))
    sender.add_event(Event({"kind": "end_of_partition"}))
    assert send_ready(pair, sender) == []  # no credit yet
    assert announce(pair, ledger) == [CreditArrived(5, 2)]
    assert sender.credit == 2
    assert send_ready(pair, sender) == [
        DataArrived(5, 1, Buffer(b"first", 0), 1),
        DataArrived(5, 2, Buffer(b"second", -1), 0),  # NO_RECORD_START round-trips as -1
        EventArrived(5, 3, Event({"kind": "end_of_partition"}), False),
    ]
    ledger.check_invariant()
    assert ledger.statistics().held == 2


def test_priority_event_overtakes_on_the_wire() -> None:
    pair, sender, ledger = data_pair(exclusive=1)
    for tag in (b"a", b"b", b"c"):
        sender.add_buffer(Buffer(tag))
    announce(pair, ledger)
    assert send_ready(pair, sender) == [DataArrived(5, 1, Buffer(b"a"), 2)]
    assert sender.add_priority_event(Event({"barrier": 3})) == [Buffer(b"b"), Buffer(b"c")]
    assert send_ready(pair, sender) == [EventArrived(5, 1, Event({"barrier": 3}), True)]


def test_data_for_an_unknown_channel() -> None:
    pair, _, _ = data_pair()
    frames = pair.client.encode_outbound(6, SendData(1, Buffer(b"x"), 0))
    assert refused(pair.server, b"".join(frames)).reason is CloseReason.UNKNOWN_CHANNEL


def test_channel_known_for_another_peer_is_unknown_for_this_one() -> None:
    pair = open_pair()
    pair.server_dir.add_inbound("someone-else", 5)
    frames = pair.client.encode_outbound(5, SendData(1, Buffer(b"x"), 0))
    assert refused(pair.server, b"".join(frames)).reason is CloseReason.UNKNOWN_CHANNEL


def test_event_and_credit_for_unknown_channels() -> None:
    pair, _, _ = data_pair()
    event = pair.client.encode_outbound(9, SendEvent(0, Event({}), True))
    assert refused(pair.server, b"".join(event)).reason is CloseReason.UNKNOWN_CHANNEL
    assert refused(pair.client, pair.server.credit(9, 1)).reason is CloseReason.UNKNOWN_CHANNEL


def test_data_without_credit() -> None:
    pair, _, ledger = data_pair(exclusive=1)
    # The credit exists in the ledger but was never announced: the sender cannot have it.
    frames = pair.client.encode_outbound(5, SendData(1, Buffer(b"x"), 0))
    assert refused(pair.server, b"".join(frames)).reason is CloseReason.NO_CREDIT
    ledger.check_invariant()


def test_data_beyond_credit() -> None:
    pair, _, ledger = data_pair(exclusive=1)
    announce(pair, ledger)
    first = b"".join(pair.client.encode_outbound(5, SendData(1, Buffer(b"x"), 0)))
    second = b"".join(pair.client.encode_outbound(5, SendData(2, Buffer(b"y"), 0)))
    with pytest.raises(RemoteProtocolError) as info:
        pair.server.receive_data(first + second)
    assert info.value.reason is CloseReason.NO_CREDIT


@pytest.mark.parametrize("seq", [0, 2, 7])
def test_bad_data_sequence(seq: int) -> None:
    pair, _, ledger = data_pair()
    announce(pair, ledger)
    frames = pair.client.encode_outbound(5, SendData(seq, Buffer(b"x"), 0))
    assert refused(pair.server, b"".join(frames)).reason is CloseReason.BAD_SEQUENCE


def test_bad_inband_event_sequence() -> None:
    pair, _, _ = data_pair()
    frames = pair.client.encode_outbound(5, SendEvent(3, Event({}), False))
    assert refused(pair.server, b"".join(frames)).reason is CloseReason.BAD_SEQUENCE


def test_priority_event_seq_ahead_of_received_data() -> None:
    pair, sender, ledger = data_pair()
    sender.add_buffer(Buffer(b"a"))
    announce(pair, ledger)
    send_ready(pair, sender)
    ok = pair.client.encode_outbound(5, SendEvent(1, Event({"b": 1}), True))
    assert pair.to_server(*ok) == [EventArrived(5, 1, Event({"b": 1}), True)]
    ahead = pair.client.encode_outbound(5, SendEvent(2, Event({"b": 2}), True))
    assert refused(pair.server, b"".join(ahead)).reason is CloseReason.BAD_SEQUENCE


def data_frame(payload: bytes, *, channel: int = 5, seq: int = 1) -> bytes:
    return encode_frame(FrameType.DATA, payload, channel=channel, seq=seq)


def test_data_frame_shorter_than_its_prefix() -> None:
    pair, _, ledger = data_pair()
    announce(pair, ledger)
    assert refused(pair.server, data_frame(b"\x00\x00\x00")).reason is CloseReason.BAD_PAYLOAD


def test_record_offset_beyond_the_buffer() -> None:
    pair, _, ledger = data_pair()
    announce(pair, ledger)
    err = refused(pair.server, data_frame(DATA_PREFIX.pack(0, 4) + b"abc"))
    assert err.reason is CloseReason.BAD_PAYLOAD


def test_record_offset_at_the_end_and_no_record_start_are_accepted() -> None:
    pair, _, ledger = data_pair()
    announce(pair, ledger)
    events = pair.to_server(data_frame(DATA_PREFIX.pack(0, 3) + b"abc", seq=1),
                            data_frame(DATA_PREFIX.pack(0, NO_RECORD_START) + b"def", seq=2))
    assert events == [DataArrived(5, 1, Buffer(b"abc", 3), 0), DataArrived(5, 2, Buffer(b"def", -1), 0)]


@pytest.mark.parametrize("payload", [b"\xc1", msgpack.packb([1, 2]), msgpack.packb("barrier")])
def test_event_body_must_be_a_map(payload: bytes) -> None:
    pair, _, _ = data_pair()
    frame = encode_frame(FrameType.EVENT, payload, flags=FLAG_PRIORITY, channel=5, seq=0)
    assert refused(pair.server, frame).reason is CloseReason.BAD_PAYLOAD


@pytest.mark.parametrize("payload", [b"", b"\x00\x00\x01", b"\x00\x00\x00\x01\x00", CREDIT_PAYLOAD.pack(0)])
def test_bad_credit_payloads(payload: bytes) -> None:
    pair, sender, _ = data_pair()
    pair.server_dir.add_outbound("w1", 5)
    frame = encode_frame(FrameType.CREDIT, payload, channel=5)
    assert refused(pair.server, frame).reason is CloseReason.BAD_PAYLOAD
    assert sender.credit == 0


# -- rpc ---------------------------------------------------------------------------------


def test_rpc_round_trip_both_directions() -> None:
    pair = open_pair()
    assert pair.to_server(pair.client.rpc_request(7, "deploy", {"job": "j1", "n": [1, 2]})) == [
        RpcRequest(7, "deploy", {"job": "j1", "n": [1, 2]})
    ]
    assert pair.to_client(pair.server.rpc_response(7, True, {"ok": 1})) == [RpcResponse(7, True, {"ok": 1}, "")]
    assert pair.to_client(pair.server.rpc_request(2**40, "ping", {})) == [RpcRequest(2**40, "ping", {})]
    assert pair.to_server(pair.client.rpc_response(2**40, False, "boom", "KeyError")) == [
        RpcResponse(2**40, False, "boom", "KeyError")
    ]


def test_many_frames_in_one_chunk_all_decode() -> None:
    pair = open_pair()
    chunk = b"".join(pair.client.rpc_request(i, "m", {"i": i}) for i in range(1, 51))
    events = pair.to_server(chunk)
    assert events == [RpcRequest(i, "m", {"i": i}) for i in range(1, 51)]


@pytest.mark.parametrize(
    "payload",
    [
        b"\xc1",
        msgpack.packb({"method": "x"}),
        msgpack.packb(["x"]),
        msgpack.packb(["x", {}, 1]),
        msgpack.packb([1, {}]),
        msgpack.packb(["x", [1]]),
    ],
)
def test_malformed_rpc_request(payload: bytes) -> None:
    pair = open_pair()
    assert refused(pair.server, encode_frame(FrameType.RPC_REQUEST, payload, seq=1)).reason is CloseReason.BAD_PAYLOAD


@pytest.mark.parametrize("payload", [b"\xc1", msgpack.packb([True, 1]), msgpack.packb({"ok": True}), b""])
def test_malformed_rpc_response(payload: bytes) -> None:
    pair = open_pair()
    err = refused(pair.client, encode_frame(FrameType.RPC_RESPONSE, payload, seq=1))
    assert err.reason is CloseReason.BAD_PAYLOAD


def test_rpc_args_with_integer_keys_decode() -> None:
    pair = open_pair()
    assert pair.to_server(pair.client.rpc_request(1, "m", {1: "a"})) == [RpcRequest(1, "m", {1: "a"})]


# -- goodbye and eof ------------------------------------------------------------------------


def test_goodbye_closes_and_later_frames_are_ignored() -> None:
    pair = open_pair()
    events = pair.to_server(pair.client.rpc_request(1, "a", {}), encode_frame(FrameType.GOODBYE,
                            msgpack.packb({"reason": "shutting down"})), pair.client.rpc_request(2, "b", {}))
    assert events == [RpcRequest(1, "a", {}), PeerGoodbye("shutting down")]
    assert pair.server.state is State.CLOSED
    assert pair.server.receive_data(pair.client.rpc_request(3, "c", {})) == ([], [])


def test_saying_goodbye_closes_the_local_side() -> None:
    pair = open_pair()
    frame = pair.client.goodbye("bye")
    assert pair.client.state is State.CLOSED
    with pytest.raises(LocalProtocolError):
        pair.client.rpc_request(1, "late", {})
    assert pair.to_server(frame) == [PeerGoodbye("bye")]


@pytest.mark.parametrize("payload", [msgpack.packb(["odd"]), msgpack.packb({"reason": 5})])
def test_goodbye_with_odd_body(payload: bytes) -> None:
    pair = open_pair()
    events = pair.to_server(encode_frame(FrameType.GOODBYE, payload))
    assert events == [PeerGoodbye("" if payload == msgpack.packb(["odd"]) else "5")]


def test_clean_eof_closes() -> None:
    pair = open_pair()
    pair.server.eof()
    assert pair.server.state is State.CLOSED


def test_eof_inside_a_frame_is_truncation() -> None:
    pair = open_pair()
    frame = pair.client.rpc_request(1, "m", {})
    assert pair.server.receive_data(frame[:-2]) == ([], [])
    with pytest.raises(RemoteProtocolError) as info:
        pair.server.eof()
    assert info.value.reason is CloseReason.TRUNCATED


def test_garbage_after_handshake_is_bad_magic() -> None:
    pair = open_pair()
    assert refused(pair.server, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").reason is CloseReason.BAD_MAGIC


# -- an event on many channels: encoded once, decoded once ---------------------------------


def test_one_event_on_many_channels_is_encoded_once_and_decoded_once() -> None:
    """A checkpoint's barrier goes on every channel of a link: the frames carry the same payload, the receiver
    decodes it once and hands the same Event on (its body is read-only); another payload is decoded anew."""
    pair = open_pair()
    for channel in (1, 2, 3):
        pair.server_dir.add_inbound("w1", channel)
    barrier = Event({"t": "barrier", "id": 7, "start": 1.5, "dir": "/c", "options": {"mode": "aligned"}})
    frames = [pair.client.encode_outbound(channel, SendEvent(1, barrier, False)) for channel in (1, 2, 3)]
    payloads = {f[-1] for f in frames}
    assert payloads == {msgpack.packb(barrier.body)}  # one payload; each frame has its own header
    assert len({f[0] for f in frames}) == 3
    events = pair.to_server(*(chunk for f in frames for chunk in f))
    assert events == [EventArrived(channel, 1, barrier, False) for channel in (1, 2, 3)]
    assert isinstance(events[0], EventArrived) and isinstance(events[2], EventArrived)
    assert events[0].event is events[2].event
    other = Event({"t": "barrier", "id": 8, "start": 2.5, "dir": "/c", "options": {"mode": "aligned"}})
    (after,) = pair.to_server(*pair.client.encode_outbound(1, SendEvent(2, other, False)))
    assert after == EventArrived(1, 2, other, False)
    # an equal body in another Event object is encoded on its own (the cache keys on the object), to the same bytes
    again = Event(dict(barrier.body))
    assert pair.client.encode_outbound(2, SendEvent(2, again, True))[-1] == msgpack.packb(barrier.body)


def test_a_bad_event_payload_is_refused_even_after_a_good_one() -> None:
    pair = open_pair()
    pair.server_dir.add_inbound("w1", 1)
    good = pair.client.encode_outbound(1, SendEvent(1, Event({"t": "end"}), False))
    assert pair.to_server(*good) == [EventArrived(1, 1, Event({"t": "end"}), False)]
    error = refused(pair.server, encode_frame(FrameType.EVENT, msgpack.packb([1, 2]), channel=1, seq=2))
    assert error.reason == CloseReason.BAD_PAYLOAD
