"""netstack.transport over real loopback sockets: handshake, RPC, credit-controlled channels, hostile peers.

Every test binds port 0 on 127.0.0.1, every wait has a deadline, and the
`net` fixture closes every link and server it saw, whatever the outcome.
The main scenarios run once more under uvloop, which production uses.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import msgpack
import pytest

from netstack import transport
from netstack.connection import DataArrived, EventArrived
from netstack.credit import Buffer, ChannelSender, CreditLedger, Event
from netstack.errors import CloseReason, ConnectionLost, RpcError
from netstack.frames import (
    HEADER_BYTES,
    FrameDecoder,
    FrameType,
    encode_frame,
    encode_header,
)
from netstack.transport import Link
from tests.support.loopback import DEADLINE_S, HOST, Directory, Net, Recorder, payload, wait_until


@pytest.fixture
async def net() -> AsyncIterator[Net]:
    n = Net()
    try:
        yield n
    finally:
        await n.aclose()


async def raw_exchange(port: int, data: bytes) -> bytes:
    """Send raw bytes and read until the server closes; returns what it said."""
    reader, writer = await asyncio.wait_for(asyncio.open_connection(HOST, port), DEADLINE_S)
    try:
        writer.write(data)
        await writer.drain()
        return await asyncio.wait_for(reader.read(), DEADLINE_S)  # read() returns at EOF
    finally:
        writer.close()
        try:
            await asyncio.wait_for(writer.wait_closed(), DEADLINE_S)
        except (ConnectionError, TimeoutError):
            pass


def goodbye_reason(reply: bytes) -> str:
    decoder = FrameDecoder()
    decoder.receive_data(reply)
    frame = decoder.next_frame()
    assert frame is not None and frame.type is FrameType.GOODBYE, reply
    return msgpack.unpackb(frame.payload)["reason"]


# -- handshake and RPC ------------------------------------------------------------------------


async def scenario_handshake_and_rpc(net: Net) -> None:
    server = Recorder()
    port = await net.serve(server)
    link = await net.dial(port)
    assert link.established.done()
    est = link.established.result()
    assert (est.peer_id, est.peer_role) == ("srv", "coordinator")
    await wait_until(lambda: len(server.links) == 1, what="server side established")
    server_link = server.links[0]
    assert (server_link.peer_id, server_link.connection.peer_role) == ("cli", "worker")
    assert server_link.established.result().peer_info == {"pid": 1}

    assert await link.call("echo", {"n": 1}, timeout_s=DEADLINE_S) == {"from": "srv", "args": {"n": 1}}
    # The server calls the client on the same link.
    assert await server_link.call("echo", {"n": 2}, timeout_s=DEADLINE_S) == {"from": "cli", "args": {"n": 2}}
    # Many concurrent calls are matched to their answers by correlation id.
    results = await asyncio.wait_for(
        asyncio.gather(*(link.call("echo", {"i": i}) for i in range(50))), DEADLINE_S)
    assert [r["args"]["i"] for r in results] == list(range(50))
    # A call that makes a call back the other way.
    assert await link.call("ask_back", timeout_s=DEADLINE_S) == {"from": "cli", "args": {"nested": True}}
    assert link.frames_out > 50 and link.bytes_in > 0


async def test_serve_dial_handshake_and_rpc_round_trips(net: Net) -> None:
    await scenario_handshake_and_rpc(net)


async def test_remote_errors_propagate_to_the_caller(net: Net, caplog: pytest.LogCaptureFixture) -> None:
    port = await net.serve(Recorder())
    link = await net.dial(port)
    with caplog.at_level(logging.WARNING, logger="sluice.net"), pytest.raises(RpcError) as info:
        await link.call("fail", {"what": "that"}, timeout_s=DEADLINE_S)
    assert info.value.remote_type == "ValueError"
    assert "cannot do that" in str(info.value)
    assert any("rpc fail" in r.getMessage() for r in caplog.records)

    with pytest.raises(RpcError) as info:
        await link.call("refuse", timeout_s=DEADLINE_S)
    assert (info.value.remote_type, str(info.value)) == ("Busy", "not now")

    with pytest.raises(RpcError) as info:
        await link.call("no_such_method", timeout_s=DEADLINE_S)
    assert info.value.remote_type == "UnknownMethod"

    with pytest.raises(RpcError) as info:
        await link.call("unencodable", timeout_s=DEADLINE_S)
    assert info.value.remote_type == "TypeError"

    # The link survives all of that.
    assert (await link.call("echo", {}, timeout_s=DEADLINE_S))["from"] == "srv"


async def test_call_timeout_and_call_after_close(net: Net) -> None:
    server = Recorder()
    port = await net.serve(server)
    link = await net.dial(port)
    with pytest.raises(ConnectionLost) as info:
        await link.call("wait", timeout_s=0.05)
    assert info.value.reason is CloseReason.TIMEOUT
    assert link._calls == {}
    server.release.set()
    assert await link.call("wait", timeout_s=DEADLINE_S) == "released"
    link.close("done")
    assert await asyncio.wait_for(link.closed, DEADLINE_S) is CloseReason.NORMAL
    with pytest.raises(ConnectionLost):
        await link.call("echo", timeout_s=DEADLINE_S)


async def test_pending_call_fails_when_the_link_closes(net: Net) -> None:
    server = Recorder()
    port = await net.serve(server)
    link = await net.dial(port)
    call = asyncio.ensure_future(link.call("wait", timeout_s=DEADLINE_S))
    await wait_until(lambda: bool(server.links) and bool(server.links[0]._rpc_tasks), what="call running")
    server.links[0].close("going away")
    with pytest.raises(ConnectionLost) as info:
        await asyncio.wait_for(call, DEADLINE_S)
    assert info.value.reason is CloseReason.PEER_CLOSED
    assert "going away" in str(info.value)
    assert await asyncio.wait_for(link.closed, DEADLINE_S) is CloseReason.PEER_CLOSED


async def test_call_still_running_when_the_caller_leaves_is_dropped_quietly(
        net: Net, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="sluice.net")
    server = Recorder()
    port = await net.serve(server)
    link = await net.dial(port)
    loop = asyncio.get_running_loop()
    errors: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, context: errors.append(context))
    try:
        call = asyncio.ensure_future(link.call("wait", timeout_s=DEADLINE_S))
        await wait_until(lambda: bool(server.links) and bool(server.links[0]._rpc_tasks), what="call running")
        server_link = server.links[0]
        task = next(iter(server_link._rpc_tasks))
        link.close("caller leaves")
        await asyncio.wait_for(server_link.closed, DEADLINE_S)
        with pytest.raises(ConnectionLost):
            await asyncio.wait_for(call, DEADLINE_S)
        server.release.set()  # the handler finishes after its link is gone
        await asyncio.wait_for(asyncio.wait({task}), DEADLINE_S)
        assert task.exception() is None, "answering a closed link must not fail the rpc task"
    finally:
        loop.set_exception_handler(None)
    assert errors == []
    assert not [r for r in caplog.records if "rpc wait" in r.getMessage()]  # the handler did not fail


# -- data channels ----------------------------------------------------------------------------


class Consumer(Recorder):
    """Receives channel 1 from peer "cli" and consumes slowly, announcing credit as it goes."""

    def __init__(self, *, exclusive: int, floating: int, pause_s: float) -> None:
        super().__init__()
        self.directory = Directory()
        self.ledger = CreditLedger([1], exclusive=exclusive, floating=floating)
        self.directory.ledgers[("cli", 1)] = self.ledger
        self.budget = exclusive + floating
        self.pause_s = pause_s
        self.held: collections.deque[Buffer] = collections.deque()
        self.max_held = 0
        self.consumed: list[bytes] = []
        self.order: list[str] = []  # "d" per buffer, "p<seq>" per priority event, as they arrive
        self.consuming = asyncio.Event()
        self.consuming.set()
        self.has_data = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def on_established(self, link: Link) -> None:
        super().on_established(link)
        self.announce(link)
        self._task = asyncio.get_running_loop().create_task(self._consume(link))

    def announce(self, link: Link) -> None:
        for ch, credits in self.ledger.take_announcements().items():
            link.send_credit(ch, credits)

    def on_data(self, link: Link, event: DataArrived) -> None:
        self.data.append(event)
        self.order.append("d")
        self.held.append(event.buffer)
        self.max_held = max(self.max_held, len(self.held))
        self.has_data.set()

    def on_event(self, link: Link, event: EventArrived) -> None:
        self.events.append(event)
        self.order.append(f"p{event.seq}" if event.priority else "e")

    async def _consume(self, link: Link) -> None:
        while not link.is_closing():
            await self.consuming.wait()
            if not self.held:
                self.has_data.clear()
                await self.has_data.wait()
                continue
            await asyncio.sleep(self.pause_s)
            self.consumed.append(self.held.popleft().data)
            self.ledger.on_consumed(1)
            self.ledger.check_invariant()
            self.announce(link)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.wait({self._task}, timeout=DEADLINE_S)


class Producer(Recorder):
    def __init__(self) -> None:
        super().__init__()
        self.directory = Directory()
        self.sender = ChannelSender(1)
        self.directory.senders[("srv", 1)] = self.sender
        self.sent_rounds = 0

    def on_sent(self, link: Link, sender: ChannelSender) -> None:
        self.sent_rounds += 1


async def scenario_credit_flow(net: Net, *, n: int = 120) -> None:
    consumer = Consumer(exclusive=2, floating=2, pause_s=0.001)
    port = await net.serve(consumer, directory=consumer.directory)
    producer = Producer()
    link = await net.dial(port, producer, directory=producer.directory)
    try:
        for i in range(n):
            producer.sender.add_buffer(Buffer(payload(i), 0))
        link.wake(producer.sender)
        await wait_until(lambda: len(consumer.consumed) == n, what="all buffers consumed")
    finally:
        await consumer.stop()
    assert consumer.consumed == [payload(i) for i in range(n)]
    assert [d.seq for d in consumer.data] == list(range(1, n + 1))
    assert consumer.max_held <= consumer.budget
    assert consumer.max_held >= 2  # the producer was really credit-limited, not trickling
    backlogs = [d.backlog for d in consumer.data]
    assert backlogs[-1] == 0 and max(backlogs) > 0
    assert producer.sender.statistics().queued_buffers == 0
    assert producer.sender.sent_buffers == n
    assert producer.sent_rounds > 1  # on_sent told the producer as credit trickled in
    consumer.ledger.check_invariant()


async def test_credit_limits_what_the_receiver_holds(net: Net) -> None:
    await scenario_credit_flow(net)


async def scenario_priority_overtakes(net: Net) -> None:
    consumer = Consumer(exclusive=2, floating=0, pause_s=0)
    consumer.consuming.clear()  # the task is blocked: nothing is consumed
    port = await net.serve(consumer, directory=consumer.directory)
    producer = Producer()
    link = await net.dial(port, producer, directory=producer.directory)
    try:
        for i in range(10):
            producer.sender.add_buffer(Buffer(payload(i), 0))
        link.wake(producer.sender)
        await wait_until(lambda: len(consumer.data) == 2, what="the credited buffers")
        overtaken = producer.sender.add_priority_event(Event({"barrier": 1}))
        assert overtaken == [Buffer(payload(i), 0) for i in range(2, 10)]
        link.wake(producer.sender)
        await wait_until(lambda: len(consumer.events) == 1, what="the barrier")
        barrier = consumer.events[0]
        assert barrier.priority and barrier.event.body == {"barrier": 1}
        assert barrier.seq == 2  # exactly the two buffers received precede it
        assert len(consumer.data) == 2  # it arrived while data still waited for credit
        consumer.consuming.set()
        await wait_until(lambda: len(consumer.consumed) == 10, what="the overtaken buffers")
    finally:
        await consumer.stop()
    assert consumer.order == ["d", "d", "p2"] + ["d"] * 8
    after = [d.buffer for d in consumer.data[2:]]
    assert after == overtaken


async def test_priority_event_overtakes_buffers_waiting_for_credit(net: Net) -> None:
    await scenario_priority_overtakes(net)


async def test_priority_event_queued_with_data_leaves_first(net: Net) -> None:
    consumer = Consumer(exclusive=4, floating=0, pause_s=0)
    port = await net.serve(consumer, directory=consumer.directory)
    producer = Producer()
    link = await net.dial(port, producer, directory=producer.directory)
    try:
        await wait_until(lambda: producer.sender.credit == 4, what="initial credit")
        for i in range(3):
            producer.sender.add_buffer(Buffer(payload(i), 0))
        producer.sender.add_event(Event({"inband": 1}))
        producer.sender.add_priority_event(Event({"barrier": 9}))
        link.wake(producer.sender)
        await wait_until(lambda: len(consumer.consumed) == 3 and len(consumer.events) == 2, what="everything")
    finally:
        await consumer.stop()
    assert consumer.order == ["p0", "d", "d", "d", "e"]
    assert consumer.events[1].seq == 4 and not consumer.events[1].priority


async def test_writer_pauses_when_the_peer_stops_reading_and_resumes(net: Net) -> None:
    n, size = 400, 32 * 1024  # far more than socket buffers plus the 512 KiB write limit
    consumer = Consumer(exclusive=n, floating=0, pause_s=0)
    port = await net.serve(consumer, directory=consumer.directory)
    producer = Producer()
    link = await net.dial(port, producer, directory=producer.directory)
    try:
        await wait_until(lambda: len(consumer.links) == 1, what="server side established")
        consumer_transport = consumer.links[0].transport
        assert consumer_transport is not None
        consumer_transport.pause_reading()
        await wait_until(lambda: producer.sender.credit == n, what="credit for everything")
        for i in range(n):
            producer.sender.add_buffer(Buffer(i.to_bytes(4, "big") * (size // 4), 0))
        link.wake(producer.sender)
        await wait_until(lambda: link._paused, what="pause_writing")
        queued = producer.sender.statistics().queued_buffers
        assert queued > 0  # the sender kept what the socket could not take
        consumer_transport.resume_reading()
        await wait_until(lambda: len(consumer.consumed) == n, what="everything after resume")
    finally:
        await consumer.stop()
    assert [int.from_bytes(b[:4], "big") for b in consumer.consumed] == list(range(n))
    assert all(len(b) == size for b in consumer.consumed)
    assert not link._paused and producer.sender.statistics().queued_buffers == 0


async def test_data_on_a_channel_the_receiver_does_not_know_closes_the_link(net: Net) -> None:
    server = Recorder()
    port = await net.serve(server)  # no channels at all
    producer = Producer()
    link = await net.dial(port, producer, directory=producer.directory)
    producer.sender.add_event(Event({"stray": True}))
    link.wake(producer.sender)
    assert await asyncio.wait_for(link.closed, DEADLINE_S) is CloseReason.PEER_CLOSED
    await wait_until(lambda: bool(server.closed), what="server closed the link")
    assert server.reasons() == [CloseReason.UNKNOWN_CHANNEL]


# -- hostile peers --------------------------------------------------------------------------------


async def test_wrong_token_is_refused_and_the_server_keeps_serving(net: Net) -> None:
    server = Recorder()
    port = await net.serve(server)
    before = transport.PROTOCOL_FAILURES[CloseReason.BAD_TOKEN.value]
    with pytest.raises(ConnectionLost) as info:
        await net.dial(port, token="wrong")
    assert "wrong cluster token" in str(info.value)
    await wait_until(lambda: bool(server.closed), what="server closed the refused link")
    assert server.reasons() == [CloseReason.BAD_TOKEN]
    assert server.links == []  # never established
    assert transport.PROTOCOL_FAILURES[CloseReason.BAD_TOKEN.value] == before + 1

    link = await net.dial(port)
    assert (await link.call("echo", {"ok": 1}, timeout_s=DEADLINE_S))["args"] == {"ok": 1}


async def test_garbage_closes_only_that_connection(net: Net) -> None:
    server = Recorder()
    port = await net.serve(server)
    good = await net.dial(port)
    reply = await raw_exchange(port, b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n")
    assert "bad magic" in goodbye_reason(reply)
    await wait_until(lambda: bool(server.closed), what="garbage connection closed")
    assert server.reasons() == [CloseReason.BAD_MAGIC]
    assert not good.is_closing()
    assert (await good.call("echo", {}, timeout_s=DEADLINE_S))["from"] == "srv"
    again = await net.dial(port, local_id="cli2")
    assert (await again.call("echo", {}, timeout_s=DEADLINE_S))["from"] == "srv"


async def test_oversized_header_is_refused_before_its_payload(net: Net) -> None:
    server = Recorder()
    port = await net.serve(server, max_frame_bytes=4096)
    good = await net.dial(port)
    # Declare a 64 MiB frame and send none of it: the server must not wait for the payload.
    reply = await raw_exchange(port, encode_header(FrameType.HELLO, 0, 0, 0, 64 << 20))
    assert "larger than the configured maximum" in goodbye_reason(reply)
    await wait_until(lambda: bool(server.closed), what="oversized connection closed")
    assert server.reasons() == [CloseReason.OVERSIZED]
    assert (await good.call("echo", {}, timeout_s=DEADLINE_S))["from"] == "srv"


async def test_oversized_frame_from_an_established_peer_closes_that_link_only(net: Net) -> None:
    server = Recorder()
    port = await net.serve(server, max_frame_bytes=4096)
    good = await net.dial(port)
    bad = await net.dial(port, local_id="big")
    with pytest.raises(ConnectionLost) as info:
        await bad.call("echo", {"blob": "x" * 10_000}, timeout_s=DEADLINE_S)
    assert info.value.reason is CloseReason.PEER_CLOSED
    assert "larger than the configured maximum" in str(info.value)
    await wait_until(lambda: bool(server.closed), what="server closed the big link")
    assert [(lk.peer_id, r) for lk, r, _ in server.closed] == [("big", CloseReason.OVERSIZED)]
    assert (await good.call("echo", {"small": 1}, timeout_s=DEADLINE_S))["args"] == {"small": 1}


async def test_truncated_frame_at_eof_is_a_protocol_failure(net: Net) -> None:
    server = Recorder()
    port = await net.serve(server)
    frame = encode_frame(FrameType.HELLO, b"\x80" * 10)
    reader, writer = await asyncio.wait_for(asyncio.open_connection(HOST, port), DEADLINE_S)
    writer.write(frame[: HEADER_BYTES + 3])
    await writer.drain()
    writer.write_eof()
    await asyncio.wait_for(reader.read(), DEADLINE_S)
    writer.close()
    await wait_until(lambda: bool(server.closed), what="truncated connection closed")
    assert server.reasons() == [CloseReason.TRUNCATED]


async def test_silent_peer_is_dropped_after_the_handshake_timeout(
        net: Net, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(transport, "HANDSHAKE_TIMEOUT_S", 0.1)
    server = Recorder()
    port = await net.serve(server)
    reply = await raw_exchange(port, b"")
    assert "timed out" in goodbye_reason(reply)
    assert server.reasons() == [CloseReason.TIMEOUT]


async def test_dial_to_a_closed_port_is_connection_lost(net: Net) -> None:
    port = await net.serve(Recorder())
    server = net.servers.pop()
    server.close()
    await asyncio.wait_for(server.wait_closed(), DEADLINE_S)
    with pytest.raises(ConnectionLost) as info:
        await net.dial(port)
    assert info.value.reason is CloseReason.IO_ERROR


# -- the same scenarios under uvloop ------------------------------------------------------------


@pytest.mark.parametrize("scenario", [scenario_handshake_and_rpc, scenario_credit_flow, scenario_priority_overtakes])
def test_scenarios_under_uvloop(scenario: Callable[[Net], Any]) -> None:
    uvloop = pytest.importorskip("uvloop")

    async def run() -> None:
        n = Net()
        try:
            await asyncio.wait_for(scenario(n), 4 * DEADLINE_S)
        finally:
            await n.aclose()

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(run())
