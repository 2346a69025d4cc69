"""Periodic watermarks at a source (`BoundedOutOfOrderness.emit_interval_ms`, Flink's auto-watermark interval):
the watermark leaves after a whole chunk at most once per interval and when the source has nothing to read,
never before the records it covers; per-record emission (the default) is unchanged."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest

from runtime.api import BoundedOutOfOrderness, GeneratorSource, Job
from runtime.api.time import MIN_WATERMARK
from runtime.execution.operators import Chain, RecordWriter
from runtime.execution.task_time import TaskTime
from runtime.execution.watermarks import WatermarkGenerator
from tests.support.buffers import make_subs, sent

HOUR_MS = 3_600_000  # an interval no test run reaches: only the first chunk and flushes send a watermark


def source_task(strategy: BoundedOutOfOrderness, state: Any = None) -> tuple[TaskTime, list[Any]]:
    job = Job()
    source = GeneratorSource(count=1)
    job.source(source, watermarks=strategy).map(lambda r: r, name="after")
    subs = make_subs(1, 1 << 20)
    chain = Chain(job, [0, 1], subtask_index=0, parallelism=1, attempt=0,
                  outputs=[RecordWriter(subs, "forward", None, job.max_parallelism, 0)])
    chain.open()
    return TaskTime(chain, source=source, channel_keys=[], state=state), subs


def decode(subs: list[Any]) -> list[Any]:
    for sub in subs:
        sub.flush()
    unpacker = msgpack.Unpacker(use_list=False, raw=False)
    for data, _, _ in sent(subs[0]):
        unpacker.feed(data)
    return list(unpacker)


def periodic(interval_ms: int = HOUR_MS, delay: int = 0) -> BoundedOutOfOrderness:
    return BoundedOutOfOrderness(max_delay_ms=delay, timestamp=lambda r: r, emit_interval_ms=interval_ms)


def test_per_record_emission_cuts_after_each_record_that_advances() -> None:
    time_, subs = source_task(BoundedOutOfOrderness(max_delay_ms=0, timestamp=lambda r: r))
    time_.emit([100, 105, 90])
    assert decode(subs) == [(100, 100), 99, (105, 105), 104, (90, 90)]  # 90 arrives behind watermark 104


def test_periodic_emission_sends_one_watermark_per_interval_after_the_chunk_and_when_drained() -> None:
    time_, subs = source_task(periodic())
    time_.emit([100, 105, 90])  # the first chunk: the interval has not started, so its watermark leaves
    time_.emit([200, 150])  # within the interval: records only
    assert decode(subs) == [(100, 100), (105, 105), (90, 90), 104, (200, 200), (150, 150)]
    assert time_.forwarded == 104
    time_.flush_periodic()  # the source has nothing to read: what it holds back leaves
    time_.flush_periodic()  # nothing new: nothing sent
    assert decode(subs) == [199]
    assert time_.forwarded == 199


def test_periodic_watermark_covers_the_highest_timestamp_and_floors_to_the_granularity() -> None:
    strategy = BoundedOutOfOrderness(max_delay_ms=10, timestamp=lambda r: r, granularity_ms=100,
                                     emit_interval_ms=HOUR_MS)
    time_, subs = source_task(strategy)
    time_.emit([1_250, 1_480, 1_300])
    assert decode(subs) == [(1_250, 1_250), (1_480, 1_480), (1_300, 1_300), 1_400]  # floor(1480 - 11)


def test_a_watermark_held_back_is_not_in_the_snapshot_and_leaves_after_a_restore() -> None:
    time_, subs = source_task(periodic())
    time_.emit([100])
    time_.emit([300])
    snapshot = time_.snapshot()
    assert snapshot["generator"][:2] == [300, 99]  # the highest timestamp seen, the last watermark really sent
    restored, subs2 = source_task(periodic(), state=snapshot)
    assert restored.forwarded == 99
    restored.flush_periodic()
    assert decode(subs2) == [299]


def test_interval_elapsing_sends_the_watermark_after_the_next_chunk() -> None:
    time_, subs = source_task(periodic(interval_ms=1))
    time_.emit([10])
    time_._next_emit_at = 0.0  # the interval has passed (the clock is read once per chunk)
    time_.emit([20, 30])
    assert decode(subs) == [(10, 10), 9, (20, 20), (30, 30), 29]


def test_generator_observe_then_due_equals_per_record_emission_at_the_end() -> None:
    strategy = BoundedOutOfOrderness(max_delay_ms=7, timestamp=lambda r: r, granularity_ms=5)
    per_record, held = WatermarkGenerator(strategy), WatermarkGenerator(strategy)
    stamps = [40, 12, 99, 98, 150, 3]
    emitted = [w for w in map(per_record.on_timestamp, stamps) if w is not None]
    assert held.due() is None  # nothing seen yet
    for ts in stamps:
        held.observe(ts)
    assert held.due() == emitted[-1] == 140 and held.due() is None
    assert held.snapshot() == per_record.snapshot()
    assert held.last_emitted > MIN_WATERMARK


def test_strategy_refuses_a_bad_interval() -> None:
    for bad in (0, -5, 1.5):
        with pytest.raises(ValueError, match="emit_interval_ms"):
            BoundedOutOfOrderness(max_delay_ms=0, timestamp=lambda r: r, emit_interval_ms=bad)  # type: ignore
    assert periodic().periodic(50).emit_interval_ms == 50
