"""Which subpartitions a task's flush tick visits (OutputGate.due), and which channels the buffer sizing
samples (InflightBound.adjust): only those with something to do, with the results of a full pass."""

from __future__ import annotations

import msgpack

from netstack.credit import ChannelSender, Event
from runtime.execution.channels import OutputGate, Subpartition
from runtime.execution.inflight import InflightBound, RateEstimate


def _subs(n: int, *, capacity: int = 64) -> tuple[OutputGate, list[Subpartition]]:
    gate = OutputGate()
    subs = [Subpartition(ChannelSender(c), limit=1000, capacity=capacity) for c in range(n)]
    for sub in subs:
        sub.gate = gate
    return gate, subs


def test_only_subpartitions_that_took_data_are_due_in_the_order_they_took_it() -> None:
    gate, subs = _subs(4)
    assert gate.take_due() == []
    subs[2].append(msgpack.packb("a"))
    subs[0].append(msgpack.packb("b"))
    subs[2].append(msgpack.packb("c"))  # already due
    assert subs[3].append_run(msgpack.packb("d") + msgpack.packb("e"))
    assert gate.take_due() == [subs[2], subs[0], subs[3]]
    assert gate.take_due() == []  # taken: the tick flushes them


def test_a_builder_holding_data_is_always_due() -> None:
    """Invariant: a non-empty builder is in `due` until a tick takes it (and the tick flushes it)."""
    gate, (sub,) = _subs(1, capacity=16)
    record = msgpack.packb("x" * 40)  # spans three buffers: the last part stays in the builder
    sub.append(record)
    assert sub.sender.queued_buffers == 2 and sub.buf
    assert gate.take_due() == [sub]
    sub.flush()
    sub.append(msgpack.packb("y" * 30))  # again across a cut, starting in an empty builder
    assert sub.buf and gate.take_due() == [sub]
    sub.flush()
    sub.add_event(Event({"t": "x"}))
    assert gate.take_due() == []  # an event flushes, it adds no data


def test_a_flushed_builder_left_due_is_harmless_and_an_empty_one_never_becomes_due() -> None:
    gate, subs = _subs(2)
    subs[0].append(msgpack.packb(1))
    subs[0].flush()  # by a barrier, say: still listed, the tick finds it empty
    assert gate.take_due() == [subs[0]] and not subs[0].buf
    subs[1].flush()
    assert gate.take_due() == []


def test_the_sizing_samples_only_channels_that_moved_or_still_age() -> None:
    subs = [Subpartition(ChannelSender(c), limit=64, capacity=32768) for c in range(3)]
    bound = InflightBound(subs, target_s=1.0, buffers_in_path=74, max_bytes=32768)
    assert bound.adjust(0.0) == 3  # the first pass samples all
    assert bound.adjust(1.0) == 0  # nothing moved
    subs[1].bytes_out += 310_000
    assert bound.adjust(2.0) == 1
    assert subs[1].capacity == 4189 and subs[0].capacity == subs[2].capacity == 1024
    assert bound.adjust(3.0) == 0  # one sample: nothing to age out, the same size
    subs[1].bytes_out += 310_000
    assert bound.adjust(4.0) == 1
    assert bound.adjust(5.0) == 1  # two samples: the older one ages out of the window in time


def test_skipping_idle_passes_gives_the_estimates_of_full_passes() -> None:
    """The rate after an idle spell is timed from the last idle pass, as when every pass sampled."""
    moves = {1.0: 310_000, 2.0: 0, 3.0: 0, 4.0: 155_000, 5.0: 0, 9.0: 620_000, 10.0: 0, 11.0: 77_000}
    sub = Subpartition(ChannelSender(1), limit=64, capacity=32768)
    bound = InflightBound([sub], target_s=1.0, buffers_in_path=74, max_bytes=32768)
    full, total = RateEstimate(), 0
    bound.adjust(0.0)
    full.sample(0, 0.0)
    now = 0.0
    while now < 12.0:
        now += 1.0
        total += moves.get(now, 0)
        sub.bytes_out = total
        bound.adjust(now)
        assert bound.channels[0][1].rate == full.sample(total, now), now


def test_a_size_left_for_a_busy_builder_makes_it_due() -> None:
    gate, (sub,) = _subs(1)
    bound = InflightBound([sub], target_s=1.0, buffers_in_path=74, max_bytes=32768)
    bound.adjust(0.0)
    gate.take_due()
    sub.deferred = []
    sub.bytes_out += 310_000
    bound.adjust(1.0)
    assert sub.wanted_capacity == 4189 and gate.take_due() == [sub]
    assert bound.adjust(2.0) == 1  # still waiting for its task: asked again
