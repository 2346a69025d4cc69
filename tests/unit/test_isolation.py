"""Task isolation's pure parts: the policy that picks inline or the task's thread, the thread hand-off, and the
subpartition's deferred buffers (runtime/execution/isolation.py, runtime/execution/channels.py)."""

from __future__ import annotations

import asyncio
import threading
import time

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from netstack.credit import ChannelSender, Event
from runtime.api import DiscardSink, GeneratorSource, Job, Sink
from runtime.execution.channels import OutputGate, Subpartition, split_records
from runtime.execution.handover import held_the_gil
from runtime.execution.isolation import HandOff, IsolationPolicy, IsolationSettings, TaskThread, mode_from_env
from runtime.execution.operators import Chain
from runtime.execution.task import Credits, Task, TaskCancelled, TaskKey
from runtime.execution.user_loop import UserLoop
from tests.support.loop_lag import LoopLag


def test_modes() -> None:
    def policy(mode: str, *, asynchronous: bool) -> IsolationPolicy:
        return IsolationPolicy(IsolationSettings(mode), asynchronous=asynchronous)

    assert policy("thread", asynchronous=False).isolated
    assert policy("auto", asynchronous=False).isolated  # the old default's name: the same as thread
    assert not policy("inline", asynchronous=False).isolated
    # an asynchronous operator: the task's own loop instead of its thread (inline: the worker's loop)
    assert not policy("thread", asynchronous=True).isolated
    assert policy("thread", asynchronous=True).user_loop
    assert not policy("inline", asynchronous=True).user_loop
    with pytest.raises(ValueError):
        IsolationSettings("threads")
    assert mode_from_env({}) == "thread"
    assert mode_from_env({"SLUICE_TASK_ISOLATION": " Inline "}) == "inline"
    with pytest.raises(ValueError):
        mode_from_env({"SLUICE_TASK_ISOLATION": "sometimes"})


def test_a_throttled_sink_declares_itself_blocking() -> None:
    assert DiscardSink(delay_per_record_s=0.001).blocking
    assert not DiscardSink().blocking


def test_task_thread_runs_calls_off_the_loop_in_order_and_returns_errors() -> None:
    async def main() -> None:
        thread = TaskThread("test")
        seen: list[tuple[int, str]] = []

        def work(i: int) -> int:
            seen.append((i, threading.current_thread().name))
            return i * 2

        assert [await thread.call(work, i) for i in range(5)] == [0, 2, 4, 6, 8]
        assert [i for i, _ in seen] == list(range(5)) and {name for _, name in seen} == {"test"}

        def fail() -> None:
            raise KeyError("boom")

        with pytest.raises(KeyError):
            await thread.call(fail)
        assert await thread.call(work, 7) == 14  # a failed call does not end the thread
        assert await thread.stop(timeout_s=5)

    asyncio.run(main())


def test_a_call_holds_the_gil_when_its_thread_ran_most_of_its_wall_time() -> None:
    assert held_the_gil(0.002, 0.0019) and held_the_gil(0.002, 0.0014)
    assert not held_the_gil(0.002, 0.0013) and not held_the_gil(0.05, 0.0001)  # a sleep, I/O, a lock
    assert held_the_gil(0.0001, 0.0)  # too short to tell: waited for


def test_calls_that_hold_the_gil_are_waited_for_blocked_and_calls_that_wait_are_awaited() -> None:
    """A run of records holds the GIL its whole time: the loop could not run meanwhile, so it takes the result
    straight from the thread (no future, no loop wake-up). A call that waits (a sleep, I/O) releases the GIL:
    its successor is awaited so the loop and other tasks run beside it."""

    async def main() -> None:
        thread = TaskThread("modes")
        thread.sync_wait_s = 30.0  # no timing in this test: every blocked wait gets its call
        assert await thread.call(divmod, 7, 2) == (3, 1)  # the first call is waited for blocked
        assert thread.waited_blocked == 1
        with pytest.raises(ZeroDivisionError):  # an error comes back the same way
            await thread.call(divmod, 1, 0)
        thread.held_gil = True
        await thread.call(time.sleep, 0.05)  # waited for blocked, and releases the GIL
        assert not thread.held_gil and thread.waited_blocked == 3
        assert await thread.call(divmod, 9, 4) == (2, 1)  # awaited: the previous call released the GIL
        assert thread.waited_blocked == 3
        assert await thread.stop(timeout_s=5)

    asyncio.run(main())


def test_a_deferred_user_call_is_awaited_and_decides_nothing_for_the_next_run() -> None:
    """A user call a task's mail deferred (a sink's commit, `run=False`) is no run: awaited, and how it used the
    GIL leaves the next run's wait alone, as on a parked task loop (runtime/execution/handover.py). Before, a
    commit that waited on its broker made the next run of records an awaited one."""

    async def main() -> None:
        thread = TaskThread("deferred")
        thread.sync_wait_s = 30.0  # no timing in this test: every blocked wait gets its call
        assert await thread.call(divmod, 7, 2) == (3, 1)
        assert thread.held_gil and thread.waited_blocked == 1
        await thread.call(time.sleep, 0.05, run=False)  # awaited, though the last run held the GIL
        assert thread.held_gil and thread.waited_blocked == 1
        assert await thread.call(divmod, 9, 4) == (2, 1)  # waited for blocked: the sleep was no run
        assert thread.waited_blocked == 2 and thread.calls == 3
        assert await thread.stop(timeout_s=5)

    asyncio.run(main())


def test_a_call_that_spins_past_the_blocked_wait_lets_the_loop_run() -> None:
    """A CPU-bound call longer than SYNC_WAIT_S: the loop stops waiting for it and gets the GIL at the switch
    interval meanwhile, so its timers still run; the result arrives through the loop."""

    def spin(seconds: float) -> str:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            pass
        return "spun"

    async def main() -> None:
        thread = TaskThread("spinner")
        async with LoopLag(0.001) as watch:
            await asyncio.sleep(0)
            assert await thread.call(spin, 0.3) == "spun"
        assert thread.waited_blocked == 0
        assert watch.ticks >= 3, watch.ticks  # ~1 per 5 ms switch interval; blocked: 1
        assert await thread.stop(timeout_s=5)

    asyncio.run(main())


def test_the_loop_keeps_running_while_a_call_blocks() -> None:
    async def main() -> None:
        thread = TaskThread("blocker")
        async with LoopLag(0.001) as watch:
            await thread.call(time.sleep, 0.2)
        assert watch.ticks >= 20, watch.ticks  # about 200 when nothing else runs; inline it would be 1
        assert await thread.stop(timeout_s=5)

    asyncio.run(main())


def test_stop_waits_for_a_call_its_caller_abandoned() -> None:
    async def main() -> None:
        thread = TaskThread("abandoned")
        finished = threading.Event()

        def slow() -> None:
            time.sleep(0.1)
            finished.set()

        call = asyncio.create_task(thread.call(slow))
        await asyncio.sleep(0.01)
        call.cancel()  # the task was cancelled while its chain ran
        assert await thread.stop(timeout_s=5)
        assert finished.is_set()

    asyncio.run(main())


class Link:
    def __init__(self) -> None:
        self.woken = 0

    def wake(self, sender: ChannelSender) -> None:
        self.woken += 1


@given(st.lists(st.binary(min_size=0, max_size=90), max_size=60), st.integers(min_value=1, max_value=7))
def test_deferred_buffers_are_the_same_buffers_queued_later(records: list[bytes], defer_every: int) -> None:
    """Writing with the cut buffers deferred, handed over at times, queues exactly what writing directly does:
    same buffers, same record starts, same order; nothing reaches the sender or the link while deferred."""
    packed = [msgpack.packb(r) for r in records]

    def write(deferring: bool) -> tuple[list[tuple[bytes, int, bytes | None]], Subpartition]:
        sub = Subpartition(ChannelSender(1), limit=1000, capacity=64)
        link = Link()
        sub.link = link
        pending: list[tuple[Subpartition, object]] = []
        for i, data in enumerate(packed):
            if deferring and i % defer_every == 0:
                sub.deferred = pending  # type: ignore[assignment]
            queued, woken = sub.sender.queued_buffers, link.woken
            sub.append(data)
            if sub.deferred is not None:
                assert (sub.sender.queued_buffers, link.woken) == (queued, woken)
            if deferring and i % defer_every == defer_every - 1:
                sub.deferred = None
                for s, buffer in pending:
                    s.hand_over(buffer)  # type: ignore[arg-type]
                pending.clear()
        sub.deferred = None
        for s, buffer in pending:
            s.hand_over(buffer)  # type: ignore[arg-type]
        sub.flush()
        out = []
        while (item := sub.sender.pop_sendable()) is not None or sub.sender.queued_buffers:
            if item is None:
                sub.sender.add_credit(100)
                continue
            buffer = item.buffer  # type: ignore[union-attr]
            out.append((buffer.data, buffer.first_record_offset, buffer.continued_record))
        return out, sub

    direct, d = write(False)
    deferred, s = write(True)
    assert deferred == direct
    assert (s.bytes_out, s.buffers_out) == (d.bytes_out, d.buffers_out)
    assert split_records(b"".join(data for data, _, _ in deferred)) == packed


# -- real tasks on one event loop, in this process ---------------------------------------------------------

class SleepingSink(Sink):
    """A blocking client that does not say so: 1 ms a record."""

    def write(self, record: object) -> None:
        time.sleep(0.001)


def _task(job: Job, node_ids: list[int], mode: str) -> Task:
    chain = Chain(job, node_ids, subtask_index=0, parallelism=1, attempt=0, outputs=[])
    name = job.nodes[node_ids[0]].name
    return Task(key=TaskKey("job", node_ids[0], 0, name, 1), chain=chain, outputs=[], output_gate=OutputGate(),
                inputs=[], credits=Credits(2, 8), source=job.nodes[node_ids[0]].payload, flush_timeout_s=0.05,
                isolation=IsolationSettings(mode))


async def _fast_next_to(slow_sink: Sink, mode: str) -> tuple[float, Task]:
    """A fast source -> map -> discard task runs to its end beside an unbounded source -> `slow_sink` task;
    the longest the event loop was late for a 5 ms timer meanwhile, and the slow task."""
    job = Job()
    job.source(GeneratorSource(count=300_000, keys=100, seed=1), name="fast").map(lambda r: r).sink(DiscardSink())
    job.source(GeneratorSource(count=None, keys=10, seed=2), name="slow").sink(slow_sink)
    fast, slow = _task(job, [0, 1, 2], mode), _task(job, [3, 4], mode)
    slow_run = asyncio.create_task(slow.run())
    async with LoopLag() as watch:
        await fast.run()
    slow.cancel()
    with pytest.raises((TaskCancelled, asyncio.CancelledError)):
        await slow_run
    return watch.lag, slow


@pytest.mark.parametrize("sink", ["undeclared", "declared"])
def test_a_blocking_sink_does_not_hold_up_the_loop(sink: str) -> None:
    """Inline, the sleeping sink held the loop for a whole source batch (512 records, half a second); on
    its thread, from its first record on, the loop is late only by what the machine's scheduler adds."""
    slow_sink = SleepingSink() if sink == "undeclared" else DiscardSink(delay_per_record_s=0.001)
    lag, slow = asyncio.run(_fast_next_to(slow_sink, "thread"))
    assert slow.isolation.isolated
    assert slow.records_in > 0
    # inline, the loop is held ~0.5 s per batch; on a loaded machine the scheduler alone can add a few 100 ms
    assert lag < 0.35, f"the event loop was {lag * 1000:.0f} ms late"


def test_a_task_loop_hands_over_what_it_cuts_in_order_on_the_home_loop() -> None:
    """HandOff: buffers a task's own loop cuts from another thread are queued on the home loop, in cut order,
    one posted hand-over for those cut before it runs; `handed_n` counts them for the would-block estimate."""

    async def main() -> None:
        home = asyncio.get_running_loop()
        sub = Subpartition(ChannelSender(1), limit=1000, capacity=64)
        hand_off = HandOff(home)
        delivered = 0
        all_in = asyncio.Event()

        def counted() -> None:
            nonlocal delivered
            delivered += 1
            if sub.handed_n == sum(map(len, packed)) // 64:  # every buffer the records filled
                all_in.set()

        hand_off.on_delivered = counted
        sub.deferred = hand_off
        packed = [msgpack.packb(bytes([i]) * 70) for i in range(40)]
        thread_ident: list[int] = []

        def cut_on_another_thread() -> None:
            thread_ident.append(threading.get_ident())
            for data in packed:
                sub.append(data)

        await asyncio.to_thread(cut_on_another_thread)
        await asyncio.wait_for(all_in.wait(), 10)
        assert thread_ident[0] != threading.get_ident()
        assert sub.handed_n == sub.deferred_n == sub.sender.queued_buffers > 0
        assert 1 <= delivered <= sub.deferred_n and not hand_off
        sub.deferred = None
        sub.flush()
        out = []
        sub.sender.add_credit(1000)
        while (item := sub.sender.pop_sendable()) is not None:
            out.append(item.buffer.data)  # type: ignore[union-attr]
        assert split_records(b"".join(out)) == packed

    asyncio.run(main())


def _async_task(mode: str) -> Task:
    """source -> a map that blocks 0.6 s on one record -> async_map -> discard, in one task."""

    def blocks_once(record: tuple[int, int]) -> int:
        if record[1] == 50:
            time.sleep(0.6)  # a synchronous client, chained in the same task as an asynchronous operator
        return record[1]

    async def passed_on(value: int) -> int:
        return value

    job = Job()
    (job.source(GeneratorSource(count=2000, keys=10, seed=1)).map(blocks_once).async_map(passed_on, timeout_s=30)
        .sink(DiscardSink()))
    return _task(job, [0, 1, 2, 3], mode)


async def _lag_beside(task: Task) -> tuple[float, float]:
    """The longest the event loop was late for a 5 ms timer while `task` ran to its end, and how long it ran."""
    async with LoopLag() as watch:
        await asyncio.sleep(0.01)  # ticking before the task's first run
        started = time.monotonic()
        await task.run()
        took = time.monotonic() - started
    return watch.lag, took


def test_a_blocking_map_chained_with_an_async_map_does_not_hold_up_the_loop() -> None:
    """A task with an asynchronous operator runs its whole chain on its own loop: the map's 0.6 s call delays
    only that task (inline, the event loop waited for it)."""
    task = _async_task("thread")
    lag, took = asyncio.run(_lag_beside(task))
    assert task.isolation.user_loop and task.records_in == 2000 and task.chain.records_out == 2000
    assert took >= 0.6  # it did block
    assert lag < 0.35, f"the event loop was {lag * 1000:.0f} ms late"
    inline = _async_task("inline")
    lag, _ = asyncio.run(_lag_beside(inline))
    assert lag >= 0.55 and inline.chain.records_out == 2000


def test_buffers_cut_on_the_thread_say_when_they_will_fill_the_queue() -> None:
    """A run on the task's thread stops where an inline one would stop at a blocked output: when the buffers it
    cut (deferred) and those queued reach the subpartition's limit."""
    gate = OutputGate()
    sub = Subpartition(ChannelSender(1), limit=3, capacity=64)
    sub.gate = gate
    sub.append(msgpack.packb(b"x" * 70))  # one cut, queued: 1 of 3
    sub.deferred = []
    sub.append(msgpack.packb(b"y" * 70))  # one cut, deferred: 2 of 3
    assert not gate.would_block and not gate.blocked
    sub.append(msgpack.packb(b"z" * 70))  # 3 of 3 once queued
    assert gate.would_block and not gate.blocked
    assert sub.sender.queued_buffers == 1 and sub.deferred_n == 2


async def _loop_task_with_lost_hand_over(limit: int) -> tuple[Task, Subpartition, UserLoop, HandOff]:
    """A source -> async_map -> discard task with its chain on its own loop and one output subpartition of
    `limit` buffers; the hand-over its loop posts to the worker's loop is lost (its home a closed loop), so only
    what the task itself hands over is queued. On the running loop; stop the user loop after."""

    async def passed_on(value: int) -> int:
        return value

    job = Job()
    job.source(GeneratorSource(count=10, keys=2, seed=1)).async_map(passed_on).sink(DiscardSink())
    chain = Chain(job, [0, 1, 2], subtask_index=0, parallelism=1, attempt=0, outputs=[])
    sub = Subpartition(ChannelSender(1), limit=limit, capacity=64)
    gate = OutputGate()
    sub.gate = gate
    task = Task(key=TaskKey("job", 0, 0, "src", 1), chain=chain, outputs=[sub], output_gate=gate, inputs=[],
                credits=Credits(2, 8), source=job.nodes[0].payload, flush_timeout_s=0.05)
    task._home = asyncio.get_running_loop()
    task._start_user_loop()
    user, hand_off = task._user_loop, task._hand_off
    assert user is not None and hand_off is not None and sub.deferred is hand_off
    never = asyncio.new_event_loop()
    never.close()
    hand_off._home = never  # the hand-over the loop posts is lost: the buffers stay in the list
    return task, sub, user, hand_off


def test_buffers_still_in_the_hand_off_at_a_snapshot_go_before_its_barrier() -> None:
    """A snapshot runs while the task's loop is parked (Task.exclusive): the buffers that loop cut before, still
    in the HandOff list, are queued first, so they precede an aligned barrier and an unaligned one overtakes
    (captures) them. Here the posted hand-over never runs (its home is a closed loop): only the snapshot's own
    hand-over can queue them."""

    async def main() -> None:
        task, sub, user, hand_off = await _loop_task_with_lost_hand_over(1000)
        sub.sender.add_credit(1000)

        def cut(tag: int) -> list[bytes]:  # the chain on its loop: records cut into buffers
            packed = [msgpack.packb(bytes([tag, i]) * 35) for i in range(3)]
            for data in packed:
                sub.append(data)
            return packed

        def sent() -> list[object]:
            out: list[object] = []
            while (item := sub.sender.pop_sendable()) is not None:
                out.append(item.buffer.data if hasattr(item, "buffer") else item.event.body)  # type: ignore[union-attr]
            return out

        try:
            first = await user.call(cut, 1)
            cut_n = len(hand_off)
            assert cut_n == 3 and sub.sender.queued_buffers == 0
            await task.exclusive(sub.add_event, Event({"t": "barrier", "id": 1}))
            out = sent()
            assert out[-1] == {"t": "barrier", "id": 1}  # the partial buffer flushed by add_event goes before it too
            assert split_records(b"".join(out[:-1])) == first  # type: ignore[arg-type]
            assert not hand_off

            await user.call(cut, 2)
            cut_n = len(hand_off)
            assert cut_n == 3 and sub.sender.queued_buffers == 0
            barrier = Event({"t": "barrier", "id": 2})
            overtaken = await task.exclusive(lambda: sub.add_event(barrier, priority=True))
            assert len(overtaken) == cut_n + 1  # what the loop cut, and the partial buffer the barrier flushed
        finally:
            assert await user.stop(10.0)

    asyncio.run(main())


def test_the_buffers_a_run_on_the_task_loop_cut_are_queued_when_the_run_returns() -> None:
    """A run of a chain on its own loop (Task.call, Task.between_runs) queues what it cut before it returns, as a
    run on the task's thread does, not only through the hand-over it posts to the worker's loop: a run waited for
    blocked returns without that loop turning, and a driver whose next run ends at once for a turn (the cut
    buffers would block the output) would hand runs over for ever, the posted hand-over never let in (a worker
    missed its heartbeats so). Here the posted hand-over is lost (its home a closed loop)."""

    async def main() -> None:
        task, sub, user, hand_off = await _loop_task_with_lost_hand_over(3)
        gate = task.output

        def cut(tag: int) -> None:  # the chain on its loop: three records, each cut into a buffer of its own
            for i in range(3):
                sub.append(msgpack.packb(bytes([tag, i]) * 35))

        try:
            await task.call(cut, 1)
            assert sub.sender.queued_buffers == 3 and not hand_off
            assert gate.blocked and not gate.would_block  # the output says blocked: the driver waits, the loop turns
            await task.between_runs(cut, 2)
            assert sub.sender.queued_buffers == 6 and not hand_off
        finally:
            assert await user.stop(10.0)

    asyncio.run(main())


def test_the_isolation_settings_are_read_once_from_the_environment_and_bad_values_refused() -> None:
    assert IsolationSettings.from_env({}) == IsolationSettings("thread", 0.005)
    assert IsolationSettings.from_env({"SLUICE_TASK_ISOLATION": "inline", "SLUICE_SYNC_WAIT_S": " 0 "}) == (
        IsolationSettings("inline", 0.0))
    assert IsolationSettings.from_env({"SLUICE_SYNC_WAIT_S": "0.002"}).sync_wait_s == 0.002
    for bad in ("soon", "-1", "nan", "5"):  # 5 s: the worker's loop would hold its heartbeats that long
        with pytest.raises(ValueError, match="SLUICE_SYNC_WAIT_S"):
            IsolationSettings.from_env({"SLUICE_SYNC_WAIT_S": bad})
    with pytest.raises(ValueError, match="SLUICE_TASK_ISOLATION"):
        IsolationSettings.from_env({"SLUICE_TASK_ISOLATION": "sometimes"})


@pytest.mark.parametrize("sync_wait_s", [0.0, 0.1])
def test_a_task_waits_for_its_runs_as_its_workers_settings_say(sync_wait_s: float) -> None:
    """The blocked wait is the task's setting (the worker's IsolationSettings, passed down), not a module global:
    0 awaits every run; otherwise the runs that held the GIL are waited for blocked."""
    job = Job()
    job.source(GeneratorSource(count=20_000, keys=10, seed=1), name="src").map(lambda r: r).sink(DiscardSink())
    chain = Chain(job, [0, 1, 2], subtask_index=0, parallelism=1, attempt=0, outputs=[])
    task = Task(key=TaskKey("job", 0, 0, "src", 1), chain=chain, outputs=[], output_gate=OutputGate(), inputs=[],
                credits=Credits(2, 8), source=job.nodes[0].payload, flush_timeout_s=0.05,
                isolation=IsolationSettings(sync_wait_s=sync_wait_s))
    seen: list[tuple[float, int, int]] = []

    def at_end(t: Task) -> None:  # before the task's close, which runs on a thread of its own
        assert t._thread is not None
        seen.append((t._thread.sync_wait_s, t._thread.calls, t._thread.waited_blocked))

    task.on_end_of_input = at_end
    asyncio.run(task.run())
    assert task.chain.records_out == 20_000
    [(thread_wait_s, calls, blocked)] = seen
    assert thread_wait_s == sync_wait_s and calls > 1
    if sync_wait_s == 0:
        assert blocked == 0
    else:
        assert blocked >= 1  # runs of a map hold the GIL; 100 ms covers one even on a busy machine
