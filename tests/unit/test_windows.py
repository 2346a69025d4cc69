"""Windows through a real Chain (keyed state, timer queues, watermarks in band, side output edges): tumbling,
sliding and session windows, reduce/aggregate/process, allowed lateness and late records, checked against a
brute-force model of the documented semantics (runtime/api/windows.py) over random out-of-order inputs."""

from __future__ import annotations

from collections import Counter
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.api import (
    LATE_DATA,
    MAX_WATERMARK,
    MIN_WATERMARK,
    AggregateFunction,
    BoundedOutOfOrderness,
    EventTimeSessionWindows,
    GeneratorSource,
    Job,
    JobDefinitionError,
    OutputTag,
    SlidingEventTimeWindows,
    TumblingEventTimeWindows,
    TumblingProcessingTimeWindows,
)
from runtime.execution.operators import Chain, RecordWriter
from runtime.graph.plan import chain_graph
from runtime.state.registry import make_backend
from runtime.state.rocksdb import available as rocksdb_available
from tests.support.buffers import make_subs, sent
from tests.support.chain_time import advance_watermark
from tests.support.models import window_model


def decode(sub: Any) -> list[Any]:
    unpacker = msgpack.Unpacker(use_list=False, raw=False)
    for data, _, _ in sent(sub):
        unpacker.feed(data)
    return list(unpacker)


class WindowHarness:
    """A source -> key_by -> window chain driven by hand: records with timestamps, then watermarks."""

    def __init__(self, build: Any, state_backend: Any = None) -> None:
        job = Job()
        src = job.source(GeneratorSource(count=1),
                         watermarks=BoundedOutOfOrderness(max_delay_ms=0, timestamp=lambda r: r[1]))
        windowed = build(src.key_by(lambda r: r[0]))
        windowed.side_output(LATE_DATA).map(lambda r: r, name="late")  # a consumer: the tag is routed
        self.main, self.late = make_subs(1, 1 << 20), make_subs(1, 1 << 20)
        main_w = RecordWriter(self.main, "forward", None, job.max_parallelism, 0)
        late_w = RecordWriter(self.late, "forward", None, job.max_parallelism, 0)
        late_w.side_output = (windowed.node_id, LATE_DATA.name)
        self.chain = Chain(job, [windowed.node_id], subtask_index=0, parallelism=1, attempt=0,
                           outputs=[main_w, late_w], state_backend=state_backend)
        self.chain.open()

    def record(self, key: str, ts: int) -> None:
        self.chain.process_batch([(ts, (key, ts))])

    def watermark(self, wm: int) -> None:
        advance_watermark(self.chain, wm, 7)  # small chunks: a burst split over several turns

    def outputs(self) -> list[Any]:
        return [x for x in decode(self.main[0]) if isinstance(x, tuple)]

    def late_records(self) -> list[Any]:
        return [x[1] for x in decode(self.late[0]) if isinstance(x, tuple)]


def test_tumbling_count_fires_when_the_watermark_passes_the_end_and_sends_late_records_aside() -> None:
    h = WindowHarness(lambda k: k.window(TumblingEventTimeWindows(10)).count())
    for key, ts in [("a", 1), ("b", 3), ("a", 9), ("a", 12)]:
        h.record(key, ts)
    h.watermark(8)
    assert h.outputs() == []
    h.watermark(9)  # window [0, 10) fires at its max timestamp 9, rows stamped 9, in key order
    assert h.outputs() == [(9, ("a", 0, 10, 2)), (9, ("b", 0, 10, 1))]
    h.record("a", 5)  # its window is gone: late
    h.record("a", 15)
    h.watermark(MAX_WATERMARK)
    assert h.outputs() == [(19, ("a", 10, 20, 2))]
    assert h.late_records() == [("a", 5)]


def test_allowed_lateness_fires_again_per_late_record_then_drops_the_window() -> None:
    h = WindowHarness(lambda k: k.window(TumblingEventTimeWindows(10), allowed_lateness_ms=5)
                      .reduce(lambda a, b: (a[0], a[1] + b[1])))
    h.record("a", 2)
    h.record("a", 3)
    h.watermark(9)
    assert h.outputs() == [(9, ("a", 0, 10, ("a", 5)))]
    h.record("a", 4)  # watermark 9 < 9 + 5: still allowed, fires again at once with the new result
    assert h.outputs() == [(4, ("a", 0, 10, ("a", 9)))]
    h.watermark(14)  # the clean-up timer at 9 + 5
    h.record("a", 1)
    assert h.outputs() == []
    assert h.late_records() == [("a", 1)]


def test_sliding_windows_count_a_record_in_each_of_its_windows() -> None:
    h = WindowHarness(lambda k: k.window(SlidingEventTimeWindows(10, 5)).count())
    h.record("a", 7)  # in [0, 10) and [5, 15)
    h.record("a", 12)  # in [5, 15) and [10, 20)
    h.watermark(MAX_WATERMARK)
    assert h.outputs() == [(9, ("a", 0, 10, 1)), (14, ("a", 5, 15, 2)), (19, ("a", 10, 20, 1))]


class MeanAggregate(AggregateFunction):
    def create_accumulator(self) -> tuple[int, int]:
        return (0, 0)

    def add(self, value: Any, acc: Any) -> Any:
        return (acc[0] + value[1], acc[1] + 1)

    def get_result(self, acc: Any) -> float:
        return acc[0] / acc[1]

    def merge(self, a: Any, b: Any) -> Any:
        return (a[0] + b[0], a[1] + b[1])


def test_sessions_merge_when_a_record_bridges_them_and_delete_the_merged_timers() -> None:
    h = WindowHarness(lambda k: k.window(EventTimeSessionWindows(gap_ms=10)).aggregate(MeanAggregate()))
    h.record("a", 0)
    h.record("a", 30)  # a second session
    h.record("a", 15)  # [15, 25) overlaps [0, 10)? no; overlaps [30, 40)? no: a third one
    h.record("a", 8)  # [8, 18) bridges [0, 10) and [15, 25): one session [0, 25)
    h.watermark(24)
    assert h.outputs() == [(24, ("a", 0, 25, (0 + 15 + 8) / 3))]
    h.watermark(MAX_WATERMARK)
    assert h.outputs() == [(39, ("a", 30, 40, 30.0))]
    assert h.chain.timers is not None and h.chain.timers.timers.event.peek() is None


def test_process_window_gets_all_elements_in_arrival_order_across_chunks() -> None:
    h = WindowHarness(lambda k: k.window(TumblingEventTimeWindows(1000))
                      .process(lambda key, w, rs: (w.start, w.end, [r[1] for r in rs])))
    stamps = [(i * 7919) % 1000 for i in range(600)]  # more than two chunks of 256
    for ts in stamps:
        h.record("a", ts)
    h.watermark(MAX_WATERMARK)
    assert h.outputs() == [(999, ("a", 0, 1000, (0, 1000, tuple(stamps))))]


def test_window_state_survives_a_snapshot_and_restore_into_a_new_chain() -> None:
    build = lambda k: k.window(TumblingEventTimeWindows(10)).count()  # noqa: E731
    h = WindowHarness(build)
    h.record("a", 1)
    h.record("b", 2)
    h.watermark(5)
    keyed = msgpack.unpackb(msgpack.packb(h.chain.keyed_state), strict_map_key=False, use_list=False)
    again = WindowHarness(build)
    again.chain.restore_state({int(n): {name: dict(t) for name, t in tables.items()} for n, tables in keyed.items()},
                              None)
    again.chain.restore_watermarks(5, 5)
    again.record("a", 3)
    again.watermark(MAX_WATERMARK)
    assert again.outputs() == [(9, ("a", 0, 10, 2)), (9, ("b", 0, 10, 1))]


# -- against a brute-force model ----------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("abc"), st.integers(0, 200)), max_size=60),
       st.integers(0, 40), st.sampled_from([0, 7]), st.sampled_from([(10, None), (12, 5), (20, 20)]))
def test_tumbling_and_sliding_match_the_model(records: list[tuple[str, int]], delay: int, lateness: int,
                                              shape: tuple[int, int | None]) -> None:
    size, slide = shape
    assigner = TumblingEventTimeWindows(size) if slide is None else SlidingEventTimeWindows(size, slide)
    h = WindowHarness(lambda k: k.window(assigner, allowed_lateness_ms=lateness).count())
    max_ts = MIN_WATERMARK
    wm = MIN_WATERMARK
    for key, ts in records:
        h.record(key, ts)
        max_ts = max(max_ts, ts)
        if max_ts - delay - 1 > wm:
            wm = max_ts - delay - 1
            h.watermark(wm)
    h.watermark(MAX_WATERMARK)
    events: list[tuple[Any, ...]] = []
    max_ts = wm = MIN_WATERMARK
    for key, ts in records:
        events.append(("r", key, ts, (key, ts)))
        max_ts = max(max_ts, ts)
        if max_ts - delay - 1 > wm:
            wm = max_ts - delay - 1
            events.append(("w", wm))
    expected, late = window_model(events, assigner, lateness)
    assert Counter(r for _, r in h.outputs()) == expected
    assert h.late_records() == late


@pytest.mark.skipif(not rocksdb_available(), reason="rocksdict is not installed (the `rocksdb` extra)")
def test_windows_on_rocksdb_keep_their_contents_in_the_backend(tmp_path: Any) -> None:
    backend = make_backend("rocksdb", range(128), work_dir=str(tmp_path / "w"), options={})
    h = WindowHarness(lambda k: k.window(SlidingEventTimeWindows(10, 5), allowed_lateness_ms=3).count(), backend)
    records = [("a", 7), ("b", 3), ("a", 12), ("a", 4), ("b", 14)]
    for key, ts in records:
        h.record(key, ts)
    assert sum(1 for _ in backend.scan(range(128))) == 2  # one entry per key, in the backend
    assert h.chain.timers is not None
    h.chain.timers.rebuild()  # as a restore does: the window timers derived again, from the backend's entries
    h.watermark(9)
    h.record("a", 6)  # [0, 10) fired at 9 but is within the lateness: fires again
    h.watermark(MAX_WATERMARK)
    events: list[tuple[Any, ...]] = [("r", k, t, (k, t)) for k, t in records] + [("w", 9), ("r", "a", 6, ("a", 6))]
    expected, late = window_model(events, SlidingEventTimeWindows(10, 5), 3)
    assert Counter(r for _, r in h.outputs()) == expected and h.late_records() == late
    assert sum(1 for _ in backend.scan(range(128))) == 0  # every window dropped after its lateness
    h.chain.close()


@pytest.mark.skipif(not rocksdb_available(), reason="rocksdict is not installed (the `rocksdb` extra)")
def test_sessions_on_rocksdb_write_every_change_and_fire_as_on_the_memory_path(tmp_path: Any) -> None:
    """The session batch loop on a backend (values stored as bytes: it owns nothing and writes each change),
    its timers derived again from the backend's entries as a restore does: the rows of the memory path."""
    batches = [[("a", 1), ("b", 2), ("a", 4)], [("a", 30), ("a", 12), ("b", 9)], [("a", 20), ("a", 33)]]
    rows = []
    for backend in (None, make_backend("rocksdb", range(128), work_dir=str(tmp_path / "w"), options={})):
        h = WindowHarness(lambda k: k.window(EventTimeSessionWindows(gap_ms=5)).count(), backend)
        for i, batch in enumerate(batches):
            h.chain.process_batch([(ts, (key, ts)) for key, ts in batch])
            if i == 1:
                assert h.chain.timers is not None
                h.chain.timers.rebuild()
                h.watermark(8)  # fires a's [1, 9)
        h.watermark(MAX_WATERMARK)
        rows.append(h.outputs())
        if backend is not None:
            assert sum(1 for _ in backend.scan(range(128))) == 0  # every session fired and dropped
            h.chain.close()
    assert rows[0] == rows[1]
    assert sorted(r for _, r in rows[0]) == [("a", 1, 9, 2), ("a", 12, 17, 1), ("a", 20, 25, 1), ("a", 30, 38, 2),
                                            ("b", 2, 7, 1), ("b", 9, 14, 1)]


def test_bad_window_arguments_are_refused_with_the_reason() -> None:
    with pytest.raises(ValueError, match="size_ms"):
        TumblingEventTimeWindows(0)
    with pytest.raises(ValueError, match="offset_ms"):
        SlidingEventTimeWindows(10, 5, offset_ms=5)
    job = Job()
    keyed = job.source(GeneratorSource(count=1)).key_by(lambda r: r[0])
    with pytest.raises(ValueError, match="allowed_lateness_ms"):
        keyed.window(TumblingProcessingTimeWindows(10), allowed_lateness_ms=5)
    with pytest.raises(ValueError, match="AggregateFunction"):
        keyed.window(TumblingEventTimeWindows(10)).aggregate(lambda a, b: a)  # type: ignore[arg-type]
    with pytest.raises(JobDefinitionError, match="no side outputs"):
        job.source(GeneratorSource(count=1)).map(lambda r: r).side_output(OutputTag("x"))


def test_a_side_output_is_an_edge_of_its_own_and_the_main_output_still_chains() -> None:
    job = Job()
    src = job.source(GeneratorSource(count=1), watermarks=BoundedOutOfOrderness(0, timestamp=lambda r: r[2]))
    counts = src.key_by(lambda r: r[0]).window(TumblingEventTimeWindows(10)).count()
    counts.map(lambda r: r, name="main")
    counts.side_output(LATE_DATA).map(lambda r: r, name="late")
    vertices, edges = chain_graph(job)
    assert [v.name for v in vertices] == ["GeneratorSource", "window-count -> main", "late"]
    side = [e for e in edges if e.tag is not None]
    assert [(e.up, e.down, e.tag, e.tag_node, e.partitioner) for e in side] == [
        (1, 2, "late-data", counts.node_id, "forward")]


def test_processing_time_windows_fire_from_processing_timers_on_the_wall_clock() -> None:
    job = Job()
    counts = (job.source(GeneratorSource(count=1)).key_by(lambda r: r[0])
              .window(TumblingProcessingTimeWindows(60_000)).count())
    subs = make_subs(1, 1 << 20)
    chain = Chain(job, [counts.node_id], subtask_index=0, parallelism=1, attempt=0,
                  outputs=[RecordWriter(subs, "forward", None, job.max_parallelism, 0)])
    chain.open()
    chain.process_batch([("a", 1), ("b", 2), ("a", 3)])
    timers = chain.timers
    assert timers is not None
    due = timers.timers.processing.peek()
    assert due is not None and due % 60_000 == 59_999  # the end of the current minute, minus one
    assert not timers.processing_due(due - 1)
    assert not timers.fire_processing(due, 64)
    start = due + 1 - 60_000
    assert sorted(decode(subs[0])) == [("a", start, due + 1, 2), ("b", start, due + 1, 1)]
