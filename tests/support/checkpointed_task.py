"""A real source task whose checkpoints complete as soon as it acknowledges them, for tests of the order of a
task's checkpoint calls (snapshot, commit, close) without a coordinator: the acknowledgement answers itself."""

from __future__ import annotations

from typing import Any

from runtime.api import Job
from runtime.checkpointing.barriers import BarrierSpec
from runtime.checkpointing.checkpointer import TaskCheckpointer
from runtime.checkpointing.task_checkpoints import TaskCheckpoints
from runtime.checkpointing.writer import CheckpointWriter
from runtime.execution.channels import OutputGate
from runtime.execution.operators import Chain
from runtime.execution.task import Credits, Task, TaskKey


def acked_at_once_task(job: Job, name: str, writer: CheckpointWriter, acked: list[int],
                       **task_options: Any) -> tuple[Task, TaskCheckpoints]:
    """The task of `job`'s whole chain (a source first); each checkpoint it acknowledges is appended to `acked`
    and notified complete at once (the coordinator's answer when every task acknowledged it)."""
    chain = Chain(job, [n.id for n in job.nodes], subtask_index=0, parallelism=1, attempt=0, outputs=[])
    listeners: list[TaskCheckpoints] = []

    def on_ack(task: Task, spec: BarrierSpec, files: dict[str, Any], figures: Any) -> None:
        acked.append(spec.checkpoint_id)
        listeners[0].notify_complete(spec.checkpoint_id)

    def listener(task: Task) -> TaskCheckpoints:
        checkpointer = TaskCheckpointer(task, writer, task_key=task.key.vertex_subtask, max_parallelism=128,
                                        on_ack=on_ack, on_decline=lambda *args: None)
        listeners.append(TaskCheckpoints(task, checkpointer))
        return listeners[0]

    task = Task(key=TaskKey("job", 0, 0, name, 1), chain=chain, outputs=[], output_gate=OutputGate(), inputs=[],
                credits=Credits(2, 8), source=job.nodes[0].payload, flush_timeout_s=0.05, checkpoints=listener,
                **task_options)
    return task, listeners[0]
