"""Event time, the pure parts: the source's watermark generator, the per-task channel minimum with idleness,
the timer queue, and the chain carrying timestamps (records inherit them; timers fire in order)."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.api import (
    MAX_WATERMARK,
    MIN_WATERMARK,
    BoundedOutOfOrderness,
    GeneratorSource,
    Job,
    JobDefinitionError,
    KeyedProcessFunction,
)
from runtime.execution.operators import Chain, RecordWriter
from runtime.execution.timers import TimerQueue
from runtime.execution.watermarks import ACTIVE, IDLE, Advance, WatermarkCombiner, WatermarkGenerator
from tests.support.buffers import make_subs, sent


def strategy(delay: int, granularity: int = 1) -> BoundedOutOfOrderness:
    return BoundedOutOfOrderness(max_delay_ms=delay, timestamp=lambda r: r, granularity_ms=granularity)


# -- the generator -------------------------------------------------------------------------------------------


def test_generator_emits_max_ts_minus_delay_minus_one_when_it_advances() -> None:
    gen = WatermarkGenerator(strategy(100))
    assert [gen.on_timestamp(ts) for ts in [1000, 1050, 990, 1050, 1201, 1100]] == [899, 949, None, None, 1100,
                                                                                    None]
    assert gen.snapshot() == [1201, 1100, False]


def test_generator_floors_to_the_granularity() -> None:
    gen = WatermarkGenerator(strategy(0, granularity=1000))
    assert [gen.on_timestamp(ts) for ts in [999, 1000, 1001, 1999, 2001, -5000]] == [0, None, 1000, None,
                                                                                     2000, None]
    neg = WatermarkGenerator(strategy(0, granularity=1000))
    assert neg.on_timestamp(-1500) == -2000  # floor, not truncation toward zero


def test_generator_state_round_trips() -> None:
    gen = WatermarkGenerator(strategy(10))
    gen.on_timestamp(500)
    again = WatermarkGenerator(strategy(10), gen.snapshot())
    assert again.on_timestamp(495) is None and again.on_timestamp(520) == 509


@settings(max_examples=200, deadline=None)
@given(ts=st.lists(st.integers(min_value=-10**6, max_value=10**6), max_size=200),
       delay=st.integers(min_value=0, max_value=5000), granularity=st.integers(min_value=1, max_value=1000))
def test_generator_emits_the_floored_bound_exactly_when_it_rises(ts: list[int], delay: int,
                                                                   granularity: int) -> None:
    gen = WatermarkGenerator(strategy(delay, granularity))
    last = MIN_WATERMARK
    for i, t in enumerate(ts):
        bound = max(ts[: i + 1]) - delay - 1
        expected = bound - bound % granularity
        out = gen.on_timestamp(t)
        if expected > last:
            assert out == expected
            last = expected
        else:
            assert out is None
        assert out is None or out % granularity == 0


def test_strategy_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="max_delay_ms"):
        BoundedOutOfOrderness(max_delay_ms=-1, timestamp=lambda r: r)
    with pytest.raises(ValueError, match="granularity_ms"):
        BoundedOutOfOrderness(max_delay_ms=1, timestamp=lambda r: r, granularity_ms=0)
    with pytest.raises(ValueError, match="idle_timeout_ms"):
        BoundedOutOfOrderness(max_delay_ms=1, timestamp=lambda r: r, idle_timeout_ms=0)
    with pytest.raises(JobDefinitionError, match="BoundedOutOfOrderness"):
        Job().source(GeneratorSource(count=1), watermarks=100)  # type: ignore[arg-type]


# -- the combiner -------------------------------------------------------------------------------------------


def test_combined_watermark_is_the_minimum_over_channels_forwarded_when_it_advances() -> None:
    c = WatermarkCombiner(["a", "b"])
    assert c.on_watermark("a", 10) == Advance()
    assert c.on_watermark("b", 5) == Advance(5)
    assert c.on_watermark("b", 20) == Advance(10)
    assert c.on_watermark("b", 15) == Advance()  # a channel's watermark never goes back
    assert c.on_watermark("a", 30) == Advance(20)
    assert c.current == 20


def test_idle_channels_do_not_hold_the_minimum_back() -> None:
    c = WatermarkCombiner(["a", "b"])
    c.on_watermark("a", 10)
    assert c.on_idle("b") == Advance(10)
    assert c.on_watermark("a", 12) == Advance(12)
    assert c.on_watermark("b", 100) == Advance()  # ignored while idle
    # b comes back behind the combined watermark: it counts again once it has caught up
    assert c.on_active("b") == Advance()
    assert c.on_watermark("a", 50) == Advance(50)
    assert c.on_watermark("b", 20) == Advance()
    assert c.on_watermark("a", 60) == Advance(60)  # b is still behind: it does not count yet
    assert c.on_watermark("b", 70) == Advance()  # caught up: it counts from now on
    assert c.on_watermark("a", 80) == Advance(70)


def test_all_channels_idle_makes_the_task_idle_at_the_highest_watermark() -> None:
    c = WatermarkCombiner(["a", "b"])
    c.on_watermark("a", 10)
    c.on_watermark("b", 30)
    assert c.on_idle("a") == Advance(30)
    assert c.on_idle("b") == Advance(None, IDLE)
    assert c.idle
    assert c.on_active("a") == Advance(None, ACTIVE)
    assert c.on_active("a") == Advance()
    state = c.snapshot()
    again = WatermarkCombiner(["a", "b"], msgpack.unpackb(msgpack.packb(state), strict_map_key=False))
    assert again.snapshot() == state


markers_st = st.lists(st.tuples(st.sampled_from(["a", "b", "c"]),
                                st.one_of(st.integers(min_value=0, max_value=1000), st.just(IDLE),
                                          st.just(ACTIVE))), max_size=120)


@settings(max_examples=300, deadline=None)
@given(markers=markers_st)
def test_combined_watermark_never_goes_back_and_is_an_active_minimum(markers: list[tuple[str, Any]]) -> None:
    c = WatermarkCombiner(["a", "b", "c"])
    last = MIN_WATERMARK
    for channel, marker in markers:
        before = c.snapshot()
        adv = c.on_marker(channel, marker)
        if adv.watermark is not None:
            assert adv.watermark > last
            last = adv.watermark
            active = [ch for ch in c.channels.values() if not ch.idle]
            if active and not c.idle:
                # the minimum over the channels that count, none of which is behind it
                counted = [ch.watermark for ch in c.channels.values() if ch.aligned]
                assert adv.watermark == min(counted)
        assert c.current == last
        restored = WatermarkCombiner(["a", "b", "c"], before)
        assert restored.on_marker(channel, marker) == adv  # the state is the whole state


# -- timers ---------------------------------------------------------------------------------------------------


def test_timer_queue_dedups_deletes_and_pops_in_order() -> None:
    table: dict[Any, tuple[int, ...]] = {}
    q = TimerQueue(table)
    assert q.register("b", 20) and q.register("a", 20) and q.register("a", 10)
    assert not q.register("a", 10)  # (key, timestamp) once
    assert q.register(("t", 1), 5)
    assert q.delete("b", 20) and not q.delete("b", 20)
    assert q.register("b", 20)  # again after a delete: fires once
    assert len(q) == 4 and q.peek() == 5
    assert q.pop_due(4) is None
    assert [q.pop_due(20) for _ in range(5)] == [(5, ("t", 1)), (10, "a"), (20, "a"), (20, "b"), None]
    assert table == {} and q.peek() is None


@settings(max_examples=150, deadline=None)
@given(ops=st.lists(st.tuples(st.booleans(), st.integers(min_value=0, max_value=5),
                              st.integers(min_value=0, max_value=30)), max_size=80),
       upto=st.integers(min_value=0, max_value=30))
def test_timer_queue_fires_each_registered_timer_once_in_timestamp_then_key_order(
        ops: list[tuple[bool, int, int]], upto: int) -> None:
    table: dict[Any, tuple[int, ...]] = {}
    q = TimerQueue(table)
    model: set[tuple[int, int]] = set()
    for register, key, ts in ops:
        if register:
            q.register(key, ts)
            model.add((ts, key))
        else:
            q.delete(key, ts)
            model.discard((ts, key))
    restored = TimerQueue({k: tuple(v) for k, v in table.items()})  # rebuilt from the table alone
    for queue in (q, restored):
        fired = []
        while (due := queue.pop_due(upto)) is not None:
            fired.append(due)
        expected = sorted((t, k) for t, k in model if t <= upto)
        assert fired == sorted(expected, key=lambda tk: (tk[0], msgpack.packb(tk[1])))
        assert len(queue) == len([1 for t, _ in model if t > upto])


# -- the chain carries timestamps ----------------------------------------------------------------------------------


class Timed(KeyedProcessFunction):
    def process(self, record: Any, ctx: Any) -> None:
        ctx.emit(("seen", record, ctx.timestamp, ctx.current_watermark))
        ctx.timers.register_event_time(ctx.timestamp + 10)
        ctx.timers.register_event_time(ctx.timestamp + 10)

    def on_timer(self, timestamp: int, ctx: Any) -> None:
        ctx.emit(("timer", ctx.current_key, timestamp, ctx.time_domain))


def decode(sub: Any) -> list[Any]:
    unpacker = msgpack.Unpacker(use_list=False, raw=False)
    for data, _, _ in sent(sub):
        unpacker.feed(data)
    return list(unpacker)


def test_chain_stamps_outputs_fires_timers_and_forwards_watermarks_in_band() -> None:
    job = Job()
    src = job.source(GeneratorSource(count=1), watermarks=strategy(0))
    keyed = src.key_by(lambda r: r).process(Timed(), name="timed")
    keyed.map(lambda r: r, name="after")
    subs = make_subs(1, 1 << 20)
    chain = Chain(job, [1, 2], subtask_index=0, parallelism=1, attempt=0,
                  outputs=[RecordWriter(subs, "forward", None, job.max_parallelism, 0)])
    assert chain.event_time and chain.timers is not None
    chain.open()
    chain.process_batch([(100, "x"), (105, "y")])
    chain.timers.set_watermark(111)
    assert not chain.timers.fire_event(111, 64)
    chain.forward_watermark(111)
    assert decode(subs[0]) == [
        (100, ("seen", "x", 100, MIN_WATERMARK)), (105, ("seen", "y", 105, MIN_WATERMARK)),
        (110, ("timer", "x", 110, "event_time")), 111]
    chain.process_batch([(200, "x")])
    chain.timers.set_watermark(MAX_WATERMARK)
    assert chain.timers.fire_event(MAX_WATERMARK, 1)  # one chunk of one: more are due
    assert not chain.timers.fire_event(MAX_WATERMARK, 1)
    assert decode(subs[0]) == [(200, ("seen", "x", 200, 111)), (115, ("timer", "y", 115, "event_time")),
                               (210, ("timer", "x", 210, "event_time"))]
