"""Link liveness (PING/PONG and the timeout) and priority across the channels of one link.

The `Liveness` state machine is tested with time passed in; the transport's timer and send path over real
loopback sockets, reusing the loopback harness of tests/support/loopback.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from netstack import transport
from netstack.connection import (
    Connection,
    DataArrived,
    EventArrived,
    Liveness,
    LivenessVerdict,
    PingArrived,
    PongArrived,
    State,
)
from netstack.credit import Buffer, ChannelSender, CreditLedger, Event
from netstack.errors import CloseReason, LocalProtocolError, RemoteProtocolError
from netstack.frames import FrameDecoder, FrameType, encode_frame
from netstack.metrics_http import link_timeouts
from netstack.transport import Link
from tests.support.loopback import DEADLINE_S, Directory, Net, Recorder, payload, wait_until


@pytest.fixture
async def net() -> AsyncIterator[Net]:
    n = Net()
    try:
        yield n
    finally:
        await n.aclose()


# -- the Liveness state machine ---------------------------------------------------------------------------------


def test_a_peer_heard_from_is_left_alone() -> None:
    live = Liveness(3.0, now=100.0)
    for t in (100.5, 101.0, 101.9):
        live.heard(t)
        assert live.poll(t) is LivenessVerdict.QUIET


def test_silence_earns_a_ping_then_one_ping_per_interval() -> None:
    live = Liveness(3.0, now=0.0)  # pings every 1s of silence
    assert live.poll(0.99) is LivenessVerdict.QUIET
    assert live.next_poll_in(0.0) == pytest.approx(1.0)
    assert live.poll(1.0) is LivenessVerdict.PING
    assert live.ping_sent(1.0) == 1
    assert live.poll(1.5) is LivenessVerdict.QUIET  # one ping per interval, not one per poll
    assert live.next_poll_in(1.5) == pytest.approx(0.5)
    assert live.poll(2.0) is LivenessVerdict.PING
    assert live.ping_sent(2.0) == 2


def test_silence_for_the_whole_timeout_is_death() -> None:
    live = Liveness(3.0, now=0.0)
    live.ping_sent(1.0)
    live.ping_sent(2.0)
    assert live.next_poll_in(2.0) == pytest.approx(1.0)
    assert live.poll(2.999) is LivenessVerdict.QUIET
    assert live.poll(3.0) is LivenessVerdict.DEAD
    assert live.silent_s(3.0) == pytest.approx(3.0)


def test_an_answer_resets_the_clock() -> None:
    live = Liveness(3.0, now=0.0)
    live.ping_sent(1.0)
    live.heard(2.9)
    assert live.poll(3.5) is LivenessVerdict.QUIET
    assert live.poll(5.899) is LivenessVerdict.PING
    assert live.poll(5.9) is LivenessVerdict.DEAD


def test_late_bytes_never_move_the_clock_back() -> None:
    live = Liveness(3.0, now=10.0)
    live.heard(5.0)
    assert live.last_heard == 10.0


def test_nonsense_timeouts_are_refused() -> None:
    with pytest.raises(LocalProtocolError):
        Liveness(0.0, now=0.0)


# -- PING / PONG on the sans-IO connection ----------------------------------------------------------------------


def open_pair() -> tuple[Connection, Connection]:
    client = Connection(local_id="a", role="worker", token="t", is_client=True)
    server = Connection(local_id="b", role="worker", token="t", is_client=False)
    _, replies = server.receive_data(client.hello())
    client.receive_data(b"".join(replies))
    assert client.state is State.OPEN and server.state is State.OPEN
    return client, server


def test_ping_is_answered_by_the_protocol_with_the_same_nonce() -> None:
    client, server = open_pair()
    events, replies = server.receive_data(client.ping(41))
    assert events == [PingArrived(41)]
    decoder = FrameDecoder()
    decoder.receive_data(b"".join(replies))
    pong = decoder.next_frame()
    assert pong is not None and pong.type is FrameType.PONG and pong.seq == 41
    events, replies = client.receive_data(encode_frame(FrameType.PONG, seq=41))
    assert events == [PongArrived(41)] and replies == []


def test_ping_before_the_handshake_is_a_protocol_error() -> None:
    server = Connection(local_id="b", role="worker", token="t", is_client=False)
    with pytest.raises(RemoteProtocolError) as err:
        server.receive_data(encode_frame(FrameType.PING, seq=1))
    assert err.value.reason is CloseReason.UNEXPECTED
    client = Connection(local_id="a", role="worker", token="t", is_client=True)
    with pytest.raises(LocalProtocolError):
        client.ping(1)


# -- the transport's timer over real sockets --------------------------------------------------------------------


async def test_an_idle_healthy_link_is_kept_open_by_pings(net: Net) -> None:
    server = Recorder()
    port = await net.serve(server)
    link = await net.dial(port)
    await wait_until(lambda: len(server.links) == 1, what="server side established")
    link.watch_liveness(0.3)
    server.links[0].watch_liveness(0.3)
    frames_before = link.frames_in
    await asyncio.sleep(1.2)  # four timeouts of an idle link: only the pings keep it open
    assert not link.is_closing() and server.closed == []
    assert link.frames_in > frames_before  # the peer's PINGs and PONGs arrived
    assert await link.call("echo", {"x": 1}, timeout_s=DEADLINE_S) == {"from": "srv", "args": {"x": 1}}


async def test_a_silent_peer_is_closed_after_the_link_timeout(net: Net) -> None:
    server = Recorder()
    port = await net.serve(server)
    client = Recorder()
    link = await net.dial(port, client)
    await wait_until(lambda: len(server.links) == 1, what="server side established")
    server_transport = server.links[0].transport
    assert server_transport is not None
    before = transport.LINK_TIMEOUTS["coordinator"]
    # The peer's process lives but reads nothing and says nothing: what a cut path looks like from here.
    server_transport.pause_reading()
    loop = asyncio.get_running_loop()
    started = loop.time()
    link.watch_liveness(0.4)
    await wait_until(lambda: bool(client.closed), what="the link timeout")
    took = loop.time() - started
    assert client.reasons() == [CloseReason.LINK_TIMEOUT]
    assert "nothing heard" in client.closed[0][2]
    assert 0.4 <= took < 0.4 + 1.0, took
    assert transport.LINK_TIMEOUTS["coordinator"] == before + 1
    family = link_timeouts()  # what /metrics shows as sluice_link_timeouts_total{peer_role="coordinator"}
    assert family.name == "sluice_link_timeouts"
    assert ("coordinator", before + 1) in {(x.labels["peer_role"], x.value) for x in family.samples
                                           if x.name == "sluice_link_timeouts_total"}
    server_transport.resume_reading()


# -- priority across the channels of one link -------------------------------------------------------------------

A, B = 2, 1  # channel A carries the priority event, channel B the data queued before it


class TwoChannels(Recorder):
    """Receives channels A and B from peer "cli" over one link, consuming at once; records arrival order."""

    def __init__(self, *, exclusive: int) -> None:
        super().__init__()
        self.directory = Directory()
        self.ledger = CreditLedger([B, A], exclusive=exclusive, floating=0)
        self.directory.ledgers[("cli", B)] = self.ledger
        self.directory.ledgers[("cli", A)] = self.ledger
        self.order: list[str] = []  # "B<seq>" per data buffer, "A!" per priority event of A

    def on_established(self, link: Link) -> None:
        super().on_established(link)
        for ch, credits in self.ledger.take_announcements().items():
            link.send_credit(ch, credits)

    def on_data(self, link: Link, event: DataArrived) -> None:
        self.order.append(f"{'B' if event.channel == B else 'A'}{event.seq}")
        self.ledger.on_consumed(event.channel)

    def on_event(self, link: Link, event: EventArrived) -> None:
        self.order.append("A!" if event.channel == A and event.priority else f"e{event.channel}")


async def two_channel_link(net: Net, exclusive: int) -> tuple[TwoChannels, Link, ChannelSender, ChannelSender]:
    consumer = TwoChannels(exclusive=exclusive)
    port = await net.serve(consumer, directory=consumer.directory)
    directory = Directory()
    sender_a, sender_b = ChannelSender(A), ChannelSender(B)
    directory.senders[("srv", A)] = sender_a
    directory.senders[("srv", B)] = sender_b
    link = await net.dial(port, directory=directory)
    await wait_until(lambda: sender_b.credit == exclusive and len(consumer.links) == 1, what="initial credit")
    return consumer, link, sender_a, sender_b


async def test_priority_event_of_one_channel_leaves_before_data_of_another_queued_earlier(net: Net) -> None:
    consumer, link, sender_a, sender_b = await two_channel_link(net, exclusive=4)
    # One turn of the event loop, so the interleaving is fixed: B's data is queued and woken first.
    for i in range(3):
        sender_b.add_buffer(Buffer(payload(i), 0))
    link.wake(sender_b)
    sender_a.add_priority_event(Event({"barrier": 1}))
    link.wake(sender_a)
    await wait_until(lambda: len(consumer.order) == 4, what="everything")
    assert consumer.order == ["A!", "B1", "B2", "B3"]


async def test_priority_event_leaves_while_the_writer_is_paused_ahead_of_queued_data(net: Net) -> None:
    n, size = 300, 32 * 1024  # far more than socket buffers plus the write limit
    consumer, link, sender_a, sender_b = await two_channel_link(net, exclusive=n)
    consumer_transport = consumer.links[0].transport
    assert consumer_transport is not None
    consumer_transport.pause_reading()
    for i in range(n):
        sender_b.add_buffer(Buffer(i.to_bytes(4, "big") * (size // 4), 0))
    link.wake(sender_b)
    await wait_until(lambda: link._paused, what="pause_writing")
    written_before = sender_b.sent_buffers  # in the socket already: these cannot be overtaken
    assert sender_b.statistics().queued_buffers > 0
    sender_a.add_priority_event(Event({"barrier": 1}))
    link.wake(sender_a)
    consumer_transport.resume_reading()
    await wait_until(lambda: len(consumer.order) == n + 1, what="everything after resume")
    # The event went out at once, paused or not: it follows only what the socket held, not B's queue.
    assert consumer.order.index("A!") == written_before
    assert [x for x in consumer.order if x != "A!"] == [f"B{i}" for i in range(1, n + 1)]
