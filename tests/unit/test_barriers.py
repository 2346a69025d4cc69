"""Barrier handling over random interleavings: the snapshot plus the channel state accounts for every
record before the barrier exactly once and in order.

A model task drives the real pieces (Subpartition and ChannelSender at the producer, InputGate,
ChannelReader and BarrierHandler at the consumer) the way runtime/task.py does, on several channels,
with records that span buffers. For each channel the records before the barrier must equal, in order:
what the task processed before its snapshot, then the input channel state it recorded, then the output
channel state the producer persisted for the buffers the barrier overtook.
"""

from __future__ import annotations

from typing import Any

import msgpack
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from netstack.credit import ChannelSender, Event, SendData
from runtime.checkpointing.barriers import (
    Abandon,
    BarrierHandler,
    BarrierSpec,
    Block,
    InputsComplete,
    Snapshot,
    UnblockAll,
)
from runtime.execution.channels import (
    ChannelReader,
    InputChannel,
    InputGate,
    Subpartition,
    overtaken_records,
    split_records,
    whole_records,
    whole_records_length,
)

CAPACITY = 24  # tiny buffers, so most records span two or more of them


def decode(stream: bytes) -> list[Any]:
    return [msgpack.unpackb(r, use_list=False) for r in split_records(stream)]


class ModelTask:
    """Just what InputGate needs from a task (its GateListener)."""

    def __init__(self) -> None:
        self.mailbox: list[tuple[str, int, Any]] = []
        self.deadline_specs: list[dict[str, Any]] = []

    def wake(self) -> None:
        pass

    def on_priority_event(self, channel_id: int, seq: int, ev: Event) -> None:
        self.mailbox.append(("barrier", channel_id, ev))

    def on_barrier_queued(self, channel_id: int, body: dict[str, Any]) -> None:
        # as the task does: start the deadline clock, and tell the handler through the mailbox
        self.deadline_specs.append(body)
        if body.get("mode") == "aligned_timeout":
            self.mailbox.append(("arrived", channel_id, BarrierSpec.from_body(body)))


class Scenario:
    def __init__(self, mode: str, records: dict[int, list[tuple[int, int, str]]], barrier_at: dict[int, int]):
        self.mode = mode
        self.records = records
        self.barrier_at = barrier_at
        self.spec = BarrierSpec(1, mode, 0.0, 1.0 if mode == "aligned_timeout" else None)
        self.barrier = Event(self.spec.to_body())
        self.task = ModelTask()
        channels = sorted(records)
        self.gate = InputGate(self.task, [InputChannel(c, i, 0, f"0:{i}", key=str(c)) for i, c in enumerate(channels)],
                              exclusive=10_000, floating=0)
        self.gate.ledger.take_announcements()  # the producers below hold these credits
        self.handler = BarrierHandler(channels)
        self.subs = {}
        for c in channels:
            sender = ChannelSender(c)
            sender.add_credit(10_000)
            self.subs[c] = Subpartition(sender, limit=10_000, capacity=CAPACITY)
        self.produced = dict.fromkeys(channels, 0)
        self.barrier_sent = dict.fromkeys(channels, False)
        self.readers = {c: ChannelReader() for c in channels}
        self.processed: dict[int, list[Any]] = {c: [] for c in channels}
        self.current: int | None = None
        self.out_state: dict[int, list[Any]] = {c: [] for c in channels}
        self.at_snapshot: dict[int, list[Any]] | None = None
        self.prefix: dict[int, bytes] = {}
        self.captured: dict[int, list[Any]] = {}
        self.in_state: dict[int, list[Any]] | None = None
        self.unaligned = False

    # -- producer -----------------------------------------------------------------

    def produce(self, c: int) -> bool:
        sub = self.subs[c]
        i = self.produced[c]
        if i == self.barrier_at[c] and not self.barrier_sent[c]:
            self.barrier_sent[c] = True
            if self.mode == "unaligned":
                self.out_state[c] += decode(overtaken_records(sub.add_event(self.barrier, priority=True)))
            else:
                sub.add_event(self.barrier)
            return True
        if i >= len(self.records[c]):
            return False
        sub.append(msgpack.packb(self.records[c][i]))
        self.produced[c] += 1
        return True

    def flush(self, c: int) -> bool:
        had = bool(self.subs[c].buf)
        self.subs[c].flush()
        return had

    def deliver(self, c: int) -> bool:
        item = self.subs[c].sender.pop_sendable()
        if item is None:
            return False
        if isinstance(item, SendData):
            self.gate.ledger.on_data(c, item.seq, item.backlog)
            self.gate.deliver_data(c, item.seq, item.buffer)
        else:
            self.gate.ledger.on_event(c, item.seq, item.priority)
            self.gate.deliver_event(c, item.seq, item.event, item.priority)
        return True

    def deadline(self) -> None:
        """The aligned timeout expires: producers promote a barrier still queued, the task switches."""
        for c, sub in self.subs.items():
            if self.barrier_sent[c] and sub.sender.holds(self.barrier):
                overtaken = sub.promote(self.barrier)
                assert overtaken is not None
                self.out_state[c] += decode(overtaken_records(overtaken))
        if self.task.deadline_specs or self.handler.pending is not None:
            self.carry_out(self.handler.on_time(2.0, self.spec))

    # -- consumer -------------------------------------------------------------------

    def step(self) -> bool:
        """What the task does next: mail first, then one record, then the next buffer or event."""
        if self.task.mailbox:
            kind, c, payload = self.task.mailbox.pop(0)
            if kind == "arrived":
                self.carry_out(self.handler.on_arrival(c, payload))
            else:
                spec = BarrierSpec.from_body(payload.body)
                self.carry_out(self.handler.on_barrier(c, spec, priority=True, now=0.0))
            return True
        if self.current is not None:
            c = self.current
            try:
                record = next(self.readers[c].unpacker)
            except StopIteration:
                self.readers[c].trim()
                self.gate.consumed(c)
                self.current = None
                return True
            self.processed[c].append(record)
            self.readers[c].consumed = self.readers[c].unpacker.tell()  # as the task does after each record
            return True
        taken = self.gate.poll()
        if taken is None:
            return False
        c, item = taken
        if isinstance(item, Event):
            self.carry_out(self.handler.on_barrier(c, BarrierSpec.from_body(item.body), priority=False, now=0.0))
        else:
            self.readers[c].feed(item.data)
            self.current = c
        return True

    def carry_out(self, actions: list[Any]) -> None:
        for action in actions:
            if isinstance(action, Block):
                self.gate.block(action.channel_id)
            elif isinstance(action, UnblockAll):
                self.gate.unblock_all()
            elif isinstance(action, Snapshot):
                assert self.at_snapshot is None, "snapshot taken twice"
                self.at_snapshot = {c: list(v) for c, v in self.processed.items()}
                self.unaligned = action.unaligned
                if action.unaligned:
                    self.captured = self.gate.start_recording(action.spec.checkpoint_id)
                    self.prefix = {c: r.unconsumed() for c, r in self.readers.items()}
            elif isinstance(action, InputsComplete):
                assert self.in_state is None, "inputs completed twice"
                self.in_state = {c: [] for c in self.records}
                if action.unaligned:
                    for c in self.records:
                        self.in_state[c] = decode(whole_records(self.prefix.get(c, b""), self.captured.get(c, [])))
                self.gate.stop_recording()
            elif isinstance(action, Abandon):
                raise AssertionError("a single checkpoint must not be abandoned")

    def drain(self) -> None:
        for _ in range(100_000):
            progressed = False
            for c in self.records:
                progressed |= self.produce(c)
                progressed |= self.flush(c)
                progressed |= self.deliver(c)
            progressed |= self.step()
            if not progressed:
                return
        raise AssertionError("no quiescence: something loops")


records_strategy = st.dictionaries(
    keys=st.integers(1, 3),
    values=st.lists(st.text(alphabet="abcdefgh", min_size=0, max_size=40), min_size=0, max_size=12),
    min_size=1, max_size=3,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mode=st.sampled_from(["unaligned", "aligned", "aligned_timeout"]), payloads=records_strategy, data=st.data())
def test_snapshot_and_channel_state_account_for_every_record_before_the_barrier(mode, payloads, data):
    records = {c: [(c, i, text) for i, text in enumerate(texts)] for c, texts in payloads.items()}
    barrier_at = {c: data.draw(st.integers(0, len(rs)), label=f"barrier after records on {c}")
                  for c, rs in records.items()}
    s = Scenario(mode, records, barrier_at)
    channels = sorted(records)
    steps = data.draw(st.lists(st.tuples(st.sampled_from(["produce", "flush", "deliver", "step", "deadline"]),
                                         st.sampled_from(channels)), max_size=120), label="interleaving")
    for action, c in steps:
        if action == "produce":
            s.produce(c)
        elif action == "flush":
            s.flush(c)
        elif action == "deliver":
            s.deliver(c)
        elif action == "step":
            s.step()
        elif action == "deadline" and mode == "aligned_timeout":
            s.deadline()
    s.drain()

    assert s.at_snapshot is not None and s.in_state is not None, "the checkpoint never completed"
    for c in channels:
        before = records[c][: barrier_at[c]]
        accounted = s.at_snapshot[c] + s.in_state[c] + s.out_state[c]
        assert accounted == before, (c, mode, accounted, before)
        assert s.processed[c] == records[c], "every record is processed exactly once in the end"
    if not s.unaligned:
        assert all(not v for v in s.in_state.values()) and all(not v for v in s.out_state.values())


def test_overtaken_records_keep_the_partly_sent_record_whole():
    sender = ChannelSender(1)
    sub = Subpartition(sender, limit=100, capacity=8)
    long_record = msgpack.packb("x" * 20)  # spans three buffers
    sub.append(long_record)
    sub.append(msgpack.packb("tail"))
    sender.add_credit(1)
    sent = sender.pop_sendable()  # the head of the long record goes out
    assert isinstance(sent, SendData)
    overtaken = sub.add_event(Event({"t": "barrier"}), priority=True)
    assert decode(overtaken_records(overtaken)) == ["x" * 20, "tail"]
    # and the consumer drops its partial record: nothing whole in what it received
    assert whole_records_length(sent.buffer.data) == 0
