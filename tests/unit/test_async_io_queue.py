"""The ordering core of Async I/O (runtime/execution/async_io_queue.py) under generated interleavings of records,
watermarks, completions and checkpoints: ordered output is input order, unordered output never crosses a
watermark, a key's records never overlap, the queue never holds more than its capacity, and at every
checkpoint what was emitted plus what the snapshot keeps is exactly the input so far."""

from __future__ import annotations

from collections import deque
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.execution.async_io_queue import NO_KEY, AsyncIOQueue, Mark, Start

STEPS = st.lists(st.one_of(
    st.tuples(st.just("record"), st.integers(0, 3)),  # a record of one of four keys
    st.tuples(st.just("watermark"), st.just(0)),
    st.tuples(st.just("complete"), st.integers(0, 1000)),  # completes the n-th request in flight (mod)
    st.tuples(st.just("barrier"), st.just(0)),
), max_size=120)


class Driver:
    """What runtime/execution/async_io.py does around the queue, without asyncio: an admission queue in front,
    requests in flight as a list, the output as a list of results and Marks."""

    def __init__(self, capacity: int, ordered: bool, keyed: bool) -> None:
        self.queue = AsyncIOQueue(capacity, ordered=ordered)
        self.keyed = keyed
        self.admission: deque[Any] = deque()
        self.running: list[Start] = []
        self.output: list[Any] = []
        self.arrived: list[Any] = []  # records and Marks in arrival order
        self.next_record = 0
        self.next_watermark = 0

    def key(self, record: Any) -> Any:
        return record[1] if self.keyed else NO_KEY

    def pump(self) -> None:
        self.output += self.queue.take_ready()  # results leaving make room for what waits to be admitted
        while self.admission and (isinstance(self.admission[0], Mark) or self.queue.has_room()):
            item = self.admission.popleft()
            if isinstance(item, Mark):
                self.queue.add_watermark(item.timestamp)
            else:
                self.start(self.queue.add(item, self.key(item)))
        self.output += self.queue.take_ready()
        assert len(self.queue) <= self.queue.capacity

    def start(self, starts: list[Start]) -> None:
        for s in starts:
            if self.keyed:  # one request per key at a time
                assert all(r.record[1] != s.record[1] for r in self.running)
            self.running.append(s)

    def record(self, key: int) -> None:
        record = (self.next_record, key)
        self.next_record += 1
        self.arrived.append(record)
        self.admission.append(record)
        self.pump()

    def watermark(self) -> None:
        self.next_watermark += 10
        mark = Mark(self.next_watermark)
        self.arrived.append(mark)
        self.admission.append(mark)
        self.pump()

    def complete(self, n: int) -> None:
        if not self.running:
            return
        s = self.running.pop(n % len(self.running))
        self.start(self.queue.complete(s.seq, ("result", s.record)))
        self.pump()

    def barrier(self) -> None:
        """A checkpoint: emitted results plus the snapshot (then the admission queue) are the input, once each."""
        kept = [r for _, r in (e for e in self.queue.snapshot() if not isinstance(e, Mark))]
        kept += [r for r in self.admission if not isinstance(r, Mark)]
        emitted = [r[1] for r in self.output if not isinstance(r, Mark)]
        records = [r for r in self.arrived if not isinstance(r, Mark)]
        assert sorted(emitted + kept) == records
        assert kept == sorted(kept)  # the snapshot is in arrival order: a restore re-adds it as it came

    def run_out(self) -> None:
        while self.running or self.admission:
            self.complete(0)
        assert self.queue.empty() and self.queue.in_flight == 0


def run(steps: list[tuple[str, int]], capacity: int, ordered: bool, keyed: bool) -> Driver:
    d = Driver(capacity, ordered, keyed)
    for kind, arg in steps:
        if kind == "record":
            d.record(arg)
        elif kind == "watermark":
            d.watermark()
        elif kind == "complete":
            d.complete(arg)
        else:
            d.barrier()
    d.barrier()
    d.run_out()
    d.barrier()
    return d


def results(d: Driver) -> list[Any]:
    return [r[1] for r in d.output if not isinstance(r, Mark)]


@settings(max_examples=300, deadline=None)
@given(STEPS, st.integers(1, 6), st.booleans())
def test_ordered_output_is_input_order(steps: list[tuple[str, int]], capacity: int, keyed: bool) -> None:
    d = run(steps, capacity, ordered=True, keyed=keyed)
    assert results(d) == [r for r in d.arrived if not isinstance(r, Mark)]
    # and watermarks in place: the output is the arrival sequence, merged watermarks aside
    marks_out = [m.timestamp for m in d.output if isinstance(m, Mark)]
    assert marks_out == sorted(set(marks_out))


@settings(max_examples=300, deadline=None)
@given(STEPS, st.integers(1, 6), st.booleans())
def test_unordered_output_never_crosses_a_watermark(steps: list[tuple[str, int]], capacity: int,
                                                    keyed: bool) -> None:
    d = run(steps, capacity, ordered=False, keyed=keyed)
    assert sorted(results(d)) == [r for r in d.arrived if not isinstance(r, Mark)]
    # each record's result lies between the last watermark before it and the first after it, as it arrived
    out_pos = {r: i for i, r in enumerate(d.output) if not isinstance(r, Mark)}
    mark_pos = {m.timestamp: i for i, m in enumerate(d.output) if isinstance(m, Mark)}
    emitted_marks = sorted(mark_pos)
    for i, item in enumerate(d.arrived):
        if isinstance(item, Mark):
            continue
        result = ("result", item)
        before = [m.timestamp for m in d.arrived[:i] if isinstance(m, Mark)]
        after = [m.timestamp for m in d.arrived[i:] if isinstance(m, Mark)]
        if before:  # the watermark that covers it (the newest of a merged run) left before it
            covering = min(t for t in emitted_marks if t >= before[-1])
            assert mark_pos[covering] < out_pos[result]
        if after:
            covering = min(t for t in emitted_marks if t >= after[0])
            assert out_pos[result] < mark_pos[covering]
    if keyed:  # per key, arrival order
        for key in range(4):
            mine = [r for r in results(d) if r[1] == key]
            assert mine == sorted(mine)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 3), max_size=60), st.integers(1, 5))
def test_capacity_bounds_the_queue_and_in_flight(keys: list[int], capacity: int) -> None:
    q = AsyncIOQueue(capacity, ordered=False)
    added = 0
    for key in keys:
        if not q.has_room():
            break
        q.add(key, key)
        added += 1
    assert len(q) == added <= capacity
    assert q.in_flight <= len(set(keys[:added]))  # one per key in flight
    if len(keys) > capacity:
        assert not q.has_room()
        with pytest.raises(RuntimeError):
            q.add(0, 0)


def test_done_results_still_count_until_they_leave() -> None:
    """Ordered: a finished request behind a slow one holds its slot until it is emitted."""
    q = AsyncIOQueue(2, ordered=True)
    a, b = q.add("a")[0], q.add("b")[0]
    q.complete(b.seq, "B")
    assert q.take_ready() == [] and not q.has_room()
    q.complete(a.seq, "A")
    assert q.take_ready() == ["A", "B"] and q.has_room() and q.empty()


def test_watermarks_merge_between_records() -> None:
    q = AsyncIOQueue(4, ordered=False)
    s = q.add("a")[0]
    q.add_watermark(5)
    q.add_watermark(7)
    later = q.add("b")[0]
    q.complete(later.seq, "B")
    assert q.take_ready() == []  # b arrived behind the watermark: it waits for a
    assert q.snapshot() == [(NO_KEY, "a"), Mark(7), (NO_KEY, "b")]
    q.complete(s.seq, "A")
    assert q.take_ready() == ["A", Mark(7), "B"]
