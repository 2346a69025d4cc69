"""The async_map operator (runtime/execution/async_io.py) on a real event loop, without a cluster: the capacity
bound as admission backpressure, ordered output under random latencies, timeouts and retries by the policy, a
call failing for good, and a snapshot taken mid-flight whose replay (also rescaled) gives every result once."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest

from runtime.api import GeneratorSource, Job, RetryPolicy
from runtime.api.async_io import AsyncMap
from runtime.checkpointing.rescaling import rescale_async_io
from runtime.execution.async_io import AsyncIOFailed, AsyncIOOperator
from runtime.graph.partitioning import key_group, key_group_range
from tests.support.loopback import wait_until
from tests.support.user_loops import OperatorHarness, where_the_chain_runs  # noqa: F401 (autouse)


class Harness(OperatorHarness):
    def __init__(self, fn: Any, *, capacity: int = 4, ordered: bool = True, timeout_s: float | None = 1.0,
                 retry: RetryPolicy | None = None, key_fn: Any = None, subtask: int = 0,
                 parallelism: int = 1, timed: bool = False) -> None:
        self.out: list[Any] = []
        self.failures: list[BaseException] = []
        self.op = AsyncIOOperator(AsyncMap(fn, capacity, timeout_s, ordered, retry or RetryPolicy(max_attempts=1)),
                                  node_id=2, name="enrich", key_fn=key_fn, subtask_index=subtask,
                                  parallelism=parallelism, max_parallelism=128, timed=timed, emit=self.out.extend,
                                  forward_watermark=lambda ts: self.out.append(("wm", ts)))
        self.op.bind(wake=lambda: None, on_failure=self.failures.append)
        self.place()

    async def feed_all(self, records: list[Any], chunk: int = 3) -> None:
        """What the task does: hand over a chunk, then wait (here: poll) until the operator admitted it."""
        for i in range(0, len(records), chunk):
            await self.feed(records[i:i + chunk])
            await wait_until(lambda: not self.op.backlog)

    async def finish(self) -> None:
        async with asyncio.timeout(10):
            await self.run(self.op.finish())


async def test_ordered_output_under_random_latency_within_capacity() -> None:
    rng = random.Random(5)
    running, peak = 0, 0

    async def slow_double(x: int) -> int:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(rng.random() * 0.01)
        running -= 1
        return 2 * x

    h = Harness(slow_double, capacity=5)
    assert await h.feed(list(range(20))) == (5, True)  # the rest waits: the task takes no more input meanwhile
    await wait_until(lambda: not h.op.backlog)
    await h.feed_all(list(range(20, 60)))
    await h.finish()
    assert h.out == [2 * x for x in range(60)] and peak == 5
    assert h.op.stats.completed == 60 and sum(h.op.stats.latency_buckets) == 60


async def test_unordered_keeps_watermarks_between_their_records() -> None:
    async def fn(x: int) -> int:
        await asyncio.sleep(0.02 if x == 0 else 0)
        return x

    h = Harness(fn, capacity=8, ordered=False)
    await h.feed([0, 1])
    await h.feed_watermark(10)
    await h.feed([2, 3])
    await h.finish()
    assert h.out[:2] == [1, 0] and h.out[2] == ("wm", 10) and sorted(h.out[3:]) == [2, 3]


async def test_with_event_time_results_keep_their_timestamps_and_watermarks_their_place() -> None:
    async def fn(x: int) -> int:
        await asyncio.sleep(0.01 * (x % 2))
        return -x

    h = Harness(fn, capacity=8, timed=True)
    await h.feed([(100, 1), (101, 2)])
    await h.feed_watermark(101)
    await h.feed([(105, 3)])
    await h.finish()
    assert h.out == [(100, -1), (101, -2), ("wm", 101), (105, -3)]


async def test_timeouts_are_retried_with_backoff_then_succeed() -> None:
    attempts: list[float] = []

    async def flaky(x: int) -> int:
        attempts.append(asyncio.get_running_loop().time())
        if len(attempts) <= 2:
            await asyncio.sleep(1)  # over the timeout
        return x

    retry = RetryPolicy(max_attempts=4, initial_backoff_s=0.02, multiplier=2)
    h = Harness(flaky, timeout_s=0.2, retry=retry)
    await h.feed([7])
    await h.finish()
    assert h.out == [7] and h.failures == []
    stats = h.op.stats
    assert (stats.timed_out, stats.retried, stats.completed) == (2, 2, 1)
    gaps = [b - a for a, b in zip(attempts, attempts[1:], strict=False)]
    assert gaps[0] >= 0.2 + 0.02 - 0.005 and gaps[1] >= 0.2 + 0.04 - 0.005  # timeout, then the backoff


async def test_a_call_failing_for_good_fails_the_task() -> None:
    async def broken(x: int) -> int:
        raise ConnectionError("service down")

    h = Harness(broken, retry=RetryPolicy(max_attempts=2, initial_backoff_s=0.001))
    await h.feed([1, 2])
    with pytest.raises(AsyncIOFailed, match="after 2 attempt"):
        await h.finish()
    assert len(h.failures) == 1 and isinstance(h.failures[0].__cause__, ConnectionError)
    await h.aclose()


@pytest.mark.parametrize("asynchronous", [False, True])
async def test_the_function_is_closed_once_when_the_task_ends(asynchronous: bool) -> None:
    class Client:
        """A function holding a client: `close` (plain or async) runs after its last call, once."""

        def __init__(self) -> None:
            self.calls = 0
            self.closed: list[int] = []  # how many calls had run when it was closed

        async def __call__(self, x: int) -> int:
            self.calls += 1
            return x

        def close_now(self) -> None:
            self.closed.append(self.calls)

    fn = Client()
    if asynchronous:
        async def close() -> None:
            await asyncio.sleep(0)
            fn.close_now()
    else:
        close = fn.close_now
    fn.close = close  # type: ignore[attr-defined]
    h = Harness(fn)
    await h.feed_all([1, 2, 3])
    await h.finish()
    assert fn.closed == [] and h.out == [1, 2, 3]  # finishing the input does not close it: the task does
    await h.aclose()
    await h.aclose()  # a second close (the task's finally after a failure path) does nothing more
    assert fn.closed == [3]


async def test_no_call_starts_once_aclose_began() -> None:
    """A call finishing just before aclose posts the hand-on that admits the next records; run after aclose had
    taken the calls to cancel, it started calls that ran on after the function's close(). Nothing is handed on
    either once aclose began: what was posted may run after it returned, beside the chain's close on the task's
    closing thread."""
    started: list[Any] = []
    release: list[asyncio.Event] = []

    async def held_first(x: Any) -> Any:
        started.append(x)
        if x == "held":
            release.append(asyncio.Event())
            await release[0].wait()
        return x

    h = Harness(held_first, capacity=1)
    assert await h.feed(["held", 1, 2]) == (1, True)
    await wait_until(lambda: bool(release))

    async def release_then_close() -> list[Any]:
        release[0].set()
        await asyncio.sleep(0)  # "held" finishes: the hand-on that admits 1 is posted
        await h.op.aclose()
        for _ in range(20):  # what was posted runs
            await asyncio.sleep(0)
        return list(started)

    assert await h.run(release_then_close()) == ["held"]
    assert h.out == []


async def test_a_snapshot_mid_flight_replays_to_exactly_once() -> None:
    release = asyncio.Event()

    async def gated(x: int) -> int:
        if x % 3 == 0:
            await release.wait()
        return x * 10

    h = Harness(gated, capacity=4, ordered=False)
    await h.feed(list(range(6)))  # 0 and 3 hang; the rest finish; 4 and 5 may still wait for room
    await wait_until(lambda: len(h.out) >= 2)
    _, doc = await h.snapshot(1)
    emitted = list(h.out)
    kept = [e[2] for e in doc["replay"] if e[0] == "r"]
    assert sorted([x // 10 for x in emitted] + kept) == list(range(6))
    await h.aclose()  # the task dies here; a new one restores the document
    release.set()
    again = Harness(gated, capacity=4, ordered=False)
    again.op.restore([doc])
    await again.open()
    await again.finish()
    assert sorted(emitted + again.out) == [x * 10 for x in range(6)]


async def test_keyed_replay_follows_the_key_groups_and_round_robin_deals_the_rest() -> None:
    async def ident(x: Any) -> Any:
        await asyncio.sleep(1)
        return x

    records = [[f"k{i}", i] for i in range(40)]
    h = Harness(ident, capacity=30, key_fn=lambda r: r[0])
    assert await h.feed(records) == (30, True)  # the snapshot takes the calls in flight and the 10 waiting
    _, doc = await h.snapshot(1)
    await h.aclose()
    restored: list[Any] = []
    for subtask in range(3):  # rescaled 1 -> 3: each new subtask keeps the records of its key groups
        new = Harness(ident, key_fn=lambda r: r[0], subtask=subtask, parallelism=3)
        new.op.restore([doc])
        mine = list(new.op._admission)
        groups = key_group_range(128, 3, subtask)
        assert all(key_group(r[0], 128) in groups for r in mine)
        restored += mine
    assert sorted(restored) == sorted(records)
    # the non-keyed variant: every old subtask's records dealt round robin, none lost or doubled
    docs = [{"replay": [["r", None, i] for i in range(n, n + 5)]} for n in (0, 5)]
    shares = [rescale_async_io(docs, 3, s) for s in range(3)]
    assert sorted(e[2] for s in shares if s for e in s["replay"]) == list(range(10))


def test_async_map_needs_an_async_function_and_sane_settings() -> None:
    job = Job("j")
    stream = job.source(GeneratorSource(count=1))
    with pytest.raises(TypeError, match="async def"):
        stream.async_map(lambda r: r)

    async def fn(r: Any) -> Any:
        return r

    with pytest.raises(ValueError, match="capacity"):
        stream.async_map(fn, capacity=0)
    keyed = stream.key_by(lambda r: r[0]).async_map(fn)
    assert job.nodes[keyed.node_id].key_fn is not None and job.nodes[stream.async_map(fn).node_id].key_fn is None
    assert RetryPolicy(initial_backoff_s=0.1, multiplier=3, max_backoff_s=0.5).backoff_s(3) == 0.5
    with pytest.raises(ValueError):
        RetryPolicy(max_attempts=0)
