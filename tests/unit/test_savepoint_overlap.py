"""A savepoint aligning beside a newer unaligned checkpoint, at both ends of a channel and without I/O: the
producer's queue (the unaligned barrier waits behind the savepoint's and overtakes only the data after it) and
the consumer's gate (the unaligned checkpoint records the blocked channel's data after the savepoint's barrier,
the savepoint's channel stays blocked, and the savepoint's end of alignment leaves the recording alone).
test_barrier_handler.py pins down the handler's decisions; test_credit.py the queue's rule on its own."""

from __future__ import annotations

from typing import Any

import msgpack

from netstack.credit import Buffer, ChannelSender, Event, Outbound, SendData, SendEvent
from runtime.execution.channels import InputChannel, InputGate, Subpartition, overtaken_records, split_records


def record(i: int) -> bytes:
    return bytes(msgpack.packb(["k", i]))


class Listener:
    def __init__(self) -> None:
        self.priority: list[tuple[int, int, dict[str, Any]]] = []

    def wake(self) -> None:
        pass

    def on_priority_event(self, channel_id: int, seq: int, ev: Event) -> None:
        self.priority.append((channel_id, seq, ev.body))

    def on_barrier_queued(self, channel_id: int, body: dict[str, Any]) -> None:
        pass


def deliver(gate: InputGate, channel_id: int, item: Outbound) -> None:
    if isinstance(item, SendData):
        gate.ledger.on_data(channel_id, item.seq, item.backlog)
        gate.deliver_data(channel_id, item.seq, item.buffer)
    else:
        gate.ledger.on_event(channel_id, item.seq, item.priority)
        gate.deliver_event(channel_id, item.seq, item.event, item.priority)


def test_the_unaligned_barrier_follows_the_savepoints_and_records_what_follows_it_on_the_blocked_channel() -> None:
    sub = Subpartition(ChannelSender(1), limit=100, capacity=1000)
    listener = Listener()
    gate = InputGate(listener, [InputChannel(1, 0, 0, "0:0"), InputChannel(2, 1, 0, "1:0")], exclusive=10,
                     floating=0)
    savepoint, unaligned = Event({"t": "barrier", "id": 2}), Event({"t": "barrier", "id": 3})
    sub.append(record(0))
    sub.add_event(savepoint, fence=True)  # flushes record 0 ahead of it
    sub.append(record(1))
    overtaken = sub.add_event(unaligned, priority=True)  # flushes record 1: after the savepoint's barrier
    assert split_records(overtaken_records(overtaken)) == [record(1)]  # the unaligned checkpoint's output state
    sub.append(record(2))
    sub.flush()  # after the unaligned barrier: in neither checkpoint's state
    sub.sender.add_credit(10)
    gate.ledger.take_announcements()  # the credit the sender just got
    sent = []
    while (item := sub.sender.pop_sendable()) is not None:
        sent.append(item)
        deliver(gate, 1, item)
    assert [(type(i).__name__, i.seq) for i in sent] == [
        ("SendData", 1), ("SendEvent", 2), ("SendEvent", 2), ("SendData", 3), ("SendData", 4)]
    assert listener.priority == [(1, 2, {"t": "barrier", "id": 3})]  # right behind the savepoint's, its seq

    # the task takes record 0 and the savepoint's barrier, which blocks channel 1
    assert gate.poll() is not None and gate.poll() == (1, savepoint)
    gate.block(1)
    # the unaligned checkpoint is taken beside the savepoint: nothing of channel 1 after the savepoint's barrier
    # was processed, and its barrier names seq 2, so channel 1 records nothing; channel 2 records until its own
    captured = gate.start_recording(3)
    assert captured[1] == [] and 1 not in gate.recorders and 2 in gate.recorders
    gate.stop_recording(2)  # the savepoint's end of alignment: not the one recording
    assert gate.recording_id == 3
    gate.unblock_all(frozenset({1}))  # an unblock while the savepoint aligns keeps its channel
    assert gate.blocked == {1} and gate.poll() is None
    gate.stop_recording(3)
    assert gate.recording_id is None


def test_data_after_the_savepoints_barrier_already_in_the_gate_is_the_unaligned_checkpoints_channel_state():
    """The savepoint's barrier left the producer before the unaligned one came: that one overtakes the producer's
    queue (its output state), and the consumer records what it holds after the savepoint's barrier, before the
    unaligned one's seq."""
    listener = Listener()
    gate = InputGate(listener, [InputChannel(1, 0, 0, "0:0")], exclusive=10, floating=0)
    savepoint = Event({"t": "barrier", "id": 2})
    after = [Buffer(record(i)) for i in (1, 2)]
    gate.ledger.take_announcements()
    deliver(gate, 1, SendEvent(1, savepoint, False))
    deliver(gate, 1, SendData(2, after[0], 1))
    deliver(gate, 1, SendData(3, after[1], 0))
    assert gate.poll() == (1, savepoint)
    gate.block(1)
    deliver(gate, 1, SendEvent(3, Event({"t": "barrier", "id": 3}), True))  # after seq 3
    assert gate.start_recording(3)[1] == after
