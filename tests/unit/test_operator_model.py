"""One operator model: every operator kind serves a job with and without event time through the same set-up.

- A non-keyed ProcessFunction gets list state in both (it failed with AttributeError in `open()` of a job with
  watermarks, when the timestamped path built a plain Context).
- Every kind gives the same records, state and side outputs with and without event time; with it, outputs
  carry the timestamp of the record they came from.
- Operators open from the tail of the chain back, so a record emitted in `open()` meets open operators.
"""

from __future__ import annotations

from typing import Any

import msgpack
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.api import BoundedOutOfOrderness, GeneratorSource, Job, KeyedProcessFunction, OutputTag, ProcessFunction
from runtime.execution.operators import Chain, RecordWriter
from tests.support.buffers import ListSink, make_subs, sent

ODD = OutputTag("odd")


def decode(sub: Any) -> list[Any]:
    """What a subpartition sent, as records (and markers)."""
    unpacker = msgpack.Unpacker(use_list=False, raw=False)
    for data, _, _ in sent(sub):
        unpacker.feed(data)
    return list(unpacker)


class Remember(ProcessFunction):
    """Keeps every record in split list state and the count of records in union list state."""

    def open(self, ctx: Any) -> None:
        self.seen = ctx.list_state("seen")
        self.total = ctx.union_list_state("total")
        self.restored = self.seen.get()

    def process(self, record: Any, ctx: Any) -> None:
        self.seen.add(record)
        self.total.update([len(self.seen)])
        ctx.emit((record, len(self.seen)))


def timed_job(fn: ProcessFunction) -> Job:
    job = Job("t")
    src = job.source(GeneratorSource(count=1),
                     watermarks=BoundedOutOfOrderness(max_delay_ms=0, timestamp=lambda r: r[1]))
    src.process(fn, name="remember")
    return job


def test_list_state_works_in_a_job_with_event_time() -> None:
    job = timed_job(Remember())
    subs = make_subs(1, 1 << 20)
    chain = Chain(job, [0, 1], subtask_index=0, parallelism=1, attempt=0,
                  outputs=[RecordWriter(subs, "forward", None, job.max_parallelism, 0)])
    assert chain.event_time
    chain.open()
    chain.process_batch([(100, "a"), (105, "b")])
    assert decode(subs[0]) == [(100, ("a", 1)), (105, ("b", 2))]
    lists = chain.snapshot_lists()
    assert lists == {1: {"seen": ["split", ["a", "b"]], "total": ["union", [2]]}}
    # restored before open, as the task does
    fn = Remember()
    again = Chain(timed_job(fn), [0, 1], subtask_index=0, parallelism=1, attempt=1,
                  outputs=[RecordWriter(make_subs(1, 1 << 20), "forward", None, job.max_parallelism, 0)])
    again.restore_lists(lists)
    again.open()
    assert fn.restored == ["a", "b"]


class SplitOdd(ProcessFunction):
    def process(self, record: Any, ctx: Any) -> None:
        if record[1] % 2:
            ctx.output(ODD, record)
        else:
            ctx.emit(record)


class Sum(KeyedProcessFunction):
    def open(self, ctx: Any) -> None:
        self.sum = ctx.value_state("sum", default=0)

    def process(self, record: Any, ctx: Any) -> None:
        s = self.sum.value() + record[1]
        self.sum.update(s)
        ctx.emit((ctx.current_key, s))


def every_kind(timed: bool, with_sink: bool) -> tuple[Chain, ListSink, Any, Any]:
    """source -> map -> filter -> flat_map -> process (side output) -> keyed process -> reduce -> map, and a
    sink after it (`with_sink`) or the chain's main output."""
    job = Job("kinds")
    sink = ListSink()
    watermarks = BoundedOutOfOrderness(max_delay_ms=0, timestamp=lambda r: r[1]) if timed else None
    (job.source(GeneratorSource(count=1), watermarks=watermarks)
        .map(lambda r: (r[0] % 4, r[1]))
        .filter(lambda r: r[1] % 5 != 0)
        .flat_map(lambda r: [r] * (r[1] % 3))
        .process(SplitOdd(), name="split")
        .key_by(lambda r: r[0])
        .process(Sum())
        .key_by(lambda r: r[0])
        .reduce(lambda a, b: (a[0], max(a[1], b[1])))
        .map(lambda r: ("out", r))
        .sink(sink))
    ids = [n.id for n in job.nodes if n.kind != "source" and (with_sink or n.kind != "sink")]
    main, side = make_subs(1, 1 << 20), make_subs(1, 1 << 20)
    side_writer = RecordWriter(side, "forward", None, job.max_parallelism, 0)
    side_writer.side_output = (4, ODD.name)
    chain = Chain(job, [0, *ids], subtask_index=0, parallelism=1, attempt=0,
                  outputs=[RecordWriter(main, "forward", None, job.max_parallelism, 0), side_writer])
    chain.open()
    return chain, sink, main[0], side[0]


@settings(max_examples=60, deadline=None)
@given(values=st.lists(st.integers(min_value=0, max_value=50), max_size=120),
       sizes=st.lists(st.integers(min_value=1, max_value=30), min_size=1, max_size=10),
       with_sink=st.booleans())
def test_every_kind_gives_the_same_records_with_and_without_event_time(values: list[int], sizes: list[int],
                                                                          with_sink: bool) -> None:
    records = [(v, 1000 + i) for i, v in enumerate(values)]  # the second field is the event time
    plain, plain_sink, plain_main, plain_side = every_kind(False, with_sink)
    timed, timed_sink, timed_main, timed_side = every_kind(True, with_sink)
    i = 0
    while i < len(records):
        size = sizes[i % len(sizes)]
        plain.process_batch(records[i:i + size])
        timed.process_batch([(r[1], r) for r in records[i:i + size]])
        i += size
    plain.forward_watermark(5000)
    timed.forward_watermark(5000)
    assert timed_sink.out == plain_sink.out
    assert timed.keyed_state == plain.keyed_state
    assert timed.records_out == plain.records_out
    main_pairs, side_pairs = decode(timed_main), decode(timed_side)  # decoding takes the buffers: once
    plain_out, plain_side_out = decode(plain_main), decode(plain_side)
    # the watermark goes out on every writer after the records before it, also past a sink
    assert plain_out[-1] == main_pairs[-1] == plain_side_out[-1] == side_pairs[-1] == 5000
    assert [r for _, r in main_pairs[:-1]] == plain_out[:-1]
    assert [r for _, r in side_pairs[:-1]] == plain_side_out[:-1]
    assert (not plain_out[:-1]) if with_sink else (not plain_sink.out)
    # timestamps are inherited: a side output carries its record's; the reduce emits in input order
    assert all(ts == r[1] for ts, r in side_pairs[:-1])
    stamps = [ts for ts, _ in main_pairs[:-1]]
    assert stamps == sorted(stamps)
    assert plain.records_out == len(plain_out) - 1 + len(plain_side_out) - 1 + len(plain_sink.out)


class Greet(ProcessFunction):
    """Emits a record in open()."""

    def open(self, ctx: Any) -> None:
        ctx.emit("hello")

    def process(self, record: Any, ctx: Any) -> None:
        ctx.emit(record)


class Tag(ProcessFunction):
    """Needs its open() before its first record."""

    def open(self, ctx: Any) -> None:
        self.tag = f"#{ctx.subtask_index}"

    def process(self, record: Any, ctx: Any) -> None:
        ctx.emit((self.tag, record))


def test_a_record_emitted_in_open_finds_the_operators_after_it_open() -> None:
    job = Job("open")
    sink = ListSink()
    job.source(GeneratorSource(count=1)).process(Greet()).process(Tag()).sink(sink)
    chain = Chain(job, [0, 1, 2, 3], subtask_index=0, parallelism=1, attempt=0, outputs=[])
    chain.open()
    chain.process_batch(["x"])
    assert sink.out == [("#0", "hello"), ("#0", "x")]
    assert chain.records_out == 2
