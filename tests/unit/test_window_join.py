"""Window joins and co-groups (runtime/api/joins.py) through a real Chain (keyed state, timer queues, the real
tag maps of the job graph), against an incremental brute-force model of the documented semantics over random
out-of-order inputs with late records, on tumbling, sliding and session windows."""

from __future__ import annotations

import gc
import time
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
    BoundedOutOfOrderness,
    EventTimeSessionWindows,
    GeneratorSource,
    Job,
    JobDefinitionError,
    SlidingEventTimeWindows,
    TumblingEventTimeWindows,
)
from runtime.api.windows import WindowAssigner
from runtime.execution.operators import Chain, RecordWriter
from runtime.state.registry import make_backend
from runtime.state.rocksdb import available as rocksdb_available
from tests.support.buffers import make_subs, sent
from tests.support.chain_time import advance_watermark

Rec = tuple[str, int, int]  # (key, timestamp, id)


def decode(sub: Any) -> list[Any]:
    unpacker = msgpack.Unpacker(use_list=False, raw=False)
    for data, _, _ in sent(sub):
        unpacker.feed(data)
    return [x for x in unpacker if isinstance(x, tuple)]


class JoinHarness:
    """Two event-time sources -> a window join or co-group, its keyed operator in a Chain driven by hand. Records
    enter through the job graph's own tag maps, as the task running them would send them on."""

    def __init__(self, build: Any, state_backend: Any = None) -> None:
        job = Job()
        strategy = BoundedOutOfOrderness(max_delay_ms=0, timestamp=lambda r: r[1])
        left = job.source(GeneratorSource(count=1), watermarks=strategy)
        right = job.source(GeneratorSource(count=1), watermarks=strategy)
        joined = build(left, right)
        joined.side_output(LATE_DATA).map(lambda r: r, name="late")
        node = job.nodes[joined.node_id]
        self.tag = {side: job.nodes[inp.node].payload for side, inp in zip("lr", node.inputs, strict=True)}
        self.main, self.late = make_subs(1, 1 << 20), make_subs(1, 1 << 20)
        main_w = RecordWriter(self.main, "forward", None, job.max_parallelism, 0)
        late_w = RecordWriter(self.late, "forward", None, job.max_parallelism, 0)
        late_w.side_output = (joined.node_id, LATE_DATA.name)
        self.chain = Chain(job, [joined.node_id], subtask_index=0, parallelism=1, attempt=0,
                           outputs=[main_w, late_w], state_backend=state_backend)
        self.chain.open()

    def record(self, side: str, rec: Rec) -> None:
        self.chain.process_batch([(rec[1], self.tag[side](rec))])

    def batch(self, side: str, recs: list[Rec]) -> None:
        """Records of one side as one batch (the operator's batch loop), as a task hands them on."""
        self.chain.process_batch([(rec[1], self.tag[side](rec)) for rec in recs])

    def watermark(self, wm: int) -> None:
        advance_watermark(self.chain, wm, 5)

    def outputs(self) -> list[Any]:
        return decode(self.main[0])

    def late_records(self) -> list[Any]:
        return [x[1] for x in decode(self.late[0])]


def join_of(assigner: WindowAssigner, fn: Any = None) -> Any:
    return lambda a, b: a.join(b).where(lambda r: r[0]).equal_to(lambda r: r[0]).window(assigner).apply(fn)


def sorted_groups(lefts: list[Rec], rights: list[Rec]) -> list[Any]:
    return [(tuple(sorted(lefts)), tuple(sorted(rights)))]


def co_group_of(assigner: WindowAssigner) -> Any:
    return lambda a, b: (a.co_group(b).where(lambda r: r[0]).equal_to(lambda r: r[0]).window(assigner)
                         .apply(sorted_groups))


def test_join_pairs_the_records_of_both_sides_in_a_window_and_stamps_them_with_its_end() -> None:
    h = JoinHarness(join_of(TumblingEventTimeWindows(10)))
    h.record("l", ("a", 1, 1))
    h.record("r", ("a", 4, 2))
    h.record("r", ("a", 8, 3))
    h.record("l", ("b", 2, 4))  # no right record of b: nothing
    h.record("r", ("a", 12, 5))  # next window, no left record there
    h.watermark(9)
    assert h.outputs() == [(9, (("a", 1, 1), ("a", 4, 2))), (9, (("a", 1, 1), ("a", 8, 3)))]
    h.record("l", ("a", 3, 6))  # its window fired: late, tagged as a left record
    h.watermark(MAX_WATERMARK)
    assert h.outputs() == []
    assert h.late_records() == [(0, ("a", 3, 6))]


def test_co_group_fires_for_one_sided_windows_too() -> None:
    h = JoinHarness(co_group_of(TumblingEventTimeWindows(10)))
    h.record("l", ("a", 1, 1))
    h.record("r", ("b", 2, 2))
    h.record("r", ("a", 3, 3))
    h.watermark(MAX_WATERMARK)
    assert sorted(h.outputs()) == [(9, ((), (("b", 2, 2),))), (9, ((("a", 1, 1),), (("a", 3, 3),)))]


def test_join_with_a_custom_function_and_sessions_that_a_right_record_bridges() -> None:
    h = JoinHarness(join_of(EventTimeSessionWindows(5), lambda left, right: left[2] * 100 + right[2]))
    h.record("l", ("a", 0, 1))
    h.record("l", ("a", 8, 2))  # a session of its own: [8, 13)
    h.record("r", ("a", 4, 3))  # [4, 9) bridges [0, 5) and [8, 13): one session [0, 13)
    h.watermark(MAX_WATERMARK)
    assert sorted(h.outputs()) == [(12, 103), (12, 203)]


def test_bad_join_definitions_are_refused_when_the_job_is_built() -> None:
    job, other = Job(), Job()
    a = job.source(GeneratorSource(count=1))
    with pytest.raises(JobDefinitionError, match="same job"):
        a.join(other.source(GeneratorSource(count=1)))
    with pytest.raises(JobDefinitionError, match="window assigner"):
        a.join(a).where(len).equal_to(len).window(10)  # type: ignore[arg-type]
    with pytest.raises(JobDefinitionError, match="key function"):
        a.co_group(a).where(3)  # type: ignore[arg-type]
    with pytest.raises(JobDefinitionError, match="co_group.apply needs"):
        a.co_group(a).where(len).equal_to(len).window(TumblingEventTimeWindows(5)).apply()


# -- the model ---------------------------------------------------------------------------------------------


def window_join_model(events: list[tuple[Any, ...]], assigner: WindowAssigner) -> tuple[Counter, list]:
    """The documented semantics, incrementally and naively: per key the open windows with their records; a
    record is late for a window whose end - 1 <= watermark; overlapping sessions merge; a window fires (and
    goes) when the watermark reaches end - 1. Returns (Counter of (ts, lefts, rights) groups, late records)."""
    wm = MIN_WATERMARK
    open_windows: dict[str, list[list[Any]]] = {}  # key -> [start, end, lefts, rights]
    groups: Counter = Counter()
    late = []

    def fire(upto: int) -> None:
        for windows in open_windows.values():
            for w in [w for w in windows if w[1] - 1 <= upto]:
                groups[(w[1] - 1, tuple(sorted(w[2])), tuple(sorted(w[3])))] += 1
                windows.remove(w)

    for event in events:
        if event[0] == "w":
            wm = max(wm, event[1])
            fire(wm)
            continue
        side, rec = event
        windows = open_windows.setdefault(rec[0], [])
        added = False
        for start, end in assigner.assign(rec[1]):
            if end - 1 <= wm:
                continue
            added = True
            lefts, rights = [], []
            if assigner.merging:  # absorb every open session the new one overlaps
                for w in [w for w in windows if w[0] < end and start < w[1]]:
                    windows.remove(w)
                    start, end = min(start, w[0]), max(end, w[1])
                    lefts += w[2]
                    rights += w[3]
            match = next((w for w in windows if w[0] == start and w[1] == end), None)
            if match is None:
                match = [start, end, lefts, rights]
                windows.append(match)
            match[2 if side == "l" else 3].append(rec)
        if not added:
            late.append((0 if side == "l" else 1, rec))
    fire(MAX_WATERMARK)
    return groups, late


@st.composite
def streams(draw: Any) -> list[tuple[Any, ...]]:
    """Records of two sides over two keys, out of order, with watermarks that overtake some of them."""
    n = draw(st.integers(1, 40))
    events: list[tuple[Any, ...]] = []
    wm = MIN_WATERMARK
    for i in range(n):
        if draw(st.integers(0, 4)) == 0:
            wm = max(wm, draw(st.integers(0, 60)))
            events.append(("w", wm))
        rec = (draw(st.sampled_from("ab")), draw(st.integers(0, 60)), i)
        events.append((draw(st.sampled_from("lr")), rec))
    return events


ASSIGNERS = st.sampled_from([TumblingEventTimeWindows(10), TumblingEventTimeWindows(7, 3),
                             SlidingEventTimeWindows(10, 5), SlidingEventTimeWindows(9, 4),
                             EventTimeSessionWindows(4), EventTimeSessionWindows(9)])


def drive(h: JoinHarness, events: list[tuple[Any, ...]]) -> None:
    for event in events:
        if event[0] == "w":
            h.watermark(event[1])
        else:
            h.record(*event)
    h.watermark(MAX_WATERMARK)


@settings(max_examples=120, deadline=None)
@given(events=streams(), assigner=ASSIGNERS)
def test_co_group_matches_the_model(events: list[tuple[Any, ...]], assigner: WindowAssigner) -> None:
    h = JoinHarness(co_group_of(assigner))
    drive(h, events)
    expected, late = window_join_model(events, assigner)
    got = Counter((ts, lefts, rights) for ts, (lefts, rights) in h.outputs())
    assert got == expected
    assert h.late_records() == late


@settings(max_examples=120, deadline=None)
@given(events=streams(), assigner=ASSIGNERS)
def test_join_matches_the_model(events: list[tuple[Any, ...]], assigner: WindowAssigner) -> None:
    h = JoinHarness(join_of(assigner))
    drive(h, events)
    _, late = window_join_model(events, assigner)
    assert Counter(h.outputs()) == every_pair(events, assigner)
    assert h.late_records() == late


def drive_in_batches(h: JoinHarness, events: list[tuple[Any, ...]], size: int) -> None:
    """As `drive` without the last watermark, consecutive records of one side in batches of up to `size`."""
    i = 0
    while i < len(events):
        event = events[i]
        if event[0] == "w":
            h.watermark(event[1])
            i += 1
            continue
        run = [event[1]]
        while len(run) < size and i + len(run) < len(events) and events[i + len(run)][0] == event[0]:
            run.append(events[i + len(run)][1])
        h.batch(event[0], run)
        i += len(run)


def every_pair(events: list[tuple[Any, ...]], assigner: WindowAssigner) -> Counter:
    groups, _ = window_join_model(events, assigner)
    return Counter((ts, (left, right)) for (ts, lefts, rights), n in groups.items()
                   for left in lefts for right in rights for _ in range(n))


@settings(max_examples=150, deadline=None)
@given(events=streams(), assigner=ASSIGNERS, cut_at=st.integers(0, 60), size=st.integers(1, 6))
def test_a_join_in_batches_gives_every_pair_across_a_checkpoint_restored_in_the_middle(
        events: list[tuple[Any, ...]], assigner: WindowAssigner, cut_at: int, size: int) -> None:
    """The batch loop and the join's firing against the model's every pair (order-independent), through a
    checkpoint taken between two batches: its copy (taken as the task takes it, then encoded later) restored into a
    new chain that takes the rest, while the first chain goes on changing its windows in place."""
    cut = min(cut_at, len(events))
    watermark = max([MIN_WATERMARK] + [e[1] for e in events[:cut] if e[0] == "w"])
    _, late = window_join_model(events, assigner)
    h = JoinHarness(join_of(assigner))
    drive_in_batches(h, events[:cut], size)
    h.chain.begin_state_snapshot(1)
    copied = {node: {name: table.copy() for name, table in tables.items()}
              for node, tables in h.chain.keyed_state.items()}  # as Task.snapshot_operator_state does
    first_part, first_late = h.outputs(), h.late_records()
    drive_in_batches(h, events[cut:], size)
    h.watermark(MAX_WATERMARK)
    assert Counter(first_part + h.outputs()) == every_pair(events, assigner)  # uninterrupted
    assert first_late + h.late_records() == late

    encoded = msgpack.unpackb(msgpack.packb(copied), strict_map_key=False, use_list=True)
    restored = JoinHarness(join_of(assigner))
    restored.chain.restore_state({int(n): {name: dict(t) for name, t in tables.items()}
                                  for n, tables in encoded.items()}, None)
    restored.chain.restore_watermarks(watermark, watermark)
    drive_in_batches(restored, events[cut:], size)
    restored.watermark(MAX_WATERMARK)
    assert Counter(first_part + restored.outputs()) == every_pair(events, assigner)
    assert first_late + restored.late_records() == late


@pytest.mark.skipif(not rocksdb_available(), reason="rocksdict is not installed")
def test_window_join_on_rocksdb_matches_the_memory_path(tmp_path: Any) -> None:
    events: list[tuple[Any, ...]] = [("l", ("a", 1, 1)), ("r", ("a", 3, 2)), ("w", 5), ("r", ("a", 7, 3)),
                                     ("l", ("a", 12, 4)), ("r", ("b", 2, 5)), ("l", ("a", 4, 6))]
    outputs = []
    for backend in (None, make_backend("rocksdb", range(128), work_dir=str(tmp_path / "w"), options={})):
        h = JoinHarness(join_of(SlidingEventTimeWindows(10, 5)), state_backend=backend)
        drive(h, events)
        outputs.append(Counter(h.outputs()))
        h.chain.close()
    assert outputs[0] == outputs[1]
    assert outputs[0][(9, (("a", 1, 1), ("a", 3, 2)))] == 1


def _cpu_of_join(records: int, lead: int) -> float:
    """CPU seconds of a tumbling 10 ms join over `records` per side of 10 keys, one record per ms per side, in
    batches of 50, the left side `lead` records ahead of the right one (the watermark follows the right side)."""
    h = JoinHarness(join_of(TumblingEventTimeWindows(10)))
    left = [(f"k{i % 10}", i, i) for i in range(records)]
    right = [(f"k{i * 3 % 10}", i, records + i) for i in range(records)]
    # this thread's CPU (threads earlier tests left in the process do not count), without the garbage collector:
    # its passes over the heap earlier tests left grow with the windows held open, which is not the cost guarded
    gc.collect()
    gc.disable()
    try:
        start = time.thread_time()
        for i in range(0, records + lead, 50):
            h.batch("l", left[i:i + 50])
            if i >= lead:
                h.batch("r", right[i - lead:i - lead + 50])
                h.watermark(right[min(i - lead + 50, records) - 1][1] - 1)
        h.watermark(MAX_WATERMARK)
        spent = time.thread_time() - start
    finally:
        gc.enable()
    assert len(h.outputs()) == records
    return spent


def test_a_side_far_ahead_of_the_other_costs_the_join_about_what_sides_in_step_cost() -> None:
    """The leading side's windows all stay open until the watermark (the lagging side's) passes them: 2,000 per
    key here. Opening one at the end of a key's windows scanned all of them (quadratic in the lead: about 10x the
    CPU of sides in step at this size); by bisection it is about the same."""
    in_step = min(_cpu_of_join(20_000, 0) for _ in range(3))
    ahead = min(_cpu_of_join(20_000, 20_000) for _ in range(3))
    assert ahead < 3 * in_step, (ahead, in_step)
