"""The in-flight bound: buffer sizes from measured throughput, applied between records."""

from __future__ import annotations

import msgpack
import pytest

from netstack.credit import Buffer, ChannelSender
from runtime.execution.channels import Subpartition, split_records
from runtime.execution.inflight import InflightBound, RateEstimate, buffer_size_for, resize
from runtime.graph.config import parse_inflight_target
from runtime.graph.job_config import ChannelConfig, JobConfig


def test_buffer_size_makes_a_full_path_hold_the_target() -> None:
    # 310 KB/s drained, 1 s target, 64 queued + 2 exclusive + 8 floating buffers: about 4.2 KB each
    assert buffer_size_for(310_000, 1.0, 74, max_bytes=32768) == 4189
    assert buffer_size_for(310_000, 0.5, 74, max_bytes=32768) == 2094


def test_buffer_size_stays_within_its_bounds() -> None:
    assert buffer_size_for(100e6, 1.0, 14, max_bytes=32768) == 32768  # fast channel: the configured size
    assert buffer_size_for(10.0, 1.0, 74, max_bytes=32768, min_bytes=1024) == 1024
    assert buffer_size_for(10.0, 1.0, 74, max_bytes=512, min_bytes=1024) == 512  # never above the maximum


def test_no_target_keeps_the_configured_size_and_no_estimate_starts_small() -> None:
    assert buffer_size_for(1000.0, 0.0, 74, max_bytes=32768) == 32768
    assert buffer_size_for(None, 0.0, 74, max_bytes=32768) == 32768
    # before any estimate: the minimum, so that a job's start does not queue seconds of full-size buffers
    assert buffer_size_for(None, 1.0, 74, max_bytes=32768) == 1024
    assert buffer_size_for(None, 1.0, 74, max_bytes=512) == 512
    with pytest.raises(ValueError):
        buffer_size_for(1000.0, 1.0, 0, max_bytes=32768)


def test_rate_is_the_median_of_recent_periods() -> None:
    est = RateEstimate(window_s=3.0)
    assert est.sample(0, now=0.0) is None  # the first sample only sets the origin
    assert est.sample(1000, now=1.0) == 1000.0
    assert est.sample(4000, now=2.0) == 2000.0  # median of 1000 and 3000
    est.sample(5000, now=3.0)  # 1000 again
    est.sample(5500, now=4.0)  # 500: the 1000 of t=1 left the window
    assert est.rate == 1000.0  # median of 3000, 1000, 500


def test_a_period_without_progress_keeps_the_estimate() -> None:
    # A channel blocked by an aligned checkpoint (or idle) drains nothing for a while: that says nothing about
    # its throughput, and shrinking its buffers to the minimum would starve it once it flows again.
    est = RateEstimate(window_s=3.0)
    est.sample(0, now=0.0)
    est.sample(1000, now=1.0)
    assert est.sample(1000, now=5.0) == 1000.0  # the newest sample stays even when it is old
    assert est.sample(2000, now=6.0) == 1000.0  # measured from the stall's end, not over it


def test_partial_stalls_do_not_drag_the_estimate_down() -> None:
    # A channel blocked for part of every second (back-to-back aligned checkpoints) still reports what it
    # drains when it flows: a mean would spiral down (smaller buffers, less in flight, lower rate, ...).
    est = RateEstimate(window_s=3.0)
    total, now = 0, 0.0
    est.sample(total, now)
    for step in range(30):
        now += 0.2
        total += 60 if step % 5 == 4 else 200  # one period in five is mostly stalled
        est.sample(total, now)
    assert est.rate == pytest.approx(1000.0)


def _records(n: int, start: int = 0) -> list[bytes]:
    return [msgpack.packb([f"word{i % 7}", i]) for i in range(start, start + n)]


def _cut_stream(buffers: list[Buffer]) -> bytes:
    return b"".join(b.data for b in buffers)


def _queued(sender: ChannelSender) -> list[Buffer]:
    out = []
    sender.add_credit(1000)
    while (item := sender.pop_sendable()) is not None:
        out.append(item.buffer)  # type: ignore[union-attr]
    return out


def test_resize_between_records_keeps_records_whole() -> None:
    sub = Subpartition(ChannelSender(1), limit=1000, capacity=4096)
    records = _records(300)
    for r in records[:150]:
        sub.append(r)
    assert len(sub.buf) > 256  # the builder holds more than the new size
    resize(sub, 256)  # so it is flushed first: the writer's cut never starts a record past the cut
    assert sub.capacity == 256 and not sub.buf
    for r in records[150:]:
        sub.append(r)
    sub.flush()
    buffers = _queued(sub.sender)
    assert split_records(_cut_stream(buffers)) == records
    assert len(buffers[0].data) > 256  # the flushed builder, then buffers of the new size
    assert len(buffers) > 5 and all(len(b.data) <= 256 for b in buffers[1:])
    # every buffer that begins inside a record names that record whole (unaligned checkpoints rely on it)
    stream = _cut_stream(buffers)
    position = 0
    for b in buffers:
        cr = b.continued_record
        if cr is not None:
            assert any(stream[position - k: position - k + len(cr)] == cr for k in range(1, len(cr)))
        if b.first_record_offset >= 0:
            head = stream[position + b.first_record_offset:]
            assert split_records(head)[0] in records
        position += len(b.data)


def test_resize_to_the_same_size_or_above_the_builder_does_not_flush() -> None:
    sub = Subpartition(ChannelSender(1), limit=1000, capacity=4096)
    sub.append(msgpack.packb(["a", 1]))
    resize(sub, 4096)
    resize(sub, 1024)
    assert sub.buf and sub.sender.queued_buffers == 0 and sub.capacity == 1024


def test_bound_shrinks_a_slow_channel_and_leaves_a_fast_one() -> None:
    slow = Subpartition(ChannelSender(1), limit=64, capacity=32768)
    fast = Subpartition(ChannelSender(2), limit=64, capacity=32768)
    bound = InflightBound([slow, fast], target_s=1.0, buffers_in_path=74, max_bytes=32768)
    assert slow.capacity == fast.capacity == 1024  # nothing measured yet: start small
    bound.adjust(0.0)
    assert slow.capacity == fast.capacity == 1024
    slow.bytes_out += 310_000  # the counters the record writer keeps, one second later
    fast.bytes_out += 50_000_000
    bound.adjust(1.0)
    assert slow.capacity == 4189
    assert fast.capacity == 32768


def test_a_busy_builder_is_left_the_size_its_task_applies() -> None:
    """A task's own loop writes the builder whenever it runs (`deferred` set): the bound does not touch it but
    leaves the size it chose for the task's next tick, which applies it between records."""
    sub = Subpartition(ChannelSender(1), limit=64, capacity=32768)
    bound = InflightBound([sub], target_s=1.0, buffers_in_path=74, max_bytes=32768)
    bound.adjust(0.0)
    sub.deferred = []
    sub.bytes_out += 310_000
    bound.adjust(1.0)
    assert (sub.capacity, sub.wanted_capacity) == (1024, 4189)
    sub.deferred = None
    sub.bytes_out += 310_000
    bound.adjust(2.0)
    assert (sub.capacity, sub.wanted_capacity) == (4189, 0)


def test_inflight_target_parsing() -> None:
    assert parse_inflight_target("500ms") == 0.5
    assert parse_inflight_target(2) == 2.0
    assert parse_inflight_target("0") == 0.0
    for bad in ("-1", "soon", float("nan"), float("inf"), True):
        with pytest.raises(ValueError):
            parse_inflight_target(bad)


def test_channel_config_carries_the_target_and_the_path_length() -> None:
    cfg = JobConfig.from_document({"buffers_per_channel": 64, "inflight_target_s": "250ms"}).channels
    assert cfg.inflight_target_s == 0.25
    assert cfg.buffers_in_path == 64 + 2 + 8
    assert JobConfig.from_document({}).channels.inflight_target_s == 1.0
    assert JobConfig.from_document({"inflight_target_s": None}).channels == ChannelConfig()
