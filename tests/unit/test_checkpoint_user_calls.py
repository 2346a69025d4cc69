"""A checkpoint's user calls run where the task's records run (runtime/execution/task.py `defer_user_call`): a sink
whose pre-commit (`snapshot_state`) or commit blocks holds up its own task only, while another task on the same
event loop keeps processing and the loop keeps its pace (the worker's heartbeats and RPC run there). Real tasks, on
one event loop, in this process; inline, the calls stay on the loop as before."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from runtime.api import DiscardSink, GeneratorSource, Job, Sink
from runtime.checkpointing.barriers import BarrierSpec
from runtime.checkpointing.task_checkpoints import TaskCheckpoints
from runtime.checkpointing.writer import CheckpointWriter
from runtime.execution.channels import OutputGate
from runtime.execution.isolation import IsolationSettings
from runtime.execution.operators import Chain
from runtime.execution.task import Credits, Task, TaskCancelled, TaskKey
from runtime.graph.checkpoint_options import CheckpointOptions
from tests.support.checkpointed_task import acked_at_once_task
from tests.support.loop_lag import LoopLag

DEADLINE_S = 30.0
# how long the sink holds at most: the call returns by itself then, so that a loop it holds (the behaviour this
# test refuses) ends the test with a failed assertion instead of a hang
HOLD_LIMIT_S = 10.0


class HoldingSink(Sink):
    """Holds in `snapshot_state` or `commit` of checkpoint 1 (a slow external system) until released; says, in
    order, what it was asked to do, and on which thread."""

    def __init__(self, holds_in: str) -> None:
        super().__init__()
        self.holds_in = holds_in
        self.events: list[str] = []
        self.threads: set[int] = set()
        self.holding = threading.Event()
        self.release = threading.Event()
        self.returned = threading.Event()  # the held call returned (released, or at HOLD_LIMIT_S)

    def write(self, record: Any) -> None:
        pass

    def _maybe_hold(self, call: str, checkpoint_id: int) -> None:
        self.events.append(f"{call} {checkpoint_id}")
        self.threads.add(threading.get_ident())
        if call == self.holds_in and checkpoint_id == 1:
            self.holding.set()
            self.release.wait(HOLD_LIMIT_S)
            self.returned.set()

    def snapshot_state(self, checkpoint_id: int) -> Any:
        self._maybe_hold("snapshot", checkpoint_id)
        return {"checkpoint": checkpoint_id}

    def commit(self, checkpoint_id: int) -> None:
        self._maybe_hold("commit", checkpoint_id)


async def _passed_on(record: Any) -> Any:
    return record


def _held_task(sink: HoldingSink, chain_kind: str, mode: str, writer: CheckpointWriter,
               acked: list[int]) -> tuple[Task, TaskCheckpoints]:
    """An unbounded source -> `sink` task (with an async_map between: its chain on a loop of its own), whose
    checkpoints complete as soon as it acknowledges them (the coordinator's answer, at once)."""
    job = Job()
    stream = job.source(GeneratorSource(count=None, keys=10, seed=1), name="held")
    if chain_kind == "user loop":
        stream = stream.async_map(_passed_on, timeout_s=30)
    stream.sink(sink)
    return acked_at_once_task(job, "held", writer, acked, isolation=IsolationSettings(mode))


def _busy_task(mode: str) -> Task:
    job = Job()
    job.source(GeneratorSource(count=None, keys=10, seed=2), name="busy").map(lambda r: r).sink(DiscardSink())
    chain = Chain(job, [0, 1, 2], subtask_index=0, parallelism=1, attempt=0, outputs=[])
    return Task(key=TaskKey("job", 3, 0, "busy", 1), chain=chain, outputs=[], output_gate=OutputGate(), inputs=[],
                credits=Credits(2, 8), source=job.nodes[0].payload, flush_timeout_s=0.05,
                isolation=IsolationSettings(mode))


async def _wait_for(predicate: Any, what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not predicate():
        assert time.monotonic() < deadline, f"no {what} within {DEADLINE_S} s"
        await asyncio.sleep(0.005)


async def _stop(*runs: tuple[Task, asyncio.Task[None]]) -> None:
    for task, _ in runs:
        task.cancel()
    for _, running in runs:
        with pytest.raises((TaskCancelled, asyncio.CancelledError)):
            await asyncio.wait_for(running, DEADLINE_S)


@pytest.mark.parametrize("chain_kind", ["thread", "user loop"])
@pytest.mark.parametrize("holds_in", ["commit", "snapshot"])
def test_a_sink_holding_in_a_checkpoint_call_holds_up_only_its_own_task(tmp_path: Path, holds_in: str,
                                                                        chain_kind: str) -> None:
    """While the sink holds in its commit (or pre-commit) of checkpoint 1, another task on the same loop runs
    thousands of records and the loop's 5 ms timer keeps its pace; released, the checkpoint goes on in order: the
    snapshot is acknowledged after its pre-commit returned, the commit follows, and checkpoint 2 comes after it.
    Before the calls moved to the task's thread they ran on the worker's loop, which they held for HOLD_LIMIT_S."""
    sink = HoldingSink(holds_in)
    writer = CheckpointWriter()
    acked: list[int] = []

    async def main() -> None:
        held, checkpoints = _held_task(sink, chain_kind, "thread", writer, acked)
        busy = _busy_task("thread")
        async with LoopLag() as watch:
            runs = [(held, asyncio.create_task(held.run())), (busy, asyncio.create_task(busy.run()))]
            try:
                await _wait_for(lambda: busy.records_in > 0 and held.records_in > 0, "records in both tasks")
                checkpoints.trigger(BarrierSpec(1, time.time(), CheckpointOptions(), str(tmp_path)))
                await _wait_for(sink.holding.is_set, f"hold in the sink's {holds_in}")
                busy_before, ticks_before = busy.records_in, watch.ticks
                await _wait_for(lambda: busy.records_in >= busy_before + 5000 and watch.ticks >= ticks_before + 20,
                                "progress beside the held sink")
                assert not sink.returned.is_set(), "the other task ran only once the sink's call had returned"
                assert acked == ([] if holds_in == "snapshot" else [1])  # acknowledged once pre-committed
                held_records = held.records_in
                await asyncio.sleep(0.05)
                assert held.records_in == held_records  # the held task itself waits: no record passes its call
                sink.release.set()
                await _wait_for(lambda: sink.events[-1:] == ["commit 1"], "the commit of checkpoint 1")
                checkpoints.trigger(BarrierSpec(2, time.time(), CheckpointOptions(), str(tmp_path)))
                await _wait_for(lambda: sink.events[-1:] == ["commit 2"], "the commit of checkpoint 2")
            finally:
                sink.release.set()
                await _stop(*runs)
        assert watch.lag < 1.0, f"the event loop was {watch.lag * 1000:.0f} ms late"

    try:
        asyncio.run(main())
    finally:
        sink.release.set()
        writer.close()
    assert acked == [1, 2]
    assert sink.events == ["snapshot 1", "commit 1", "snapshot 2", "commit 2"]
    assert threading.get_ident() not in sink.threads  # never on the worker's loop


def test_inline_the_checkpoint_calls_stay_on_the_loop(tmp_path: Path) -> None:
    """SLUICE_TASK_ISOLATION=inline keeps the old behaviour: the sink's pre-commit and commit on the loop."""
    sink = HoldingSink("nothing")
    writer = CheckpointWriter()
    acked: list[int] = []

    async def main() -> None:
        held, checkpoints = _held_task(sink, "thread", "inline", writer, acked)
        running = asyncio.create_task(held.run())
        try:
            await _wait_for(lambda: held.records_in > 0, "records")
            checkpoints.trigger(BarrierSpec(1, time.time(), CheckpointOptions(), str(tmp_path)))
            await _wait_for(lambda: sink.events[-1:] == ["commit 1"], "the commit of checkpoint 1")
        finally:
            await _stop((held, running))

    try:
        asyncio.run(main())
    finally:
        writer.close()
    assert acked == [1] and sink.events == ["snapshot 1", "commit 1"]
    assert sink.threads == {threading.get_ident()}
