"""The interval join's batch loops (IntervalJoinFunction.timed_batch_runners), its sorted per-key buffers and its
clean-up timers derived from them (a TimerIndex, coalesced per grain), in a real Chain: against the per-record
path with a timer table (`process1`/`process2` and one timer per key and timestamp, itself checked against a
brute-force model in test_interval_join.py), over random out-of-order inputs cut into batches between
watermarks, with a checkpoint taken in the middle and restored into a new chain, from this layout and from the
earlier one (a MapState per side and a timer per key and timestamp)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import msgpack
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.api import (
    LATE_LEFT,
    LATE_RIGHT,
    MAX_WATERMARK,
    MIN_WATERMARK,
    BoundedOutOfOrderness,
    GeneratorSource,
    IntervalJoinFunction,
    Job,
)
from runtime.execution.operators import Chain, RecordWriter
from runtime.graph.partitioning import key_group
from tests.support.buffers import make_subs, sent
from tests.support.chain_time import advance_watermark

LEFT, RIGHT = "interval-join:left", "interval-join:right"
TIMERS = "\0timers:event"


class PerRecordJoin(IntervalJoinFunction):
    """The join through `process1`/`process2` per record and a timer table (no batch loops, no timer index)."""

    def timed_batch_runners(self, key_fns: Any, ctx: Any, after: Any) -> None:
        return None

    def event_timers_from_state(self, ctx: Any) -> None:  # type: ignore[override]
        return None


def pair(left: Any, right: Any, ctx: Any) -> None:
    ctx.emit((left, right))


class Harness:
    """left, right -> key_by -> interval join, its chain driven by hand; outputs and late records in order."""

    def __init__(self, fn: IntervalJoinFunction) -> None:
        self.fn = fn
        job = Job()
        timed = BoundedOutOfOrderness(max_delay_ms=0, timestamp=lambda r: r[2])
        left = job.source(GeneratorSource(count=1), watermarks=timed)
        right = job.source(GeneratorSource(count=1), watermarks=timed)
        joined = left.key_by(lambda r: r[0]).connect(right.key_by(lambda r: r[0])).process(fn, name="join")
        joined.side_output(LATE_LEFT).map(lambda r: r, name="late-left")
        joined.side_output(LATE_RIGHT).map(lambda r: r, name="late-right")
        self.main, self.late = make_subs(1, 1 << 20), make_subs(2, 1 << 20)
        writers = [RecordWriter(self.main, "forward", None, job.max_parallelism, 0)]
        for i, tag in enumerate((LATE_LEFT, LATE_RIGHT)):
            w = RecordWriter([self.late[i]], "forward", None, job.max_parallelism, 0)
            w.side_output = (joined.node_id, tag.name)
            writers.append(w)
        self.chain = Chain(job, [joined.node_id], subtask_index=0, parallelism=1, attempt=0, outputs=writers)
        self.chain.open()
        self.node_id = joined.node_id
        self.sides = (self.chain.input_batch(0), self.chain.input_batch(1))

    def batch(self, side: int, records: list[tuple[str, int, int]]) -> None:
        self.sides[side]([(r[2], r) for r in records])

    def watermark(self, wm: int) -> None:
        advance_watermark(self.chain, wm, 5)

    def outputs(self) -> list[Any]:
        return [x for x in _decode(self.main[0]) if isinstance(x, tuple)]

    def late_records(self) -> list[list[Any]]:
        return [[x for x in _decode(sub) if isinstance(x, tuple)] for sub in self.late]

    def snapshot(self) -> dict[int, dict[str, dict[Any, Any]]]:
        """The keyed state as a checkpoint carries it (serialised and read back)."""
        raw = msgpack.unpackb(msgpack.packb(self.chain.keyed_state), strict_map_key=False, use_list=True)
        return {int(n): {name: dict(t) for name, t in tables.items()} for n, tables in raw.items()}

    def tables(self) -> dict[str, Any]:
        return self.chain.keyed_state[self.node_id]


def _decode(sub: Any) -> list[Any]:
    unpacker = msgpack.Unpacker(use_list=False, raw=False)
    for data, _, _ in sent(sub):
        unpacker.feed(data)
    return list(unpacker)


def earlier_form(keyed: dict[int, dict[str, dict[Any, Any]]], fn: IntervalJoinFunction,
                 watermark: int) -> dict[int, dict[str, dict[Any, Any]]]:
    """A snapshot as the version with a MapState per side wrote it: per key {timestamp: [[record, matched]]},
    records whose interval the watermark passed already dropped, and a timer per key and record timestamp."""
    out: dict[int, dict[str, dict[Any, Any]]] = {}
    for node, tables in keyed.items():
        timers: dict[Any, set[int]] = {}
        converted: dict[str, dict[Any, Any]] = {}
        for name, keep in ((LEFT, fn.left_keep), (RIGHT, fn.right_keep)):
            table: dict[Any, Any] = {}
            for key, entries in tables.get(name, {}).items():
                for ts, record, matched in entries:
                    if ts + keep > watermark:
                        table.setdefault(key, {}).setdefault(ts, []).append([record, matched])
                        timers.setdefault(key, set()).add(ts + keep)
            converted[name] = table
        converted[TIMERS] = {key: tuple(sorted(stamps)) for key, stamps in timers.items()}
        out[node] = converted
    return out


Event = tuple[Any, ...]


@st.composite
def scenarios(draw: Any) -> tuple[int, int, str, int | None, list[Event]]:
    lower = draw(st.integers(-12, 6))
    upper = draw(st.integers(lower, lower + 14))
    how = draw(st.sampled_from(["inner", "inner", "left", "full"]))
    grain = draw(st.sampled_from([None, 1, 3, 50]))
    events: list[Event] = []
    wm = MIN_WATERMARK
    seq = 0
    for _ in range(draw(st.integers(1, 30))):
        if draw(st.integers(0, 3)) == 0:
            wm = max(wm, draw(st.integers(0, 90)))
            events.append(("w", wm))
            continue
        side = draw(st.integers(0, 1))
        batch = []
        for _ in range(draw(st.integers(1, 6))):
            batch.append((draw(st.sampled_from("abc")), seq, draw(st.integers(0, 100))))
            seq += 1
        events.append(("b", side, batch))
    return lower, upper, how, grain, events


def _run(h: Harness, events: list[Event], per_record: bool = False) -> None:
    for event in events:
        if event[0] == "w":
            h.watermark(event[1])
        elif per_record:
            for r in event[2]:
                h.batch(event[1], [r])
        else:
            h.batch(event[1], event[2])


@settings(max_examples=250, deadline=None)
@given(scenario=scenarios(), cut_at=st.integers(0, 30))
def test_batches_give_what_the_per_record_path_gives_and_survive_a_restore(
        scenario: tuple[int, int, str, int | None, list[Event]], cut_at: int) -> None:
    lower, upper, how, grain, events = scenario

    def join(cls: type[IntervalJoinFunction] = IntervalJoinFunction) -> IntervalJoinFunction:
        return cls(lower, upper, pair, how, cleanup_grain_ms=grain)

    reference = Harness(join(PerRecordJoin))
    _run(reference, events, per_record=True)
    reference.watermark(MAX_WATERMARK)

    cut = min(cut_at, len(events))
    wm = max([MIN_WATERMARK] + [e[1] for e in events[:cut] if e[0] == "w"])
    fast = Harness(join())
    _run(fast, events[:cut])
    restored = Harness(join())  # a checkpoint between two batches, restored into a new chain
    restored.chain.restore_state(fast.snapshot(), None)
    restored.chain.restore_watermarks(wm, wm)
    _run(restored, events[cut:])
    restored.watermark(MAX_WATERMARK)

    before = Harness(join(PerRecordJoin))  # a checkpoint of the earlier layout, restored into this version
    _run(before, events[:cut], per_record=True)
    upgraded = Harness(join())
    upgraded.chain.restore_state(earlier_form(before.snapshot(), before.fn, wm), None)
    upgraded.chain.restore_watermarks(wm, wm)
    _run(upgraded, events[cut:])
    upgraded.watermark(MAX_WATERMARK)

    rows, late = reference.outputs(), reference.late_records()
    assert fast.outputs() + restored.outputs() == rows  # the same pairs, stamps and order
    assert [a + b for a, b in zip(fast.late_records(), restored.late_records(), strict=True)] == late
    assert Counter(before.outputs() + upgraded.outputs()) == Counter(rows)
    assert [a + b for a, b in zip(before.late_records(), upgraded.late_records(), strict=True)] == late
    for h in (reference, restored, upgraded):  # every buffered record and timer dropped at the end
        tables = h.tables()
        assert not tables.get(LEFT) and not tables.get(RIGHT) and not tables.get(TIMERS)
    assert len(restored.chain.timers.timers.event) == 0  # type: ignore[union-attr]


def test_an_inner_join_cleans_up_per_key_and_grain_and_drops_passed_records_when_it_adds_one() -> None:
    h = Harness(IntervalJoinFunction(-2, 3, pair, cleanup_grain_ms=10))
    h.batch(0, [("a", 0, 11), ("a", 1, 12), ("b", 2, 13)])  # intervals end at 14, 15, 16: one timer each key, at 20
    assert len(h.chain.timers.timers.event) == 2  # type: ignore[union-attr]
    h.watermark(16)  # every interval is over, but the grain's timer is not due
    assert [e[0] for e in h.tables()[LEFT]["a"]] == [11, 12]
    h.batch(0, [("a", 3, 17)])  # adding to a's buffer drops what the watermark passed
    assert [tuple(e) for e in h.tables()[LEFT]["a"]] == [(17, ("a", 3, 17), False)]
    h.batch(1, [("a", 4, 18), ("b", 5, 18)])  # a matches 17 (15 <= 18 <= 20); b's 13 is over (13 + 3 < 18)
    assert h.outputs() == [(18, (("a", 3, 17), ("a", 4, 18)))]
    h.watermark(19)  # nothing due before the grain's end
    assert [e[0] for e in h.tables()[LEFT]["a"]] == [17] and [e[0] for e in h.tables()[LEFT]["b"]] == [13]
    h.watermark(20)  # the grain's timers: every interval is over, every buffer goes
    assert not h.tables()[LEFT] and not h.tables()[RIGHT]
    assert len(h.chain.timers.timers.event) == 0  # type: ignore[union-attr]


def test_an_outer_join_keeps_exact_timers_and_stamps_an_unmatched_record_with_the_end_of_its_interval() -> None:
    fn = IntervalJoinFunction(-1, 4, pair, "left", cleanup_grain_ms=50)
    assert fn.grain == 1
    h = Harness(fn)
    h.batch(0, [("a", 0, 10)])
    h.watermark(13)
    assert h.outputs() == []
    h.watermark(14)
    assert h.outputs() == [(14, (("a", 0, 10), None))]


def test_a_snapshot_keeps_the_buffers_it_copied_while_the_loops_change_the_later_ones_in_place() -> None:
    """The memory path's snapshot is a shallow copy of the tables, encoded later: the batch loops change a
    key's buffer in place only until the next snapshot's synchronous part (Chain.begin_state_snapshot)."""
    h = Harness(IntervalJoinFunction(-5, 5, pair))
    h.batch(0, [("a", 0, 10), ("b", 1, 11)])
    h.batch(0, [("a", 2, 12)])
    tables = h.tables()
    kept = tables[LEFT]["a"]
    h.batch(0, [("a", 3, 13)])
    assert tables[LEFT]["a"] is kept and [e[0] for e in kept] == [10, 12, 13]  # in place: no snapshot holds it

    h.chain.begin_state_snapshot(1)
    copied = {name: table.copy() for name, table in tables.items()}  # as Task.snapshot_operator_state does
    encoded = msgpack.packb(copied)
    h.batch(0, [("a", 4, 14), ("b", 5, 15)])
    h.batch(1, [("a", 6, 15)])
    h.watermark(40)
    h.batch(0, [("a", 7, 41)])
    assert msgpack.packb(copied) == encoded  # what the snapshot copied did not change
    assert [e[0] for e in tables[LEFT]["a"]] == [41] and [e[0] for e in copied[LEFT]["a"]] == [10, 12, 13]
    assert h.outputs() == [(15, (("a", i, ts), ("a", 6, 15))) for i, ts in ((0, 10), (2, 12), (3, 13), (4, 14))]


@settings(max_examples=60, deadline=None)
@given(scenario=scenarios(), cut_at=st.integers(0, 30))
def test_a_checkpoint_split_by_key_group_into_two_subtasks_gives_the_same_pairs(
        scenario: tuple[int, int, str, int | None, list[Event]], cut_at: int) -> None:
    """A rescale from 1 to 2: the keyed tables split by key group (as runtime/checkpointing/rescaling.py
    splits them), each half restored into its own chain, which takes the rest of its keys' records."""
    lower, upper, how, grain, events = scenario
    reference = Harness(PerRecordJoin(lower, upper, pair, how, cleanup_grain_ms=grain))
    _run(reference, events, per_record=True)
    reference.watermark(MAX_WATERMARK)

    cut = min(cut_at, len(events))
    wm = max([MIN_WATERMARK] + [e[1] for e in events[:cut] if e[0] == "w"])
    before = Harness(IntervalJoinFunction(lower, upper, pair, how, cleanup_grain_ms=grain))
    _run(before, events[:cut])
    snapshot = before.snapshot()
    max_parallelism = before.chain.max_parallelism
    halves = []
    for half in range(2):
        def mine(key: Any, half: int = half) -> bool:
            return key_group(key, max_parallelism) % 2 == half
        h = Harness(IntervalJoinFunction(lower, upper, pair, how, cleanup_grain_ms=grain))
        h.chain.restore_state({node: {name: {k: v for k, v in table.items() if mine(k)}
                                      for name, table in tables.items()} for node, tables in snapshot.items()}, None)
        h.chain.restore_watermarks(wm, wm)
        for event in events[cut:]:
            if event[0] == "w":
                h.watermark(event[1])
            else:
                h.batch(event[1], [r for r in event[2] if mine(r[0])])
        h.watermark(MAX_WATERMARK)
        halves.append(h)
    assert Counter(before.outputs() + halves[0].outputs() + halves[1].outputs()) == Counter(reference.outputs())
