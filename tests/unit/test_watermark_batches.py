"""A task's input chunk with watermark markers in it (`TaskTime.run_chunk`): only a marker that moves the combined
watermark or status cuts the batch, and the outputs, timers and watermarks downstream are exactly those of
cutting at every marker (the previous behaviour, kept here as the reference)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgpack
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.api import BoundedOutOfOrderness, GeneratorSource, Job, KeyedProcessFunction
from runtime.execution.channels import ChannelReader
from runtime.execution.operators import Chain, RecordWriter
from runtime.execution.task_time import TIMER_CHUNK, TaskTime, position_after
from runtime.execution.watermarks import ACTIVE, IDLE, NOTHING
from tests.support.buffers import make_subs, sent

CHANNELS = ["a", "b", "c"]


class Timed(KeyedProcessFunction):
    """Shows the operator's watermark with every record, and a timer 10 ms after it."""

    def process(self, record: Any, ctx: Any) -> None:
        ctx.emit(("seen", record, ctx.timestamp, ctx.current_watermark))
        ctx.timers.register_event_time(ctx.timestamp + 10)

    def on_timer(self, timestamp: int, ctx: Any) -> None:
        ctx.emit(("timer", ctx.current_key, timestamp))


class Host:
    """A real chain with the event time of a task with three input channels."""

    def __init__(self) -> None:
        job = Job()
        strategy = BoundedOutOfOrderness(max_delay_ms=0, timestamp=lambda r: r, granularity_ms=1)
        src = job.source(GeneratorSource(count=1), watermarks=strategy)
        src.key_by(lambda r: r).process(Timed(), name="timed")
        self.subs = make_subs(1, 1 << 22)
        self.chain = Chain(job, [1], subtask_index=0, parallelism=1, attempt=0,
                           outputs=[RecordWriter(self.subs, "forward", None, job.max_parallelism, 0)])
        self.chain.open()
        self.time = TaskTime(self.chain, source=None, channel_keys=CHANNELS)
        self.batches: list[int] = []

    def process(self, batch: list[Any]) -> None:
        self.batches.append(len(batch))
        self.chain.process_batch(batch)

    def output(self) -> list[Any]:
        unpacker = msgpack.Unpacker(use_list=False, raw=False)
        for data, _, _ in sent(self.subs[0]):
            unpacker.feed(data)
        return list(unpacker)


def cut_at_every_marker(host: Host, items: list[Any], process: Callable[[list[Any]], None], key: str,
                        reader: ChannelReader) -> tuple[int, int, bool]:
    """The reference: `run_chunk` as it was, processing the records before every marker first."""
    combiner = host.time.combiner
    assert combiner is not None
    start = 0
    markers = 0
    for k, item in enumerate(items):
        if item.__class__ is tuple:
            continue
        markers += 1
        if k > start:
            process(items[start:k])
        start = k + 1
        if combiner.on_marker(key, item) is not NOTHING and host.time.advance():
            reader.consumed = position_after(reader, k + 1)
            return start, markers, True
    if start < len(items):
        process(items[start:] if start else items)
    return len(items), markers, False


def run(chunks: list[tuple[int, list[Any]]], reference: bool) -> tuple[Host, list[Any]]:
    """The input processor's loop without the mailbox: each chunk from its channel's reader, a timer burst
    run to the end where one is left. Returns the host and what the task saw (positions, results)."""
    host = Host()
    readers = {key: ChannelReader() for key in CHANNELS}
    trace: list[Any] = []
    for channel, chunk in chunks:
        key = CHANNELS[channel]
        reader = readers[key]
        reader.feed(b"".join(msgpack.packb(item) for item in chunk))
        items = reader.take(len(chunk))
        while items:
            if reference:
                start, markers, burst = cut_at_every_marker(host, items, host.process, key, reader)
            else:
                start, markers, burst = host.time.run_chunk(items, host.process, key, reader)
            trace.append((key, start, markers, burst, reader.consumed))
            if not burst:
                reader.consumed = reader.fetched
                break
            while host.time.fire_timers():
                pass
            assert not host.time.advance()
            items = items[start:]
    trace.append(host.time.snapshot())
    return host, trace


record = st.builds(lambda ts, k: (ts, k), st.integers(0, 300), st.integers(0, 40))
marker = st.one_of(st.integers(0, 300), st.sampled_from([IDLE, ACTIVE]))
chunk = st.lists(st.one_of(record, record, record, marker), min_size=1, max_size=120)
# more timers than one chunk at one timestamp: a watermark past it leaves a burst to run
flood = st.builds(lambda ts, tail: [(ts, k) for k in range(2 * TIMER_CHUNK)] + tail, st.integers(0, 300), chunk)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, len(CHANNELS) - 1), st.one_of(chunk, chunk, flood)), min_size=1,
                max_size=12))
def test_same_outputs_watermarks_and_positions_as_cutting_at_every_marker(chunks: list[tuple[int, list[Any]]]
                                                                          ) -> None:
    new, new_trace = run(chunks, reference=False)
    old, old_trace = run(chunks, reference=True)
    assert new.output() == old.output()  # records, timers and in-band watermarks, in order
    assert new_trace == old_trace  # the same bursts at the same reader positions; the same combiner state
    assert sum(new.batches) == sum(old.batches) and len(new.batches) <= len(old.batches)


def test_a_marker_that_moves_nothing_does_not_cut_the_batch() -> None:
    chunks: list[tuple[int, list[Any]]] = [
        (0, [(1, "p"), 50, (2, "q")]),  # a runs ahead: the minimum stays at b's and c's (none yet)
        (1, [5, (3, "p"), 60]),
        (2, [(4, "q"), 40, (5, "r")]),  # c's 40 moves the minimum to 40: the one cut
    ]
    new, _ = run(chunks, reference=False)
    old, _ = run(chunks, reference=True)
    assert new.batches == [2, 1, 1, 1]
    assert old.batches == [1, 1, 1, 1, 1]
    out = new.output()
    assert out == old.output()
    assert out[-2:] == [40, (5, ("seen", "r", 5, 40))]  # applied between exactly those records
