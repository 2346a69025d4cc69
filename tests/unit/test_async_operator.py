"""An AsyncKeyedProcessFunction as a chain operator (runtime/execution/async_operator.py), on real backends:
settings, admission and the in-flight bound, watermarks in order, capture snapshots and their replay."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import pytest

from runtime.api.async_functions import AsyncKeyedContext, AsyncKeyedProcessFunction, AsyncStateUsageError
from runtime.execution.async_checkpoint import decode_inflight, inflight_document, restore_inflight
from runtime.execution.async_controller import EpochMode, KeyOrder, Record, TakeSnapshot, Watermark
from runtime.execution.async_operator import AsyncOperator, AsyncStateSettings
from runtime.execution.user_code import UserCodeExit
from runtime.execution.user_loop import UserLoop
from runtime.graph.partitioning import key_group
from runtime.state.backend import StateBackend
from runtime.state.files import SnapshotStore
from runtime.state.latency import LatencyBackend
from runtime.state.memory import MemoryBackend
from tests.support.loopback import wait_until
from tests.support.user_loops import OperatorHarness, where_the_chain_runs  # noqa: F401 (autouse)

ALL = range(0, 128)


class Count(AsyncKeyedProcessFunction):
    """The README's asynchronous count: a handle made in open() serves every record."""

    async def open(self, ctx: Any) -> None:
        self.count = ctx.value_state("count", 0)

    async def process(self, record: Any, ctx: AsyncKeyedContext) -> None:
        n = (await self.count.value()) + 1
        await self.count.update(n)
        ctx.emit((record[0], n))


class FailsOn(Count):
    async def process(self, record: Any, ctx: AsyncKeyedContext) -> None:
        if record[1] == "bad":
            raise ValueError("bad record")
        await super().process(record, ctx)


class Harness(OperatorHarness):
    def __init__(self, backend: StateBackend, *, function: AsyncKeyedProcessFunction | None = None,
                 **settings: Any) -> None:
        self.log: list[Any] = []  # outputs and forwarded watermarks, in the order the chain got them
        self.failures: list[BaseException] = []
        self.wakes = 0  # the task's wake-ups: the operator made progress (a record finished, it failed)
        self.op = AsyncOperator(function or Count(), backend, AsyncStateSettings.from_config(settings), node_id=3,
                                name="Count", key_fn=lambda r: r[0], subtask_index=0, parallelism=1,
                                max_parallelism=128, timed=False, emit=self.log.extend,
                                forward_watermark=lambda ts: self.log.append(("wm", ts)))
        self.op.bind(wake=self._wake, on_failure=self.failures.append)
        self.place()

    def _wake(self) -> None:
        self.wakes += 1

    async def finish(self) -> None:
        await wait_until(self.op.quiet)
        await self.run(self.op.finish())
        await self.aclose()


# -- settings ------------------------------------------------------------------------------------------------


def test_settings_default_to_flinks_and_parse_the_job_configuration() -> None:
    default = AsyncStateSettings.from_config(None)
    assert default == AsyncStateSettings(max_in_flight=1000, batch_size=100, batch_timeout_ms=1.0,
                                         key_order="record", epochs="strict", checkpoint="drain")
    given = AsyncStateSettings.from_config({"max_in_flight": 8, "key_order": "first_state_access",
                                            "epochs": "out-of-order", "checkpoint": "capture",
                                            "batch_timeout_ms": 5})
    config = given.controller_config(64)
    assert (config.max_in_flight, config.key_order, config.epoch_mode, config.batch_timeout_s,
            config.max_parallelism) == (8, KeyOrder.FIRST_STATE_ACCESS, EpochMode.OUT_OF_ORDER, 0.005, 64)


@pytest.mark.parametrize("bad, message", [({"checkpoint": "flush"}, "drain or capture"),
                                          ({"epochs": "loose"}, "strict | out-of-order"),
                                          ({"max_in_flight": 0}, "bad async state settings"),
                                          ({"in_flight": 3}, "unknown async_state settings")])
def test_bad_settings_are_refused_with_the_choices(bad: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        AsyncStateSettings.from_config(bad)


# -- running records -----------------------------------------------------------------------------------------


async def test_per_key_counts_come_out_in_order_through_the_chain() -> None:
    h = Harness(MemoryBackend(ALL), max_in_flight=4, batch_size=8)
    await h.open()
    inputs = [(f"k{i % 3}", i) for i in range(30)]
    await h.feed(inputs[:10])
    await h.feed(inputs[10:])
    await h.finish()
    assert sorted(h.log) == sorted((f"k{k}", n) for k in range(3) for n in range(1, 11))
    for k in range(3):
        assert [n for key, n in h.log if key == f"k{k}"] == list(range(1, 11))
    assert h.failures == []


async def test_input_waits_at_max_in_flight_and_the_task_is_woken_as_records_finish() -> None:
    h = Harness(LatencyBackend(MemoryBackend(ALL), round_trip_s=0.01), max_in_flight=3)
    await h.open()
    assert await h.feed([(f"k{i}", i) for i in range(10)]) == (3, True)  # the rest waits in the admission queue
    await h.finish()
    assert sorted(h.log) == sorted((f"k{i}", 1) for i in range(10))
    assert h.wakes > 0


async def test_nothing_is_admitted_before_open_has_run() -> None:
    h = Harness(MemoryBackend(ALL))
    assert await h.feed([("a", 1)]) == (0, True)
    await h.open()
    await h.finish()
    assert h.log == [("a", 1)]


async def test_a_handle_made_in_open_refuses_use_outside_a_record() -> None:
    function = Count()
    h = Harness(MemoryBackend(ALL), function=function)
    await h.open()
    with pytest.raises(AsyncStateUsageError, match="outside process"):
        await h.run(function.count.value())
    await h.finish()


async def test_a_failing_record_fails_the_task_once() -> None:
    h = Harness(MemoryBackend(ALL), function=FailsOn())
    await h.open()
    await h.feed([("a", 1), ("b", "bad"), ("c", 2)])
    await wait_until(lambda: h.failures)
    assert [str(e) for e in h.failures] == ["bad record"]
    with pytest.raises(ValueError, match="bad record"):
        h.op.raise_if_failed()
    await h.aclose()


class ExitsOn(Count):
    async def process(self, record: Any, ctx: AsyncKeyedContext) -> None:
        if record[1] == "exit":
            sys.exit(4)
        await super().process(record, ctx)


async def test_sys_exit_in_process_fails_the_task_with_the_function_named() -> None:
    """A SystemExit leaving the record's asyncio task ended the loop it ran on (the worker's, inline)."""
    h = Harness(MemoryBackend(ALL), function=ExitsOn())
    await h.open()
    await h.feed([("a", 1), ("b", "exit"), ("c", 2)])
    await wait_until(lambda: h.failures)
    assert len(h.failures) == 1 and isinstance(h.failures[0], UserCodeExit)
    assert "sys.exit(4)" in str(h.failures[0]) and "ExitsOn.process" in str(h.failures[0]), str(h.failures[0])
    assert await h.call(lambda: "the loop runs on") == "the loop runs on"
    await h.aclose()


class CancelledOn(Count):
    async def process(self, record: Any, ctx: AsyncKeyedContext) -> None:
        if record[1] == "cancelled":
            cancelled: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            cancelled.cancel()  # a client's future, cancelled under the function
            await cancelled
        await super().process(record, ctx)


async def test_a_record_cancelled_by_its_own_code_fails_the_task() -> None:
    """The record's asyncio task ended cancelled and the record stayed in flight for ever, failing nothing: a
    drain checkpoint and the end of input waited for it."""
    h = Harness(MemoryBackend(ALL), function=CancelledOn())
    await h.open()
    await h.feed([("a", 1), ("b", "cancelled"), ("c", 2)])
    await wait_until(lambda: h.failures)
    assert len(h.failures) == 1 and "cancelled by its own code" in str(h.failures[0])
    assert isinstance(h.failures[0].__cause__, asyncio.CancelledError)
    with pytest.raises(RuntimeError, match="cancelled by its own code"):
        h.op.raise_if_failed()
    await h.aclose()


class Held(AsyncKeyedProcessFunction):
    """Its first record waits for `release`; every record started is listed."""

    def __init__(self) -> None:
        self.started: list[Any] = []
        self.release: asyncio.Event | None = None

    async def process(self, record: Any, ctx: AsyncKeyedContext) -> None:
        self.started.append(record)
        if record[1] == "held":
            self.release = asyncio.Event()
            await self.release.wait()
        ctx.emit(record)


async def test_no_record_starts_once_aclose_began() -> None:
    """A record finishing just before aclose posts the admission of the next; run after aclose had taken the
    records to cancel, it started records that ran on while the task closed its chain and its state backend
    on another thread."""
    function = Held()
    h = Harness(MemoryBackend(ALL), function=function, max_in_flight=1)
    await h.open()
    assert await h.feed([("a", "held"), ("b", 1), ("c", 2)]) == (1, True)
    await wait_until(lambda: function.release is not None)

    async def release_then_close() -> list[Any]:
        assert function.release is not None
        function.release.set()
        await asyncio.sleep(0)  # "a" finishes: the admission of "b" is posted
        await h.op.aclose()
        for _ in range(20):  # what was posted runs
            await asyncio.sleep(0)
        return list(function.started)

    assert await h.run(release_then_close()) == [("a", "held")]


async def test_an_operator_fed_on_a_loop_it_is_not_bound_to_refuses_the_run() -> None:
    """A task that skipped `run_on` fed it on its own loop while its records started on the worker's: the tests
    passed all the same."""
    h = Harness(MemoryBackend(ALL))
    await h.open()
    other = UserLoop("test unbound loop")
    try:
        with pytest.raises(RuntimeError, match="not bound to"):
            await other.call(h.op.feed, [("a", 1)])
        with pytest.raises(RuntimeError, match="not bound to"):
            await other.call(h.op.feed_watermark, 5)
    finally:
        assert await other.stop(10.0)
    await h.feed([("a", 1)])  # where it is bound, it is fed
    await h.finish()
    assert h.log == [("a", 1)]


@pytest.mark.parametrize("epochs", ["strict", "out-of-order"])
async def test_a_watermark_is_forwarded_after_the_outputs_of_every_record_before_it(epochs: str) -> None:
    h = Harness(LatencyBackend(MemoryBackend(ALL), round_trip_s=0.002), epochs=epochs, batch_size=2)
    await h.open()
    await h.feed([(f"k{i}", i) for i in range(6)])
    await h.feed_watermark(100)
    await h.feed([(f"k{i}", i) for i in range(6, 9)])
    await h.finish()
    wm = h.log.index(("wm", 100))
    assert sorted(h.log[:wm]) == sorted((f"k{i}", 1) for i in range(6)) if epochs == "strict" else \
        {(f"k{i}", 1) for i in range(6)} <= set(h.log[:wm])
    assert len(h.log) == 10


# -- checkpoints ---------------------------------------------------------------------------------------------


async def test_capture_stores_records_in_flight_then_queued_and_a_restore_replays_them_first(tmp_path: Any) -> None:
    # slow enough that no record finishes between the run that feeds them and the snapshot's park
    slow = LatencyBackend(MemoryBackend(ALL), round_trip_s=0.2)
    h = Harness(slow, max_in_flight=2, checkpoint="capture")
    await h.open()
    assert await h.feed([("a", 1), ("b", 2), ("c", 3), ("a", 4), ("d", 5)]) == (2, True)
    pending, doc = await h.snapshot(7)
    handle = pending.upload(SnapshotStore(str(tmp_path)))
    # whole-record order: the two running records, then the queued ones in arrival order
    assert doc["replay"] == [["r", "a", ("a", 1)], ["r", "b", ("b", 2)], ["r", "c", ("c", 3)],
                             ["r", "a", ("a", 4)], ["r", "d", ("d", 5)]]
    assert h.op.last_captured_records == 5
    await h.aclose()  # the worker dies: nothing after the snapshot counts

    restored = MemoryBackend(ALL)
    restored.restore(SnapshotStore(str(tmp_path)), [handle])
    h2 = Harness(restored, checkpoint="capture")
    h2.op.restore([doc])
    await h2.feed([("a", 6), ("e", 7)])  # restored channel state and new input come after the replay
    await h2.open()
    await h2.finish()
    assert [n for key, n in h2.log if key == "a"] == [1, 2, 3]
    assert sorted(h2.log) == sorted([("a", 1), ("a", 2), ("a", 3), ("b", 1), ("c", 1), ("d", 1), ("e", 1)])


def test_an_inflight_document_restores_pending_writes_and_replay_inside_the_new_key_groups() -> None:
    keys = [f"k{i}" for i in range(40)]
    snapshot = TakeSnapshot(1, replay=(*(Record(k, (k, 1)) for k in keys[:20]), Watermark(50)),
                            puts=tuple(("3/count", key_group(k, 128), k, 9) for k in keys[20:]), deletes=())
    checkpoint = decode_inflight(inflight_document(snapshot, [Record("k39", ("k39", 2))]), "test")
    for groups in (range(0, 64), range(64, 128)):  # the job rescaled to two subtasks
        backend = MemoryBackend(groups)
        replay = restore_inflight(backend, [checkpoint], max_parallelism=128)
        mine = [k for k in keys if key_group(k, 128) in groups]
        # in order: its records before the watermark, the watermark (every subtask gets it), then the queued one
        assert replay == [*(Record(k, [k, 1]) for k in keys[:20] if k in mine), Watermark(50),
                          *([Record("k39", ["k39", 2])] if "k39" in mine else [])]
        assert sorted((n, k, v) for n, _, k, v in backend.scan(groups)) == \
            sorted(("3/count", k, 9) for k in keys[20:] if k in mine)


def test_it_runs_on_uvloop_as_in_a_worker() -> None:
    """Workers run uvloop (netstack/transport.py), whose call_at() of a deadline less than half a millisecond
    away returns a plain handle without when(): the runner re-arms its batch deadline timer without asking it."""
    uvloop = pytest.importorskip("uvloop")

    async def count() -> list[Any]:
        h = Harness(LatencyBackend(MemoryBackend(ALL), round_trip_s=0.001), max_in_flight=16, batch_size=1000,
                    batch_timeout_ms=0.3)  # uvloop runs a deadline this close with call_soon
        await h.open()
        for i in range(0, 200, 10):  # partial batches: the deadline timer is armed and re-armed
            await h.feed([(f"k{j % 7}", j) for j in range(i, i + 10)])
            await wait_until(lambda: h.op.quiet() or h.failures)
            assert h.failures == []
        await h.finish()
        return h.log

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        log = runner.run(count())
    assert sorted(log) == sorted((f"k{k}", n) for k in range(7) for n in range(1, 1 + len(range(k, 200, 7))))


# -- event-time timers ---------------------------------------------------------------------------------------


class Windows(AsyncKeyedProcessFunction):
    """Counts a key's records and reports the count at each record's timer (its third field)."""

    def open(self, ctx: Any) -> None:
        self.count = ctx.value_state("count", 0)

    async def process(self, record: Any, ctx: AsyncKeyedContext) -> None:
        await self.count.update((await self.count.value()) + 1)
        ctx.register_event_time_timer(record[2])

    async def on_timer(self, timestamp: int, payload: Any, ctx: AsyncKeyedContext) -> None:
        ctx.emit((ctx.key, timestamp, await self.count.value()))


class StuckTimers(Windows):
    """Its timers wait for ever: a snapshot finds them running, however late it comes."""

    async def on_timer(self, timestamp: int, payload: Any, ctx: AsyncKeyedContext) -> None:
        await asyncio.Event().wait()


async def test_timers_fire_before_their_watermark_goes_on() -> None:
    h = Harness(LatencyBackend(MemoryBackend(ALL), round_trip_s=0.001), function=Windows())
    await h.open()
    await h.feed([("a", 1, 10), ("b", 2, 10), ("a", 3, 20)])
    await h.feed_watermark(15)
    await h.feed([("a", 4, 20)])
    await h.feed_watermark(25)
    await h.finish()
    assert h.log[:3] in ([("a", 10, 2), ("b", 10, 1), ("wm", 15)], [("b", 10, 1), ("a", 10, 2), ("wm", 15)])
    assert h.log[3:] == [("a", 20, 3), ("wm", 25)]  # strict epochs: record 4 ran after the first watermark
    assert len(h.op.timers) == 0


async def test_a_capture_snapshot_taken_while_timers_run_fires_them_again_after_a_restore(tmp_path: Any) -> None:
    h = Harness(MemoryBackend(ALL), function=StuckTimers(), checkpoint="capture")
    await h.open()
    await h.feed([("a", 1, 10), ("b", 2, 10), ("c", 3, 30)])
    await wait_until(h.op.quiet)
    assert await h.feed_watermark(15) == (2, False)  # the timers of a and b start, and wait
    pending, doc = await h.snapshot(4)
    handle = pending.upload(SnapshotStore(str(tmp_path)))
    assert doc["replay"] == [["w", 15]]  # timers are not replayed: their watermark is
    assert sorted(doc["timers"]) == [[10, "a"], [10, "b"], [30, "c"]]
    await h.aclose()

    restored = MemoryBackend(ALL)
    restored.restore(SnapshotStore(str(tmp_path)), [handle])
    h2 = Harness(restored, function=Windows(), checkpoint="capture")
    h2.op.restore([doc])
    await h2.open()
    await h2.feed_watermark(40)
    await h2.finish()
    assert sorted(h2.log[:2]) == [("a", 10, 1), ("b", 10, 1)]
    assert h2.log[2:] == [("wm", 15), ("c", 30, 1), ("wm", 40)]
