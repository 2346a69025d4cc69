"""The end of a task with checkpoints: its sinks publish the final checkpoint before they close, and a
notification that comes once the task finished commits nothing (runtime/checkpointing/task_checkpoints.py
notify_complete, runtime/execution/task.py `_close`): a commit never runs beside its sink's close, nor after it."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

from runtime.api import GeneratorSource, Job, Sink
from runtime.checkpointing.barriers import BarrierSpec
from runtime.checkpointing.writer import CheckpointWriter
from runtime.graph.checkpoint_options import CheckpointOptions
from runtime.graph.enums import TaskState
from tests.support.checkpointed_task import acked_at_once_task

DEADLINE_S = 30.0


class RecordingSink(Sink):
    """Says, in order, what it was asked to do; its close() holds until released (a client waiting for its
    broker), so the test can act at the exact point where the task's thread is inside it."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list[str] = []
        self.closing = threading.Event()
        self.release = threading.Event()

    def write(self, record: Any) -> None:
        pass

    def snapshot_state(self, checkpoint_id: int) -> Any:
        self.events.append(f"snapshot {checkpoint_id}")
        return {"checkpoint": checkpoint_id}

    def commit(self, checkpoint_id: int) -> None:
        self.events.append(f"commit {checkpoint_id}")

    def close(self) -> None:
        self.events.append("close")
        self.closing.set()
        self.release.wait(DEADLINE_S)
        self.events.append("closed")


def test_the_final_checkpoint_commits_before_close_and_a_later_notification_commits_nothing(tmp_path: Path) -> None:
    sink = RecordingSink()
    job = Job()
    job.source(GeneratorSource(count=200, keys=5, seed=1), name="src").sink(sink)
    writer = CheckpointWriter()
    acked: list[int] = []
    task, checkpoints = acked_at_once_task(job, "src", writer, acked)
    # a checkpoint triggered while the source ran, which it takes at its end of input: its final one
    checkpoints.latest_spec = BarrierSpec(5, time.time(), CheckpointOptions(), str(tmp_path))

    async def main() -> None:
        running = asyncio.create_task(task.run())
        deadline = time.monotonic() + DEADLINE_S
        while not sink.closing.is_set():  # the task's thread is inside its sink's close() now
            assert time.monotonic() < deadline and not running.done(), sink.events
            await asyncio.sleep(0.005)
        assert task.state == TaskState.FINISHED
        # a later checkpoint, which recorded the task finished, completes: a commit the worker's loop ran for it
        # (at once or as the loop turns) would come between "close" and "closed"
        checkpoints.notify_complete(6)
        await asyncio.sleep(0)
        sink.release.set()
        await asyncio.wait_for(running, DEADLINE_S)
        checkpoints.notify_complete(7)  # and one after the close
        await asyncio.sleep(0)

    try:
        asyncio.run(main())
    finally:
        sink.release.set()
        writer.close()
    assert acked == [5]
    assert sink.events == ["snapshot 5", "commit 5", "close", "closed"]
