"""AsyncKeyedProcessFunction on asyncio through the controller, against real backends (no task loop)."""

from __future__ import annotations

import os
from typing import Any

import pytest

from runtime.execution.async_controller import ControllerConfig, InFlightAtBarrier, KeyOrder, Record, Watermark
from runtime.execution.async_state import AsyncKeyedContext, AsyncKeyedProcessFunction, AsyncStateRunner
from runtime.state.backend import StateBackend
from runtime.state.files import SnapshotStore
from runtime.state.latency import LatencyBackend
from runtime.state.memory import MemoryBackend
from runtime.state.rocksdb import RocksDBBackend, available

ALL = range(0, 128)


class CountPerKey(AsyncKeyedProcessFunction):
    async def process(self, record: Any, ctx: AsyncKeyedContext) -> None:
        count = ctx.value_state("count", 0)
        n = await count.value() + 1
        await count.update(n)
        ctx.emit((ctx.key, n, record[1]))


class Fails(AsyncKeyedProcessFunction):
    async def process(self, record: Any, ctx: AsyncKeyedContext) -> None:
        if record[1] == 3:
            raise ValueError("bad record 3")
        await ctx.value_state("count").update(1)


def records(n: int, keys: int) -> list[tuple[str, int]]:
    return [(f"k{i % keys}", i) for i in range(n)]


def sequential(inputs: list[tuple[str, int]]) -> list[tuple[str, int, int]]:
    counts: dict[str, int] = {}
    out = []
    for key, i in inputs:
        counts[key] = counts.get(key, 0) + 1
        out.append((key, counts[key], i))
    return out


def by_key(items: list[Any]) -> dict[Any, list[Any]]:
    out: dict[Any, list[Any]] = {}
    for item in items:
        out.setdefault(item[0], []).append(item)
    return out


async def run(backend: StateBackend, config: ControllerConfig, inputs: list[Any],
              function: AsyncKeyedProcessFunction | None = None) -> tuple[list[Any], AsyncStateRunner]:
    out: list[Any] = []
    runner = AsyncStateRunner(function or CountPerKey(), backend, config, key_of=lambda r: r[0], emit=out.append,
                              on_watermark=lambda ts: out.append(("wm", ts)))
    try:
        for item in inputs:
            if isinstance(item, Watermark):
                runner.watermark(item.timestamp)
            elif isinstance(item, int):
                runner.barrier(item)
            else:
                await runner.process(item)
        await runner.finish()
    finally:
        await runner.aclose()
    return out, runner


@pytest.mark.parametrize("order", list(KeyOrder))
async def test_a_keyed_count_gives_the_sequential_result_per_key(order: KeyOrder) -> None:
    inputs = records(600, 7)
    backend = MemoryBackend(ALL)
    out, runner = await run(backend, ControllerConfig(key_order=order, batch_size=16), list(inputs))
    assert by_key(out) == by_key(sequential(inputs))
    assert {k: v for _, _, k, v in backend.scan(ALL)} == {f"k{i}": len(range(i, 600, 7)) for i in range(7)}
    stats = runner.controller.statistics()
    assert stats.batches_sent < 600 / 2  # reads of different keys shared round trips


async def test_with_a_millisecond_per_round_trip_records_overlap_and_input_blocks_at_the_bound() -> None:
    inputs = records(300, 50)
    backend = LatencyBackend(MemoryBackend(ALL), round_trip_s=0.001)
    out, runner = await run(backend, ControllerConfig(max_in_flight=20, batch_size=50), list(inputs))
    assert by_key(out) == by_key(sequential(inputs))
    assert backend.statistics().round_trips < 300 / 4
    assert runner.blocked_seconds > 0


async def test_watermarks_come_out_after_the_records_before_them() -> None:
    inputs: list[Any] = [*records(50, 5), Watermark(1), *records(50, 5), Watermark(2)]
    out, _ = await run(MemoryBackend(ALL), ControllerConfig(batch_size=8), inputs)
    assert out.index(("wm", 1)) == 50
    assert out[-1] == ("wm", 2)


async def test_a_failing_record_fails_the_runner_with_its_error() -> None:
    with pytest.raises(ValueError, match="bad record 3"):
        await run(MemoryBackend(ALL), ControllerConfig(), records(10, 3), Fails())


@pytest.mark.skipif(not available(), reason="the rocksdb extra is not installed")
@pytest.mark.parametrize("mode", list(InFlightAtBarrier))
async def test_a_restore_from_a_checkpoint_and_its_replay_loses_and_repeats_nothing(
        mode: InFlightAtBarrier, tmp_path: Any) -> None:
    inputs = records(400, 9)
    store = SnapshotStore(os.path.join(str(tmp_path), "checkpoints"))
    config = ControllerConfig(checkpoint_mode=mode, batch_size=8, max_in_flight=64)
    live = LatencyBackend(RocksDBBackend(ALL, directory=os.path.join(str(tmp_path), "a")), round_trip_s=0.0005)
    with live:
        out, runner = await run(live, config, [*inputs[:250], 7, *inputs[250:]])
        assert by_key(out) == by_key(sequential(inputs))  # a checkpoint changes nothing in the live run
        taken = runner.checkpoints[7]
        handle = taken.pending.upload(store)
    replay = taken.instruction.replay
    assert all(isinstance(e, Record) for e in replay)
    if mode is InFlightAtBarrier.DRAIN:
        assert replay == ()
    else:
        assert replay, "records were in flight at the barrier: capture returned them instead of waiting"
    # what went downstream before the barrier: the outputs of the records before it that are not replayed
    replayed = {e.value[1] for e in replay if isinstance(e, Record)}
    before = [o for o in out if o[2] < 250 and o[2] not in replayed]
    with RocksDBBackend(ALL, directory=os.path.join(str(tmp_path), "b")) as restored:
        restored.restore(store, [handle])
        restored.write_many(taken.instruction.puts, taken.instruction.deletes)
        again, _ = await run(restored, config, [e.value for e in replay if isinstance(e, Record)] + inputs[250:])
        assert by_key(before + again) == by_key(sequential(inputs))


@pytest.mark.skipif(not available(), reason="the rocksdb extra is not installed")
async def test_a_capture_checkpoint_as_bytes_restores_at_another_parallelism(tmp_path: Any) -> None:
    from runtime.execution.async_checkpoint import decode_async_state, encode_async_state, restore_async_state
    from runtime.graph.partitioning import key_group, key_group_range
    from runtime.state.backend import StateBackendError

    inputs = records(300, 11)
    store = SnapshotStore(os.path.join(str(tmp_path), "checkpoints"))
    config = ControllerConfig(checkpoint_mode=InFlightAtBarrier.CAPTURE, batch_size=8, max_in_flight=64)
    with LatencyBackend(RocksDBBackend(ALL, directory=os.path.join(str(tmp_path), "a")), round_trip_s=0.0005) as live:
        out, runner = await run(live, config, [*inputs[:200], Watermark(5), 3, *inputs[200:]])
        taken = runner.checkpoints[3]
        data = encode_async_state(taken.instruction, taken.pending.upload(store))
    checkpoint = decode_async_state(data, "test")
    # records come back as msgpack gives them (tuples as lists), as records that crossed a channel do
    assert checkpoint.replay == tuple(Record(e.key, list(e.value)) if isinstance(e, Record) else e
                                      for e in taken.instruction.replay)
    assert checkpoint.replay[-1] == Watermark(5)
    replayed = {e.value[1] for e in checkpoint.replay if isinstance(e, Record)}
    assert replayed
    before = [o for o in out if o[0] != "wm" and o[2] < 200 and o[2] not in replayed]
    again: list[Any] = []
    for subtask in range(2):
        groups = key_group_range(128, 2, subtask)
        with RocksDBBackend(groups, directory=os.path.join(str(tmp_path), f"b{subtask}")) as restored:
            replay = restore_async_state(restored, store, [checkpoint], max_parallelism=128)
            assert Watermark(5) in replay
            mine = [e.value for e in replay if isinstance(e, Record)]
            assert all(key_group(r[0], 128) in groups for r in mine)
            rest = [r for r in inputs[200:] if key_group(r[0], 128) in groups]
            replay_input = [e.value if isinstance(e, Record) else e for e in replay]
            got, _ = await run(restored, config, [*replay_input, *rest])
            assert got.count(("wm", 5)) == 1
            again += [o for o in got if o[0] != "wm"]
    assert by_key(before + again) == by_key(sequential(inputs))
    with pytest.raises(StateBackendError, match="does not decode"):
        decode_async_state(data[:-5], "chk-3/count-0.state")


class Sessions(AsyncKeyedProcessFunction):
    """List and map state: each key keeps its events and a count per event kind; emits both."""

    async def process(self, record: Any, ctx: AsyncKeyedContext) -> None:
        events = ctx.list_state("events")
        kinds = ctx.map_state("kinds")
        _, i = record
        if i % 10 == 9:
            await events.clear()
            await kinds.remove(i % 3)
        else:
            await events.add(i)
            await kinds.put(i % 3, await kinds.get(i % 3, 0) + 1)
        ctx.emit((ctx.key, await events.get(), await kinds.items()))


@pytest.mark.parametrize("kind", ["memory", pytest.param("rocksdb", marks=pytest.mark.skipif(
    not available(), reason="the rocksdb extra is not installed"))])
async def test_list_and_map_state_give_the_sequential_result(kind: str, tmp_path: Any) -> None:
    inputs = records(200, 4)
    backend: StateBackend = MemoryBackend(ALL) if kind == "memory" else RocksDBBackend(
        ALL, directory=os.path.join(str(tmp_path), "r"))
    with backend:
        out, _ = await run(backend, ControllerConfig(batch_size=4), list(inputs), Sessions())
    events: dict[str, list[int]] = {}
    kinds: dict[str, dict[int, int]] = {}
    want = []
    for key, i in inputs:
        if i % 10 == 9:
            events[key] = []
            kinds.setdefault(key, {}).pop(i % 3, None)
        else:
            events.setdefault(key, []).append(i)
            per_kind = kinds.setdefault(key, {})
            per_kind[i % 3] = per_kind.get(i % 3, 0) + 1
        want.append((key, list(events[key]), dict(kinds[key])))
    assert by_key(out) == by_key(want)


class CountWithTimers(CountPerKey):
    async def on_timer(self, timestamp: int, payload: Any, ctx: AsyncKeyedContext) -> None:
        count = ctx.value_state("count", 0)
        ctx.emit(("timer", ctx.key, timestamp, await count.value()))
        await count.clear()


async def test_timers_fire_before_their_watermark_and_see_every_record_before_it() -> None:
    seen: set[str] = set()
    out: list[Any] = []
    runner = AsyncStateRunner(CountWithTimers(), LatencyBackend(MemoryBackend(ALL), round_trip_s=0.0005),
                              ControllerConfig(timers=True, batch_size=8), key_of=lambda r: r[0],
                              emit=out.append, on_watermark=lambda ts: out.append(("wm", ts)),
                              timers_due=lambda ts: [(k, None) for k in sorted(seen)])
    try:
        for r in records(40, 4):
            seen.add(r[0])
            await runner.process(r)
        runner.watermark(100)
        for r in records(8, 4):
            await runner.process(r)
        await runner.finish()
    finally:
        await runner.aclose()
    wm = out.index(("wm", 100))
    assert sorted(o for o in out[:wm] if o[0] == "timer") == [("timer", f"k{i}", 100, 10) for i in range(4)]
    assert len(out[:wm]) == 44 and len(out[wm + 1:]) == 8
    assert by_key(out[wm + 1:]) == by_key(sequential(records(8, 4)))  # the timers cleared the counts
