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
from hypothesis import given, settings
from hypothesis import strategies as st

from netstack.credit import Buffer
from runtime.api import Job, KeyedProcessFunction, ProcessFunction
from runtime.connectors.source import Source
from runtime.execution.channels import ChannelReader, split_records
from runtime.execution.operators import Chain, RecordWriter
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
       cuts=st.lists(st.integers(min_value=1, max_value=80), max_size=20))
def test_emit_batch_cuts_the_same_buffers_as_one_record_at_a_time(records, capacity, partitioner, n, subtask, cuts):
    if partitioner == "forward":
        n = 1
    key_fn = (lambda r: r[0]) if partitioner == "hash" else None
    one = RecordWriter(make_subs(n, capacity), partitioner, key_fn, 128, subtask)
    batched = RecordWriter(make_subs(n, capacity), partitioner, key_fn, 128, subtask)
    for r in records:
        one.emit(r)
    i = 0
    for size in cuts + [len(records)]:  # lists of varied sizes, as chunks and source batches come
        if i < len(records):
            batched.emit_batch(records[i:i + size])
        i += size
    for a, b in zip(one.subpartitions, batched.subpartitions, strict=True):
        assert sent(a) == sent(b)


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
