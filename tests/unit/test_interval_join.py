"""The interval join (runtime/api/interval_join.py) driven with the runtime's real context, keyed state, timer
queues and two-input watermark combiner (tests/support/co_harness.py), checked after every input event against a
brute-force model: every pair of non-late records within the bounds exactly once, as soon as its second record
arrives; unmatched records of an outer side exactly once, when the watermark passes the end of their interval;
late records on the side outputs. Out-of-order records, late records, idle inputs, all four join kinds, both the
memory and the RocksDB path; and the definition errors at submit."""

from __future__ import annotations

import tempfile
from collections import Counter
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.api import (
    LATE_LEFT,
    LATE_RIGHT,
    MIN_WATERMARK,
    BoundedOutOfOrderness,
    GeneratorSource,
    IntervalJoinFunction,
    Job,
    JobDefinitionError,
)
from runtime.state.registry import make_backend
from runtime.state.rocksdb import available as rocksdb_available
from tests.support.co_harness import KeyedCoHarness

Rec = tuple[str, int, int, int]  # (key, timestamp, id, side)


def harness(lower: int, upper: int, how: str = "inner", grain: int | None = None, **kw: Any) -> KeyedCoHarness:
    return KeyedCoHarness(IntervalJoinFunction(lower, upper, how=how, cleanup_grain_ms=grain),
                          (lambda r: r[0], lambda r: r[0]), **kw)


def feed(h: KeyedCoHarness, side: int, key: str, ts: int, rid: int) -> Rec:
    rec = (key, ts, rid, side)
    h.record(side, rec, ts)
    return rec


def test_pairs_come_out_when_the_second_record_arrives_with_the_later_timestamp() -> None:
    h = harness(-2, 3)
    left = feed(h, 0, "a", 10, 1)
    r1 = feed(h, 1, "a", 13, 2)  # 10 - 2 <= 13 <= 10 + 3
    feed(h, 1, "a", 14, 3)  # too far
    feed(h, 1, "b", 11, 4)  # other key
    r2 = feed(h, 1, "a", 8, 5)  # the lower bound, inclusive
    assert h.out == [(13, (left, r1)), (10, (left, r2))]


def test_late_records_go_to_the_side_outputs_and_buffers_go_when_the_watermark_passes() -> None:
    h = harness(0, 5, grain=1)  # exact clean-up timers (an inner join's default: per key and 1 s of event time)
    feed(h, 0, "a", 10, 1)
    h.watermark(0, 20)
    h.watermark(1, 14)  # operator watermark 14 < 10 + 5: the left record is still kept
    assert h.current_watermark == 14
    r = feed(h, 1, "a", 15, 2)
    assert h.out == [(15, (("a", 10, 1, 0), r))]
    h.watermark(1, 15)  # passes 10 + 5: the left record goes
    assert h.state["interval-join:left"] == {}
    late = feed(h, 1, "a", 15, 3)  # ts <= watermark: late, whatever it might have matched
    late_left = feed(h, 0, "a", 12, 4)
    assert h.side == {LATE_RIGHT.name: [(15, late)], LATE_LEFT.name: [(12, late_left)]}
    h.end()
    assert len(h.out) == 1 and h.state["interval-join:right"] == {}
    assert not h.event.table  # no timer left behind


def test_left_outer_emits_an_unmatched_left_record_once_the_watermark_passes_its_interval() -> None:
    h = harness(-1, 4, "left")
    lonely = feed(h, 0, "a", 10, 1)
    matched = feed(h, 0, "a", 20, 2)
    r = feed(h, 1, "a", 22, 3)
    h.watermark(0, 30)
    h.watermark(1, 13)
    assert h.out == [(22, (matched, r))]
    h.watermark(1, 14)  # 10 + 4: the interval of `lonely` is over, stamped with its clean-up time
    assert h.out[1:] == [(14, (lonely, None))]
    h.end()
    assert len(h.out) == 2  # the unmatched right record is not emitted: left outer only


def test_an_idle_input_does_not_hold_the_join_back() -> None:
    h = harness(0, 2, "full")
    lonely = feed(h, 0, "a", 5, 1)
    h.watermark(0, 50)
    assert h.current_watermark == MIN_WATERMARK  # the right input has said nothing yet
    h.idle(1)  # it is idle: the left input alone moves the watermark, and the clean-up timer fires
    assert h.current_watermark == 50
    assert h.out == [(7, (lonely, None))]
    h.active(1)
    late = feed(h, 1, "a", 6, 2)  # the right input wakes up behind the watermark: its record is late
    assert h.side == {LATE_RIGHT.name: [(6, late)]}


def test_bad_interval_joins_are_refused_when_the_job_is_built() -> None:
    job = Job()
    timed = BoundedOutOfOrderness(max_delay_ms=0, timestamp=lambda r: r)
    a = job.source(GeneratorSource(count=1), watermarks=timed)
    b = job.source(GeneratorSource(count=1), watermarks=timed)
    with pytest.raises(JobDefinitionError, match="the left stream is not keyed"):
        a.interval_join(b.key_by(str))
    with pytest.raises(JobDefinitionError, match="the right stream is not keyed"):
        a.key_by(str).interval_join(b)
    with pytest.raises(JobDefinitionError, match="the interval is empty"):
        a.key_by(str).interval_join(b.key_by(str)).between(5, 4)
    with pytest.raises(JobDefinitionError, match="are empty"):
        a.key_by(str).interval_join(b.key_by(str)).between(3, 3).upper_bound_exclusive()
    untimed = Job()
    c = untimed.source(GeneratorSource(count=1))
    with pytest.raises(JobDefinitionError, match="event time only"):
        c.key_by(str).interval_join(c.key_by(str)).between(0, 1).process()
    joined = a.key_by(str).interval_join(b.key_by(str)).between(-1, 1).lower_bound_exclusive().left_outer().process()
    node = job.nodes[joined.node_id]
    assert node.kind == "keyed_co_process" and [i.side for i in node.inputs] == [0, 1]
    assert (node.payload.lower, node.payload.upper, node.payload.outer_left) == (0, 1, True)


# -- the model -----------------------------------------------------------------------------------------------


class Model:
    """What the join must have emitted after each event, naively from the non-late records seen so far and the
    operator's watermark (the real combiner's: min over active inputs, tested on its own)."""

    def __init__(self, lower: int, upper: int, how: str) -> None:
        self.lower, self.upper = lower, upper
        self.outer = (how in ("left", "full"), how in ("right", "full"))
        self.keep = (max(upper, 0), max(-lower, 0))
        self.seen: tuple[list[Rec], list[Rec]] = ([], [])
        self.late: tuple[list[Any], list[Any]] = ([], [])

    def record(self, rec: Rec, watermark: int) -> None:
        side = rec[3]
        if rec[1] <= watermark:
            self.late[side].append((rec[1], rec))
        else:
            self.seen[side].append(rec)

    def matches(self, left: Rec, right: Rec) -> bool:
        return left[0] == right[0] and left[1] + self.lower <= right[1] <= left[1] + self.upper

    def expected(self, watermark: int) -> Counter:
        lefts, rights = self.seen
        out: Counter = Counter((max(a[1], b[1]), (a, b)) for a in lefts for b in rights if self.matches(a, b))
        for side in (0, 1):
            if not self.outer[side]:
                continue
            for rec in self.seen[side]:
                done = rec[1] + self.keep[side]
                partners = rights if side == 0 else lefts
                pair = (lambda p, rec=rec: self.matches(rec, p)) if side == 0 else \
                    (lambda p, rec=rec: self.matches(p, rec))
                if done <= watermark and not any(pair(p) for p in partners):
                    out[(done, (rec, None) if side == 0 else (None, rec))] += 1
        return out


@st.composite
def scenarios(draw: Any) -> tuple[int, int, str, list[tuple[Any, ...]]]:
    lower = draw(st.integers(-10, 5))
    upper = draw(st.integers(lower, lower + 12))
    how = draw(st.sampled_from(["inner", "left", "right", "full"]))
    events: list[tuple[Any, ...]] = []
    marks = [MIN_WATERMARK, MIN_WATERMARK]
    for i in range(draw(st.integers(1, 40))):
        kind = draw(st.integers(0, 9))
        side = draw(st.integers(0, 1))
        if kind <= 1:
            marks[side] = max(marks[side], draw(st.integers(0, 60)))
            events.append(("w", side, marks[side]))
        elif kind == 2:
            events.append((draw(st.sampled_from(["idle", "active"])), side))
        else:
            events.append(("r", side, draw(st.sampled_from("ab")), draw(st.integers(0, 60)), i))
    return lower, upper, how, events


def tuples(value: Any) -> Any:
    """Records read back from a state backend are msgpack-decoded (lists); on the wire they become tuples again."""
    return tuple(tuples(v) for v in value) if isinstance(value, list | tuple) else value


def check(scenario: tuple[int, int, str, list[tuple[Any, ...]]], backend: Any = None) -> None:
    lower, upper, how, events = scenario
    h = harness(lower, upper, how, state_backend=backend)
    model = Model(lower, upper, how)
    for event in events:
        if event[0] == "r":
            _, side, key, ts, rid = event
            model.record(feed(h, side, key, ts, rid), h.current_watermark)
        elif event[0] == "w":
            h.watermark(event[1], event[2])
        elif event[0] == "idle":
            h.idle(event[1])
        else:
            h.active(event[1])
        assert Counter(tuples(h.out)) == model.expected(h.current_watermark), event
    h.end()
    assert Counter(tuples(h.out)) == model.expected(h.current_watermark)
    assert h.side.get(LATE_LEFT.name, []) == model.late[0]
    assert h.side.get(LATE_RIGHT.name, []) == model.late[1]
    assert not h.event.table  # every buffered record was cleaned up by its timer
    if backend is None:
        assert h.state["interval-join:left"] == {} and h.state["interval-join:right"] == {}


@settings(max_examples=300, deadline=None)
@given(scenario=scenarios())
def test_interval_join_matches_the_model(scenario: tuple[int, int, str, list[tuple[Any, ...]]]) -> None:
    check(scenario)


@pytest.mark.skipif(not rocksdb_available(), reason="rocksdict is not installed")
@settings(max_examples=25, deadline=None)
@given(scenario=scenarios())
def test_interval_join_on_rocksdb_matches_the_model(scenario: tuple[int, int, str, list[tuple[Any, ...]]]) -> None:
    with tempfile.TemporaryDirectory() as work_dir:
        backend = make_backend("rocksdb", range(128), work_dir=work_dir, options={})
        try:
            check(scenario, backend)
        finally:
            backend.close()
