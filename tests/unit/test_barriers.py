"""Barrier handling over random interleavings: the snapshot plus the channel state accounts for every
record before the barrier exactly once and in order.

A model task drives the real pieces (Subpartition and ChannelSender at the producer, InputGate,
ChannelReader and BarrierHandler at the consumer) the way runtime/task.py does, on several channels,
with records that span buffers. For each channel the records before the barrier must equal, in order:
what the task processed before its snapshot, then the input channel state it recorded, then the output
channel state the producer persisted for the buffers the barrier overtook.

Mode "switch" is an aligned checkpoint whose channels switch to unaligned one by one (a channel timeout, a
random byte threshold and a random cap on the task's persisted in-flight bytes): a mixed checkpoint must add
up the same way, with recorded input bytes within the cap unless a producer promoted its barrier.
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
from runtime.graph.checkpoint_options import CheckpointOptions
from runtime.graph.enums import CheckpointMode

CAPACITY = 24  # tiny buffers, so most records span two or more of them


def decode(stream: bytes) -> list[Any]:
    return [msgpack.unpackb(r, use_list=False) for r in split_records(stream)]


class ModelTask:
    """Just what InputGate needs from a task (its GateListener)."""

    def __init__(self) -> None:
        self.mailbox: list[tuple[str, int, Any]] = []
        self.deadline_specs: list[dict[str, Any]] = []
        self.gate: InputGate | None = None
        self.clock = 0.0

    def queued_bytes(self, channel_id: int) -> int:
        assert self.gate is not None
        return sum(len(b.data) for _, b in self.gate.queues[channel_id] if not isinstance(b, Event))

    def wake(self) -> None:
        pass

    def on_priority_event(self, channel_id: int, seq: int, ev: Event) -> None:
        self.mailbox.append(("barrier", channel_id, ev))

    def on_barrier_queued(self, channel_id: int, body: dict[str, Any]) -> None:
        # as the task does: start the deadline clock, and tell the handler through the mailbox
        self.deadline_specs.append(body)
        spec = BarrierSpec.from_body(body)
        if spec.switching:  # called before the barrier is queued: the gate holds exactly the data ahead of it
            self.mailbox.append(("arrived", channel_id, (spec, self.clock, self.queued_bytes(channel_id))))
        elif body.get("mode") == "aligned_timeout":
            self.mailbox.append(("arrived", channel_id, (spec, 0.0, 0)))


class Scenario:
    def __init__(self, mode: str, records: dict[int, list[tuple[int, int, str]]], barrier_at: dict[int, int],
                 *, channel_bytes: int | None = None, cap: int | None = None):
        self.mode = mode
        self.records = records
        self.barrier_at = barrier_at
        if mode == "switch":
            options = CheckpointOptions(channel_timeout_s=1.0, channel_inflight_bytes=channel_bytes,
                                        max_inflight_bytes=cap)
            self.spec = BarrierSpec(1, 0.0, options)
        else:
            self.spec = BarrierSpec(1, 0.0, CheckpointOptions(CheckpointMode(mode), aligned_timeout_s=1.0
                                                              if mode == "aligned_timeout" else None))
        self.barrier = Event(self.spec.to_body())
        self.promoted = False  # a producer let its barrier overtake data (switch: its output side switched)
        self.task = ModelTask()
        channels = sorted(records)
        self.gate = InputGate(self.task, [InputChannel(c, i, 0, f"0:{i}", key=str(c)) for i, c in enumerate(channels)],
                              exclusive=10_000, floating=0)
        self.gate.ledger.take_announcements()  # the producers below hold these credits
        self.task.gate = self.gate
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
        return self.append_next(c)

    def append_next(self, c: int) -> bool:
        """The producer writes its next record, if any is left."""
        i = self.produced[c]
        if i >= len(self.records[c]):
            return False
        self.subs[c].append(msgpack.packb(self.records[c][i]))
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

    def deadline(self, only: int | None = None) -> None:
        """The aligned timeout expires: producers promote a barrier still queued, the task switches. In mode
        switch, the channel timeout of producer `only` (or the consumer's, for None)."""
        if self.mode == "switch":
            self.task.clock += 1.0
            if only is None:
                self.carry_out(self.handler.on_time(self.task.clock, self.spec))
                return
        for c, sub in self.subs.items():
            if only is not None and c != only:
                continue
            if self.barrier_sent[c] and sub.sender.holds(self.barrier):
                overtaken = sub.promote(self.barrier)
                assert overtaken is not None
                self.promoted = True
                self.out_state[c] += decode(overtaken_records(overtaken))
        if self.task.deadline_specs or self.handler.pending is not None:
            self.carry_out(self.handler.on_time(2.0, self.spec))

    # -- consumer -------------------------------------------------------------------

    def step(self) -> bool:
        """What the task does next: mail first, then one record, then the next buffer or event."""
        if self.task.mailbox:
            kind, c, payload = self.task.mailbox.pop(0)
            if kind == "arrived":
                spec, arrived_at, ahead = payload
                self.carry_out(self.handler.on_arrival(c, spec, now=arrived_at, bytes_ahead=ahead))
            else:
                spec = BarrierSpec.from_body(payload.body)
                self.carry_out(self.handler.on_barrier(c, spec, priority=True, now=0.0,
                                                       queued_bytes=self.task.queued_bytes(c)))
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
                self.gate.unblock_all(action.keep)
            elif isinstance(action, Snapshot):
                self.snapshot(action)
            elif isinstance(action, InputsComplete):
                self.inputs_complete(action)
                self.gate.stop_recording(action.spec.checkpoint_id)
            elif isinstance(action, Abandon):
                raise AssertionError(f"checkpoint {action.checkpoint_id} abandoned")

    def snapshot(self, action: Snapshot) -> None:
        assert self.at_snapshot is None, "snapshot taken twice"
        self.at_snapshot = {c: list(v) for c, v in self.processed.items()}
        self.unaligned = action.unaligned or action.record_inputs
        if self.unaligned:
            self.captured = self.gate.start_recording(action.spec.checkpoint_id)
            self.prefix = {c: r.unconsumed() for c, r in self.readers.items()}

    def inputs_complete(self, action: InputsComplete) -> None:
        assert self.in_state is None, "inputs completed twice"
        self.in_state = {c: [] for c in self.records}
        if action.unaligned:
            for c in self.records:
                self.in_state[c] = decode(whole_records(self.prefix.get(c, b""), self.captured.get(c, [])))

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
    check_interleaving(mode, payloads, data)


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(payloads=records_strategy, data=st.data())
def test_a_mixed_checkpoint_accounts_for_every_record_before_the_barrier_within_the_cap(payloads, data):
    check_interleaving("switch", payloads, data)


def check_interleaving(mode: str, payloads: dict[int, list[str]], data: Any) -> None:
    records = {c: [(c, i, text) for i, text in enumerate(texts)] for c, texts in payloads.items()}
    barrier_at = {c: data.draw(st.integers(0, len(rs)), label=f"barrier after records on {c}")
                  for c, rs in records.items()}
    channel_bytes = data.draw(st.one_of(st.none(), st.integers(1, 100)), label="channel byte threshold")
    cap = data.draw(st.one_of(st.none(), st.integers(1, 200)), label="in-flight cap")
    s = Scenario(mode, records, barrier_at, channel_bytes=channel_bytes, cap=cap)
    channels = sorted(records)
    actions = ["produce", "flush", "deliver", "step", "deadline"] + (["timer"] if mode == "switch" else [])
    steps = data.draw(st.lists(st.tuples(st.sampled_from(actions), st.sampled_from(channels)), max_size=120),
                      label="interleaving")
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
        elif action == "deadline" and mode == "switch":
            s.deadline(only=c)  # that producer's channel timeout: its barrier overtakes its queue
        elif action == "timer":
            s.deadline()  # the consumer's channel timeout
    s.drain()

    assert s.at_snapshot is not None and s.in_state is not None, "the checkpoint never completed"
    for c in channels:
        before = records[c][: barrier_at[c]]
        accounted = s.at_snapshot[c] + s.in_state[c] + s.out_state[c]
        assert accounted == before, (c, mode, accounted, before)
        assert s.processed[c] == records[c], "every record is processed exactly once in the end"
    if not s.unaligned:
        assert all(not v for v in s.in_state.values())
        assert mode == "switch" or all(not v for v in s.out_state.values())
    if mode == "switch" and cap is not None and not s.promoted:
        # within the cap, plus at most the unprocessed part of the buffer each channel was in when it switched
        recorded = sum(len(whole_records(s.prefix.get(c, b""), s.captured.get(c, []))) for c in channels)
        assert recorded <= cap + CAPACITY * len(channels), (recorded, cap)


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


class OverlapScenario(Scenario):
    """A savepoint (1, in-band, a fence in the producers' queues) and a newer unaligned checkpoint (2, on the
    priority lane) in flight together. A producer emits the unaligned barrier after the savepoint's (it waits
    behind it while it is queued) or, as an upstream task that took it beside the savepoint does, before it."""

    def __init__(self, records: dict[int, list[tuple[int, int, str]]], savepoint_at: dict[int, int],
                 unaligned_at: dict[int, int], unaligned_first: dict[int, bool]) -> None:
        super().__init__("aligned", records, savepoint_at)
        self.spec = BarrierSpec(1, 0.0, CheckpointOptions(savepoint=True))
        self.barrier = Event(self.spec.to_body())
        self.unaligned_barrier = Event(BarrierSpec(2, 0.0, CheckpointOptions(CheckpointMode.UNALIGNED)).to_body())
        self.unaligned_at = unaligned_at
        self.unaligned_first = unaligned_first
        self.unaligned_sent = dict.fromkeys(records, False)
        self.snapshots: dict[int, dict[int, list[Any]]] = {}
        self.captures: dict[int, tuple[dict[int, bytes], dict[int, list[Any]]]] = {}
        self.inputs: dict[int, dict[int, list[Any]]] = {}

    def produce(self, c: int) -> bool:
        sub, i = self.subs[c], self.produced[c]
        unaligned_due = i == self.unaligned_at[c] and not self.unaligned_sent[c]
        if unaligned_due and (self.barrier_sent[c] or self.unaligned_first[c] or i < self.barrier_at[c]):
            self.unaligned_sent[c] = True
            self.out_state[c] += decode(overtaken_records(sub.add_event(self.unaligned_barrier, priority=True)))
            return True
        if i == self.barrier_at[c] and not self.barrier_sent[c]:
            self.barrier_sent[c] = True
            sub.add_event(self.barrier, fence=True)
            return True
        return self.append_next(c)

    def snapshot(self, action: Snapshot) -> None:
        n = action.spec.checkpoint_id
        assert n not in self.snapshots, "snapshot taken twice"
        self.snapshots[n] = {c: list(v) for c, v in self.processed.items()}
        if action.unaligned:
            prefix = {c: r.unconsumed() for c, r in self.readers.items()}
            self.captures[n] = (prefix, self.gate.start_recording(n))

    def inputs_complete(self, action: InputsComplete) -> None:
        n = action.spec.checkpoint_id
        assert n in self.snapshots and n not in self.inputs, "inputs completed twice or before the snapshot"
        prefix, captured = self.captures.get(n, ({}, {}))
        self.inputs[n] = {c: decode(whole_records(prefix.get(c, b""), captured.get(c, []))) for c in self.records}


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(payloads=records_strategy, data=st.data())
def test_a_savepoint_and_an_unaligned_checkpoint_beside_it_each_account_for_their_records(payloads, data):
    """Whichever of the two barriers a producer emits first and however the task interleaves them, both complete:
    the savepoint's snapshot holds exactly the records before its barrier (no channel state), and the unaligned
    checkpoint's snapshot, input and output channel state hold exactly those before its own."""
    records = {c: [(c, i, text) for i, text in enumerate(texts)] for c, texts in payloads.items()}
    channels = sorted(records)
    savepoint_at = {c: data.draw(st.integers(0, len(records[c])), label=f"savepoint after on {c}") for c in channels}
    unaligned_at = {c: data.draw(st.integers(0, len(records[c])), label=f"unaligned after on {c}") for c in channels}
    first = {c: data.draw(st.booleans(), label=f"unaligned first on {c} if both at once") for c in channels}
    s = OverlapScenario(records, savepoint_at, unaligned_at, first)
    steps = data.draw(st.lists(st.tuples(st.sampled_from(["produce", "flush", "deliver", "step"]),
                                         st.sampled_from(channels)), max_size=150), label="interleaving")
    for action, c in steps:
        getattr(s, action)(*(() if action == "step" else (c,)))
    s.drain()

    assert set(s.inputs) == {1, 2}, ("both complete", s.snapshots.keys(), s.inputs.keys())
    for c in channels:
        assert s.snapshots[1][c] == records[c][: savepoint_at[c]], (c, "savepoint")
        assert s.inputs[1][c] == []
        accounted = s.snapshots[2][c] + s.inputs[2][c] + s.out_state[c]
        assert accounted == records[c][: unaligned_at[c]], (c, accounted, unaligned_at[c])
        assert s.processed[c] == records[c], "every record is processed exactly once in the end"
