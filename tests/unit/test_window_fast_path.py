"""The window operator's batch loop (WindowOperator.timed_batch_runner) and its timer index (TimerIndex: one
index per timestamp, derived from the windows) against the operator as it was (`process` per record, one timer
per key and window in a timer table) and a brute-force model: random out-of-order inputs cut into batches
between watermarks, late records, allowed lateness, tumbling, sliding and session windows, count/reduce/process
contents, and a checkpoint taken in the middle and restored into a new chain, from the current form and from
the earlier one (a checkpoint of a version with per-key timers)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.api import (
    MAX_WATERMARK,
    MIN_WATERMARK,
    EventTimeSessionWindows,
    SlidingEventTimeWindows,
    TumblingEventTimeWindows,
)
from runtime.api.windows import CountAggregate, WindowAssigner, WindowOperator, _Aggregated, _Elements, _Reduced
from tests.support.models import window_model
from tests.support.window_harness import WindowHarness as Harness
from tests.support.window_harness import read_back


class PerRecordWindows(WindowOperator):
    """The operator as it was: every record through `process`, a timer per key and window in the timer table."""

    def timed_batch_runner(self, key_fn: Any, ctx: Any, after: Any) -> None:
        return None

    def event_timers_from_state(self, ctx: Any) -> None:
        return None


def earlier_form(keyed: dict[int, dict[str, dict[Any, Any]]]) -> dict[int, dict[str, dict[Any, Any]]]:
    """A PerRecordWindows snapshot as the version with per-key timers wrote it: entries of three, no fired
    mark (its timer table is already that version's)."""
    return {node: {name: ({k: tuple(tuple(e[:3]) for e in v) for k, v in table.items()} if name == "windows"
                          else table) for name, table in tables.items()} for node, tables in keyed.items()}


def contents_of(kind: str) -> Any:
    if kind == "count":
        return _Aggregated(CountAggregate())
    if kind == "reduce":  # order-sensitive: the sequence numbers in the order they were added
        return _Reduced(lambda a, b: (a[0], f"{a[1]},{b[1]}", a[2]))
    return _Elements(lambda key, w, rs: (w.start, w.end, [r[1] for r in rs]))


def _events(records: list[tuple[str, int]], delay: int, cuts: list[int]) -> list[tuple[Any, ...]]:
    """Batches of records between watermarks (delay behind the highest timestamp), each run of records cut at
    the positions in `cuts` as well."""
    events: list[tuple[Any, ...]] = []
    batch: list[tuple[str, int, int]] = []
    max_ts = wm = MIN_WATERMARK
    for seq, (key, ts) in enumerate(records):
        batch.append((key, seq, ts))
        max_ts = max(max_ts, ts)
        if max_ts - delay - 1 > wm or seq in cuts:
            events.append(("b", batch))
            batch = []
        if max_ts - delay - 1 > wm:
            wm = max_ts - delay - 1
            events.append(("w", wm))
    if batch:
        events.append(("b", batch))
    return events


def _run(h: Harness, events: list[tuple[Any, ...]]) -> None:
    for event in events:
        if event[0] == "b":
            h.batch(event[1])
        else:
            h.watermark(event[1])


ASSIGNERS: list[WindowAssigner] = [TumblingEventTimeWindows(10), TumblingEventTimeWindows(12, offset_ms=5),
                                   SlidingEventTimeWindows(20, 5), SlidingEventTimeWindows(12, 5),
                                   SlidingEventTimeWindows(5, 10), EventTimeSessionWindows(gap_ms=6)]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("abcd"), st.integers(0, 150)), max_size=80),
       st.integers(0, 30), st.sampled_from([0, 7, 25]), st.sampled_from(range(len(ASSIGNERS))),
       st.sampled_from(["count", "reduce", "process"]), st.lists(st.integers(0, 80), max_size=6),
       st.integers(0, 40))
def test_batches_give_what_process_per_record_gives_and_survive_a_restore(
        records: list[tuple[str, int]], delay: int, lateness: int, which: int, kind: str, cuts: list[int],
        checkpoint_at: int) -> None:
    check_against_per_record(records, delay, lateness, ASSIGNERS[which], kind, cuts, checkpoint_at)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("abc"), st.integers(0, 4), st.integers(0, 12)), max_size=80),
       st.integers(0, 15), st.sampled_from([0, 0, 7]), st.sampled_from([2, 6, 20]),
       st.sampled_from(["count", "reduce", "process"]), st.lists(st.integers(0, 80), max_size=6),
       st.integers(0, 40))
def test_sessions_in_batches_give_what_process_per_record_gives_and_survive_a_restore(
        steps: list[tuple[str, int, int]], delay: int, lateness: int, gap: int, kind: str, cuts: list[int],
        checkpoint_at: int) -> None:
    """Sessions, event time mostly rising (a step of 0-4 ms a record, up to 12 ms behind): the batch loop's own
    path without a lateness (a session grows and keeps its early timer, which moves when it comes up; one starts
    after the newest), a record before the newest session's start (it may bridge two), late records."""
    records, now = [], 0
    for key, step, behind in steps:
        now += step
        records.append((key, max(0, now - behind)))
    check_against_per_record(records, delay, lateness, EventTimeSessionWindows(gap_ms=gap), kind, cuts,
                             checkpoint_at)


def check_against_per_record(records: list[tuple[str, int]], delay: int, lateness: int, assigner: WindowAssigner,
                             kind: str, cuts: list[int], checkpoint_at: int) -> None:
    """The batch loop with a checkpoint in the middle, restored from the current and from the earlier form,
    against `process` per record (and, for counts of windows that do not merge, the model)."""
    events = _events(records, delay, cuts)

    reference = Harness(PerRecordWindows(assigner, contents_of(kind), lateness))
    for event in events:  # one record per call: `process`, as before the batch loop existed
        if event[0] == "b":
            for r in event[1]:
                reference.batch([r])
        else:
            reference.watermark(event[1])
    reference.watermark(MAX_WATERMARK)

    fast = Harness(WindowOperator(assigner, contents_of(kind), lateness))
    cut = min(checkpoint_at, len(events))
    _run(fast, events[:cut])
    wm = max([MIN_WATERMARK] + [e[1] for e in events[:cut] if e[0] == "w"])
    # a checkpoint between two batches: its synchronous part now, its encoding once the operator has taken the
    # rest of the input (the accumulators it changed in place meanwhile must not reach the snapshot), restored
    # into a new chain that takes the rest of the input again
    copied = fast.begin_snapshot()
    fast_rows, fast_late = fast.outputs(), fast.late_records()
    _run(fast, events[cut:])
    fast.watermark(MAX_WATERMARK)
    restored = Harness(WindowOperator(assigner, contents_of(kind), lateness))
    restored.chain.restore_state(read_back(copied), None)
    restored.chain.restore_watermarks(wm, wm)
    _run(restored, events[cut:])
    restored.watermark(MAX_WATERMARK)

    # a checkpoint of the earlier form (per-key timers), restored into this version
    before = Harness(PerRecordWindows(assigner, contents_of(kind), lateness))
    for event in events[:cut]:
        if event[0] == "b":
            for r in event[1]:
                before.batch([r])
        else:
            before.watermark(event[1])
    upgraded = Harness(WindowOperator(assigner, contents_of(kind), lateness))
    upgraded.chain.restore_state(earlier_form(before.snapshot()), None)
    upgraded.chain.restore_watermarks(wm, wm)
    _run(upgraded, events[cut:])
    upgraded.watermark(MAX_WATERMARK)

    rows, late_rows = reference.outputs(), reference.late_records()  # (each drains its buffers)
    assert fast_rows + fast.outputs() == rows  # the run that went on after the snapshot
    assert fast_late + fast.late_records() == late_rows
    assert fast_rows + restored.outputs() == rows  # the same rows, with the same stamps, in the same order
    assert fast_late + restored.late_records() == late_rows
    assert before.outputs() + upgraded.outputs() == rows
    assert before.late_records() + upgraded.late_records() == late_rows
    for h in (restored, upgraded):
        tables = h.chain.keyed_state[h.node_id]
        assert tables.get("windows", {}) == {} and not tables.get("\0timers:event")  # every window dropped
    if kind == "count":
        model_events: list[tuple[Any, ...]] = []
        for event in events:
            if event[0] == "b":
                model_events += [("r", k, ts, (k, seq, ts)) for k, seq, ts in event[1]]
            else:
                model_events.append(event)
        if not assigner.merging:
            expected, late = window_model(model_events, assigner, lateness)
            assert Counter(r for _, r in rows) == expected
            assert [r for _, r in late_rows] == late


def test_a_batch_mixing_late_on_time_and_late_firing_records_keeps_their_order() -> None:
    """One batch: a record for an open window, one for a window the watermark passed but within the
    allowed lateness (fires again at once), one too late (side output), then the open window again."""
    for operator in (WindowOperator, PerRecordWindows):
        h = Harness(operator(TumblingEventTimeWindows(10), contents_of("reduce"), 5))
        h.batch([("a", 0, 3), ("a", 1, 12)])
        h.watermark(11)  # [0, 10) fired; its clean-up is at 14
        assert h.outputs() == [(9, ("a", 0, 10, ("a", 0, 3)))]
        h.batch([("a", 2, 15), ("a", 3, 4), ("b", 4, 1), ("a", 5, 16)])
        h.watermark(14)
        h.batch([("a", 6, 5)])  # past the clean-up: late
        h.watermark(MAX_WATERMARK)
        # ("b", 4, 1): b's [0, 10) was never opened but is within the lateness: it opens and fires at once
        assert h.outputs() == [(4, ("a", 0, 10, ("a", "0,3", 3))), (1, ("b", 0, 10, ("b", 4, 1))),
                               (19, ("a", 10, 20, ("a", "1,2,5", 12)))]
        assert [r for _, r in h.late_records()] == [("a", 6, 5)]
        assert h.chain.keyed_state[h.node_id].get("windows", {}) == {}


def test_a_window_ends_for_the_batch_loop_exactly_when_the_watermark_reaches_its_last_millisecond() -> None:
    for lateness in (0, 3):
        for operator in (WindowOperator, PerRecordWindows):
            h = Harness(operator(TumblingEventTimeWindows(10), contents_of("count"), lateness))
            h.batch([("a", 0, 7)])
            h.watermark(9)  # [0, 10) fires
            h.batch([("a", 1, 8), ("b", 2, 9), ("a", 3, 10)])  # late (lateness 0), or fires again at once
            h.watermark(MAX_WATERMARK)
            again = [(8, ("a", 0, 10, 2)), (9, ("b", 0, 10, 1))] if lateness else []
            assert h.outputs() == [(9, ("a", 0, 10, 1)), *again, (19, ("a", 10, 20, 1))]
            assert [r for _, r in h.late_records()] == ([] if lateness else [("a", 1, 8), ("b", 2, 9)])

            h = Harness(operator(SlidingEventTimeWindows(10, 5), contents_of("count"), lateness))
            h.batch([("a", 0, 7)])  # [0, 10) and [5, 15)
            h.watermark(9)  # [0, 10) fires
            h.batch([("a", 1, 8), ("b", 2, 9)])  # [0, 10) passed: dropped from it, or fires again at once
            h.watermark(MAX_WATERMARK)
            again = [(8, ("a", 0, 10, 2)), (9, ("b", 0, 10, 1))] if lateness else []
            assert h.outputs() == [(9, ("a", 0, 10, 1)), *again, (14, ("a", 5, 15, 2)), (14, ("b", 5, 15, 1))]
            assert h.late_records() == []  # each is still in time for [5, 15)


def test_a_lagging_source_adds_to_older_windows_where_they_are_and_where_they_are_not_in_order() -> None:
    """A key's open windows, several at once (the watermark far behind): records of a source subtask that lags go
    to a window before the newest, found where windows in order put it, at the front, or elsewhere (out of
    order: a window opened late is appended behind newer ones)."""
    for kind in ("count", "reduce"):
        outputs = []
        for operator in (WindowOperator, PerRecordWindows):
            h = Harness(operator(TumblingEventTimeWindows(10), contents_of(kind), 0))
            h.batch([("a", 0, 5), ("a", 1, 15), ("a", 2, 25), ("a", 3, 35)])  # four windows in order
            h.batch([("a", 4, 22), ("a", 5, 12), ("a", 6, 3), ("a", 7, 27)])  # in the middle, at the front
            h.batch([("b", 8, 45), ("b", 9, 25), ("b", 10, 35), ("b", 11, 31)])  # b: [40, 50), [20, 30), [30, 40)
            h.batch([("b", 12, 28), ("b", 13, 44)])
            h.watermark(MAX_WATERMARK)
            outputs.append(h.outputs())
        assert outputs[0] == outputs[1]
        if kind == "count":
            assert sorted(r for _, r in outputs[0]) == [
                ("a", 0, 10, 2), ("a", 10, 20, 2), ("a", 20, 30, 3), ("a", 30, 40, 1),
                ("b", 20, 30, 2), ("b", 30, 40, 2), ("b", 40, 50, 2)]


def test_a_checkpoint_holds_the_accumulators_at_its_barrier_while_the_loop_keeps_changing_them() -> None:
    """The batch loop changes a key's accumulators in place between snapshots; a snapshot's synchronous part is a
    shallow copy of the tables, encoded later on the checkpoint's writer thread while the task goes on. The copy
    must hold the counts at the barrier, however the open windows change after it; a restore from it, fed the
    records after the barrier, gives the same windows as the run that never stopped."""
    for assigner in (TumblingEventTimeWindows(10), SlidingEventTimeWindows(20, 5)):
        for kind in ("count", "reduce"):
            h = Harness(WindowOperator(assigner, contents_of(kind), 0))
            h.batch([("a", 0, 1), ("b", 1, 2)])
            h.batch([("a", 2, 3), ("a", 3, 4)])
            windows = h.chain.keyed_state[h.node_id]["windows"]
            mine = windows["a"]
            h.batch([("a", 4, 5)])
            assert windows["a"] is mine  # changed in place: no snapshot holds it

            copied = h.begin_snapshot()  # the barrier: a has 4 records in [0, 10), b one
            at_barrier = read_back(copied)
            after = [("a", 5, 6), ("a", 6, 7), ("b", 7, 8), ("a", 8, 12)]
            h.batch(after[:2])
            h.batch(after[2:])
            assert read_back(copied) == at_barrier  # what the snapshot copied did not change
            assert windows["a"] is not mine  # copied before the first change after the barrier
            held = {e[1]: e[2] for e in at_barrier[h.node_id]["windows"]["a"]}
            if kind == "count":
                assert held[10] == 4  # [0, 10), or sliding [-10, 10): the four records of a before the barrier
            else:
                assert held[10][1] == "0,2,3,4"

            h.watermark(MAX_WATERMARK)
            restored = Harness(WindowOperator(assigner, contents_of(kind), 0))
            restored.chain.restore_state(at_barrier, None)
            restored.chain.restore_watermarks(MIN_WATERMARK, MIN_WATERMARK)
            restored.batch(after)
            restored.watermark(MAX_WATERMARK)
            rows = h.outputs()
            assert restored.outputs() == rows and len(rows) >= 3


def test_a_timer_drops_a_fired_window_from_the_loops_own_list_in_place_and_from_a_snapshot_s_copy_never() -> None:
    """A key with two open windows: the timer of the older one removes it from the list the batch loop owns (no
    snapshot holds it) in place; after a snapshot the same firing leaves the snapshot's copy as it was."""
    h = Harness(WindowOperator(TumblingEventTimeWindows(10), contents_of("count"), 0))
    h.batch([("a", 0, 1), ("a", 1, 12), ("a", 2, 2)])
    windows = h.chain.keyed_state[h.node_id]["windows"]
    mine = windows["a"]
    h.watermark(9)  # [0, 10) fires
    assert windows["a"] is mine and mine == [[10, 20, 1]]

    h.batch([("a", 3, 25)])  # [20, 30) opens beside [10, 20)
    copied = h.begin_snapshot()
    at_barrier = read_back(copied)
    h.batch([("a", 4, 13)])
    h.watermark(19)  # [10, 20) fires with the record after the barrier
    assert read_back(copied) == at_barrier
    assert at_barrier[h.node_id]["windows"]["a"] == ((10, 20, 1), (20, 30, 1))
    h.watermark(MAX_WATERMARK)

    restored = Harness(WindowOperator(TumblingEventTimeWindows(10), contents_of("count"), 0))
    restored.chain.restore_state(at_barrier, None)
    restored.chain.restore_watermarks(9, 9)
    restored.batch([("a", 4, 13)])
    restored.watermark(MAX_WATERMARK)
    rows = h.outputs()
    assert rows[0] == (9, ("a", 0, 10, 2))
    assert restored.outputs() == rows[1:] == [(19, ("a", 10, 20, 2)), (29, ("a", 20, 30, 1))]


def test_a_grown_session_keeps_its_timer_until_it_comes_up_and_a_snapshot_keeps_the_sessions_at_its_barrier(
        ) -> None:
    """Sessions without a lateness: a session the batch loop grows keeps the timer it opened with (no move per
    record); when that timer comes up before the session's end, it fires nothing and moves to the end. The loop
    changes a key's sessions in place until a snapshot, then copies them before the next change, and a restore
    from the snapshot goes on alike."""
    def timers() -> list[tuple[int, str]]:
        return sorted((ts, k) for ts, keys in index._keys.items() for k in keys)

    h = Harness(WindowOperator(EventTimeSessionWindows(gap_ms=5), contents_of("count"), 0))
    index = h.chain.timers.timers.event
    h.batch([("a", 0, 1), ("b", 1, 2), ("a", 2, 3)])  # a: [1, 6) grown to [1, 8), its timer still at 5; b: [2, 7)
    assert timers() == [(5, "a"), (6, "b")]
    h.batch([("a", 3, 20), ("a", 4, 4)])  # a: [20, 25); 4 is before it, it joins [1, 8): [1, 9), timer still 5
    windows = h.chain.keyed_state[h.node_id]["windows"]
    mine = windows["a"]
    assert mine == [[1, 9, 3], [20, 25, 1]]
    assert timers() == [(5, "a"), (6, "b"), (24, "a")]
    h.watermark(5)  # a's early timer: nothing due, every session of a at its end
    assert h.outputs() == [] and timers() == [(6, "b"), (8, "a"), (24, "a")]

    copied = h.begin_snapshot()
    at_barrier = read_back(copied)
    after = [("a", 5, 22), ("a", 6, 12), ("b", 7, 40)]  # a: [20, 27), then [12, 17) between the two; b: [40, 45)
    h.batch(after)
    assert read_back(copied) == at_barrier and windows["a"] is not mine
    assert at_barrier[h.node_id]["windows"]["a"] == ((1, 9, 3), (20, 25, 1))
    h.watermark(MAX_WATERMARK)
    rows = h.outputs()
    assert sorted(r for _, r in rows) == [("a", 1, 9, 3), ("a", 12, 17, 1), ("a", 20, 27, 2), ("b", 2, 7, 1),
                                          ("b", 40, 45, 1)]
    assert len(index) == 0

    restored = Harness(WindowOperator(EventTimeSessionWindows(gap_ms=5), contents_of("count"), 0))
    restored.chain.restore_state(at_barrier, None)
    restored.chain.restore_watermarks(MIN_WATERMARK, MIN_WATERMARK)
    restored.batch(after)
    restored.watermark(MAX_WATERMARK)
    assert restored.outputs() == rows
