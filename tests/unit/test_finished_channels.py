"""A finished input's channel at both ends (FLIP-147): the end of partition is found behind queued data at the
producer, where an unaligned barrier overtakes both, and it is announced on arrival at the consumer's gate,
where it ends the channel's recording."""

from __future__ import annotations

from typing import Any

import msgpack

from netstack.credit import ChannelSender, Event, SendData, SendEvent
from runtime.execution.channels import InputChannel, InputGate, Subpartition, event, overtaken_records, split_records


def records(n: int) -> list[bytes]:
    return [msgpack.packb(["k", i]) for i in range(n)]


def test_an_unaligned_barrier_overtakes_the_data_and_the_end_still_queued_at_the_producer() -> None:
    sub = Subpartition(ChannelSender(1), limit=100, capacity=32)
    for r in records(20):
        sub.append(r)
    sub.add_event(event("end"))
    assert sub.end_event is not None and sub.sender.holds(sub.end_event)
    barrier = Event({"t": "barrier", "id": 1})
    overtaken = sub.add_event(barrier, priority=True)
    assert split_records(overtaken_records(overtaken)) == records(20)  # all of it becomes output channel state
    sub.sender.add_credit(100)
    sent = []
    while (item := sub.sender.pop_sendable()) is not None:
        sent.append(item)
    assert isinstance(sent[0], SendEvent) and sent[0].event is barrier and sent[0].priority
    assert isinstance(sent[-1], SendEvent) and sent[-1].event.body["t"] == "end"  # the end still comes last
    assert all(isinstance(s, SendData) for s in sent[1:-1])
    assert not sub.sender.holds(sub.end_event)  # sent: later checkpoints leave this channel to the consumer


class Listener:
    def __init__(self) -> None:
        self.queued: list[tuple[int, dict[str, Any]]] = []

    def wake(self) -> None:
        pass

    def on_priority_event(self, channel_id: int, seq: int, ev: Event) -> None:
        pass

    def on_barrier_queued(self, channel_id: int, body: dict[str, Any]) -> None:
        self.queued.append((channel_id, body))


def test_an_end_arriving_at_the_gate_is_announced_and_completes_the_channels_recording() -> None:
    listener = Listener()
    gate = InputGate(listener, [InputChannel(1, 0, 0, "0:0"), InputChannel(2, 1, 0, "0:1")], exclusive=10,
                     floating=0)
    sub = Subpartition(ChannelSender(1), limit=100, capacity=1000)
    sub.sender.add_credit(10)
    sent = []
    for r in records(2):
        sub.append(r)
        sub.flush()
        item = sub.sender.pop_sendable()
        assert isinstance(item, SendData)
        sent.append(item.buffer)
    gate.deliver_data(1, 1, sent[0])
    captured = gate.start_recording(7)  # an unaligned checkpoint starts: channel 1 keeps recording
    assert [b.data for b in captured[1]] == [sent[0].data]
    gate.deliver_data(1, 2, sent[1])  # arrives after the snapshot, before the end: recorded
    gate.deliver_event(1, 3, event("end"), priority=False)
    assert listener.queued == [(1, {"t": "end"})]
    assert 1 not in gate.recorders  # nothing follows an end
    assert [b.data for b in captured[1]] == [b.data for b in sent]


def test_poll_buffer_takes_buffers_in_poll_order_and_leaves_an_event_queued() -> None:
    gate = InputGate(Listener(), [InputChannel(1, 0, 0, "0:0"), InputChannel(2, 1, 0, "0:1")], exclusive=10,
                     floating=0)
    subs = {cid: Subpartition(ChannelSender(cid), limit=100, capacity=1000) for cid in (1, 2)}
    buffers = {}
    for cid, sub in subs.items():
        sub.sender.add_credit(10)
        for seq, r in enumerate(records(2), start=1):
            sub.append(r)
            sub.flush()
            item = sub.sender.pop_sendable()
            assert isinstance(item, SendData)
            buffers[cid, seq] = item.buffer
    gate.deliver_data(1, 1, buffers[1, 1])
    gate.deliver_data(2, 1, buffers[2, 1])
    gate.deliver_event(1, 2, event("end"), priority=False)
    gate.deliver_data(2, 2, buffers[2, 2])
    assert gate.poll_buffer() == (1, buffers[1, 1])
    assert gate.poll_buffer() == (2, buffers[2, 1])
    assert gate.poll_buffer() is None  # channel 1's end is next: it stays where it is
    assert gate.poll() == (1, event("end"))  # the same order as poll alone
    assert gate.poll() == (2, buffers[2, 2])
    assert gate.poll() is None and gate.queued == 0
