"""The batch paths of the hot loop give the same results, bytes and positions as one record at a time.

- `RecordWriter.emit_batch` packs a list per subpartition in one msgpack call: the buffers it cuts (bytes,
  first record offset, continued record) must be exactly those of emitting record by record, since the
  consumer's channel state and the producer's overtaken records depend on them.
- `ChannelReader.take` decodes a chunk of records in one call: `fetched` must be the exact stream position
  after them, also when the buffer ends inside a record (the Unpacker's own tell() then points into it).
- `Chain.process_batch` runs each operator over a list: every operator must see the same records in the
  same order as before, so keyed state and sink output are unchanged.
"""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from netstack.credit import Buffer
from runtime.api import BoundedOutOfOrderness, DiscardSink, Job, KeyedProcessFunction, ProcessFunction
from runtime.connectors.source import Source
from runtime.execution.channels import ChannelReader, split_records
from runtime.execution.operators import Chain, RecordWriter
from runtime.execution.operators.kinds import batch_writer
from tests.support.buffers import ListSink, make_subs, sent

records_st = st.lists(
    st.tuples(st.text(max_size=12), st.integers(min_value=-(2**40), max_value=2**40),
              st.binary(max_size=40)),
    max_size=300,
)


@settings(max_examples=150, deadline=None)
@given(records=records_st, capacity=st.integers(min_value=4, max_value=600),
       partitioner=st.sampled_from(["forward", "hash", "rebalance", "broadcast"]),
       n=st.integers(min_value=1, max_value=3), subtask=st.integers(min_value=0, max_value=3),
       cuts=st.lists(st.integers(min_value=1, max_value=80), max_size=20), timed=st.booleans())
def test_emit_batch_cuts_the_same_buffers_as_one_record_at_a_time(records, capacity, partitioner, n, subtask, cuts,
                                                                  timed):
    if partitioner == "forward":
        n = 1
    key_fn = (lambda r: r[0]) if partitioner == "hash" else None
    one = RecordWriter(make_subs(n, capacity), partitioner, key_fn, 128, subtask)
    batched = RecordWriter(make_subs(n, capacity), partitioner, key_fn, 128, subtask)
    if timed:  # (timestamp, record) pairs, routed by the record's key
        records = [(i * 7, r) for i, r in enumerate(records)]
        one.carry_timestamps()
        batched.carry_timestamps()
    for r in records:
        one.emit(r)
    i = 0
    for size in cuts + [len(records)]:  # lists of varied sizes, as chunks and source batches come
        if i < len(records):
            batched.emit_batch(records[i:i + size])
        i += size
    for a, b in zip(one.subpartitions, batched.subpartitions, strict=True):
        assert sent(a) == sent(b)


@pytest.mark.parametrize("n", [2, 3, 9])  # two, a few and many subpartitions: each a path of its own
@pytest.mark.parametrize("batched", [False, True])
def test_timestamped_records_go_where_their_records_alone_would(n: int, batched: bool) -> None:
    """An edge carrying (timestamp, record) pairs routes each pair by its record's key, one by one and in batches."""
    records = [(f"k{i % 37}", i) for i in range(500)]
    plain = RecordWriter(make_subs(n, 64), "hash", lambda r: r[0], 128, 0)
    timed = RecordWriter(make_subs(n, 64), "hash", lambda r: r[0], 128, 0)
    timed.carry_timestamps()
    pairs = [(i * 7, r) for i, r in enumerate(records)]
    if batched:
        plain.emit_batch(records)
        timed.emit_batch(pairs)
    else:
        for r, pair in zip(records, pairs, strict=True):
            plain.emit(r)
            timed.emit(pair)

    def unpacked(sub: Any) -> list[Any]:
        unpacker = msgpack.Unpacker(use_list=False)
        unpacker.feed(b"".join(data for data, _, _ in sent(sub)))
        return list(unpacker)

    for a, b in zip(plain.subpartitions, timed.subpartitions, strict=True):
        assert [record for _, record in unpacked(b)] == unpacked(a)


def feed_and_take(stream: bytes, cuts: list[int], chunks: list[int]) -> tuple[list[Any], list[int]]:
    """Feed `stream` in buffers cut at `cuts`, take records in chunks; returns them and `fetched` after each."""
    reader = ChannelReader()
    taken: list[Any] = []
    positions = []
    pos = 0
    sizes = iter(chunks * 50 + [7] * 10_000)
    for cut in sorted(set(cuts)) + [len(stream)]:
        if cut <= pos:
            continue
        reader.feed(stream[pos:cut])
        pos = cut
        while records := reader.take(next(sizes)):
            taken.extend(records)
            positions.append(reader.fetched)
            reader.consumed = reader.fetched
            assert reader.unconsumed() == stream[reader.consumed:pos]
        reader.trim()
    return taken, positions


@settings(max_examples=150, deadline=None)
@given(records=records_st, cuts=st.lists(st.integers(min_value=0, max_value=20_000), max_size=40),
       chunks=st.lists(st.integers(min_value=1, max_value=64), min_size=1, max_size=10))
def test_take_reports_the_exact_position_after_the_records_it_returns(records, cuts, chunks):
    pack = msgpack.Packer().pack
    packed = [pack(r) for r in records]
    stream = b"".join(packed)
    taken, positions = feed_and_take(stream, [c % (len(stream) + 1) for c in cuts], chunks)
    assert taken == records
    ends = set()
    end = 0
    for p in packed:
        end += len(p)
        ends.add(end)
    assert all(p in ends for p in positions)
    assert positions[-1:] == ([len(stream)] if records else [])


def test_take_when_a_buffer_ends_inside_a_record():
    # The Unpacker's tell() moves into the partial record it began; `fetched` must not.
    pack = msgpack.Packer().pack
    stream = b"".join(pack(("k", i, "x" * 20)) for i in range(10))
    reader = ChannelReader()
    reader.feed(stream[:-5])
    records = reader.take(100)
    assert len(records) == 9
    assert reader.fetched == len(stream) - len(pack(("k", 9, "x" * 20)))
    reader.consumed = reader.fetched
    reader.trim()
    reader.feed(stream[-5:])
    assert reader.take(100) == [("k", 9, "x" * 20)]
    assert reader.fetched == len(stream)


class RunningCount(KeyedProcessFunction):
    def open(self, ctx):
        self.count = ctx.value_state("count", default=0)

    def process(self, record, ctx):
        n = self.count.value() + 1
        self.count.update(n)
        ctx.emit((ctx.current_key, n, record[1]))
        if n % 3 == 0:
            ctx.emit(("third", n))


def build_chain() -> tuple[Chain, ListSink]:
    job = Job("t")
    sink = ListSink()
    (job.source(Source(), parallelism=1)
        .map(lambda r: (r[0] % 5, r[1]))
        .filter(lambda r: r[1] % 7 != 0)
        .flat_map(lambda r: [r] * (r[1] % 3))
        .key_by(lambda r: r[0])
        .process(RunningCount(), parallelism=1)
        .key_by(lambda r: r[0])
        .reduce(lambda a, b: (a[0], a[1] + b[1]), parallelism=1)
        .sink(sink, parallelism=1))
    chain = Chain(job, [n.id for n in job.nodes], subtask_index=0, parallelism=1, attempt=0, outputs=[])
    chain.open()
    return chain, sink


@settings(max_examples=100, deadline=None)
@given(values=st.lists(st.integers(min_value=0, max_value=1000), max_size=200),
       sizes=st.lists(st.integers(min_value=1, max_value=50), min_size=1, max_size=20))
def test_process_batch_gives_the_same_output_and_state_as_one_record_at_a_time(values, sizes):
    records = [(v, i) for i, v in enumerate(values)]
    one, one_sink = build_chain()
    for r in records:
        one.process(r)
    batched, batched_sink = build_chain()
    i = 0
    while i < len(records):
        size = sizes[i % len(sizes)]
        batched.process_batch(records[i:i + size])
        i += size
    assert batched_sink.out == one_sink.out
    assert batched.keyed_state == one.keyed_state
    assert batched.records_out == one.records_out == len(one_sink.out)


def test_a_list_too_long_for_the_buffer_is_cut_where_its_records_start():
    sub = make_subs(1, 64)[0]
    w = RecordWriter([sub], "forward", None, 128, 0)
    records = [("key", i, "v" * (i % 9)) for i in range(40)]
    w.emit_batch(records)
    buffers = [Buffer(d, f, c) for d, f, c in sent(sub)]
    assert all(len(b.data) == 64 for b in buffers[:-1])
    stream = b"".join(b.data for b in buffers)
    assert [msgpack.unpackb(r, use_list=False) for r in split_records(stream)] == records
    for b in buffers[1:]:
        if b.continued_record is not None:  # the record the buffer continues, whole
            assert msgpack.unpackb(b.continued_record, use_list=False) in records


class Greeter(ProcessFunction):
    def open(self, ctx):
        ctx.emit("hello from open")

    def process(self, record, ctx):
        ctx.emit(record)


def test_records_emitted_in_open_reach_the_sink_at_once():
    job = Job("t")
    sink = ListSink()
    job.source(Source(), parallelism=1).process(Greeter(), parallelism=1).sink(sink, parallelism=1)
    chain = Chain(job, [n.id for n in job.nodes], subtask_index=0, parallelism=1, attempt=0, outputs=[])
    chain.open()
    assert sink.out == ["hello from open"]
    chain.process_batch([1, 2])
    assert sink.out == ["hello from open", 1, 2]


class BatchListSink(ListSink):
    """Takes a batch at once (write_all beside the write it stands for)."""

    def __init__(self) -> None:
        super().__init__()
        self.batches = 0

    def write_all(self, records):
        self.batches += 1
        self.out.extend(records)


class PerRecordDiscard(DiscardSink):
    """Overrides `write` alone: must see every record, although DiscardSink takes batches."""

    def open(self, subtask_index, parallelism, attempt):
        super().open(subtask_index, parallelism, attempt)
        self.seen = []

    def write(self, record):
        self.seen.append(record)


def test_a_sink_takes_a_batch_at_once_only_where_write_all_stands_for_its_write():
    assert batch_writer(DiscardSink()) is not None
    assert batch_writer(BatchListSink()) is not None
    assert batch_writer(ListSink()) is None  # the default write_all: write per record, from the sink's own loop
    assert batch_writer(PerRecordDiscard()) is None


@pytest.mark.parametrize("event_time", [False, True])
@pytest.mark.parametrize("make_sink", [BatchListSink, PerRecordDiscard, DiscardSink])
def test_batch_sinks_get_every_record_in_order_with_and_without_event_time(event_time, make_sink):
    sink = make_sink()
    job = Job("t")
    watermarks = BoundedOutOfOrderness(max_delay_ms=0, timestamp=lambda r: r) if event_time else None
    job.source(Source(), parallelism=1, watermarks=watermarks).map(lambda r: r * 10).sink(sink, parallelism=1)
    chain = Chain(job, [n.id for n in job.nodes], subtask_index=0, parallelism=1, attempt=0, outputs=[])
    chain.open()
    for batch in ([1, 2, 3], [4], [5, 6]):
        chain.process_batch([(r, r) for r in batch] if event_time else batch)
    if isinstance(sink, BatchListSink):
        assert (sink.out, sink.batches) == ([10, 20, 30, 40, 50, 60], 3)
    elif isinstance(sink, PerRecordDiscard):
        assert sink.seen == [10, 20, 30, 40, 50, 60]
    else:
        assert sink.records == 6
    assert chain.records_out == 6
