"""A task's checkpoint listener: barriers in, the barrier handler's instructions carried out.

The task (runtime/execution) knows nothing of checkpoints. It hands this
listener every barrier it takes, every ended channel and every in-band
barrier that reaches its gate; the worker hands it triggers and the
coordinator's notifications. Decisions are the pure `BarrierHandler`'s; the
`TaskCheckpointer` snapshots, persists and acknowledges. Work that must run
on the task's turn (between records) is posted to the task's mailbox as Mail.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from runtime.checkpointing.barriers import (
    Abandon,
    Action,
    BarrierHandler,
    BarrierSpec,
    Block,
    InputsComplete,
    Snapshot,
    UnblockAll,
)
from runtime.checkpointing.checkpointer import TaskCheckpointer
from runtime.execution.mailbox import Mail
from runtime.execution.task import CheckpointStatistics, Task
from runtime.graph.enums import CheckpointMode, TaskState


class TaskCheckpoints:
    def __init__(self, task: Task, checkpointer: TaskCheckpointer) -> None:
        self.task = task
        self.checkpointer = checkpointer
        self.barriers = BarrierHandler(list(task.gate.channels)) if task.gate is not None else None
        self._deadline_timer: asyncio.TimerHandle | None = None
        self._deadline_spec: BarrierSpec | None = None

    # -- from the worker (any time) ----------------------------------------------------

    def trigger(self, spec: BarrierSpec) -> None:
        """A source starts checkpoint `spec` (the coordinator's trigger)."""
        self.task.post(Mail(lambda: self._trigger(spec), f"trigger checkpoint {spec.checkpoint_id}"))

    def notify_complete(self, checkpoint_id: int) -> None:
        """The checkpoint completed everywhere: sinks publish what they pre-committed for it."""
        if self.task.state == TaskState.RUNNING:
            self.task.post(Mail(lambda: self.task.chain.commit_sinks(checkpoint_id),
                                f"commit checkpoint {checkpoint_id}"))
        elif self.task.state == TaskState.FINISHED:
            self.task.chain.commit_sinks(checkpoint_id)

    def notify_aborted(self, checkpoint_id: int) -> None:
        if self.task.state == TaskState.RUNNING:
            self.task.post(Mail(lambda: self._on_aborted(checkpoint_id), f"abort checkpoint {checkpoint_id}"))

    # -- the task's listener protocol ------------------------------------------------------

    def on_barrier(self, channel_id: int, body: dict[str, Any], *, priority: bool) -> None:
        if self.barriers is None:
            return
        spec = BarrierSpec.from_body(body)
        if self.barriers.pending is None:
            self.checkpointer.mark_first_barrier()
        self._carry_out(self.barriers.on_barrier(channel_id, spec, priority=priority, now=time.time()))
        self._arm_deadline(spec)

    def on_barrier_queued(self, channel_id: int, body: dict[str, Any]) -> None:
        """An aligned barrier reached the input gate (it may wait there behind data): start its clock, and let
        the barrier handler know, so that it counts once the checkpoint switches to unaligned."""
        if body.get("mode") != CheckpointMode.ALIGNED_TIMEOUT:
            return
        spec = BarrierSpec.from_body(body)
        if self._deadline_spec is None or spec.checkpoint_id > self._deadline_spec.checkpoint_id:
            self._arm_deadline(spec)
        self.task.post(Mail(lambda: self._on_arrival(channel_id, spec), "barrier queued"))

    def on_channel_ended(self, channel_id: int) -> None:
        if self.barriers is not None:
            self._carry_out(self.barriers.on_channel_ended(channel_id))

    def poll(self, now: float) -> None:
        if self.checkpointer.waiting_outputs():
            self.checkpointer.poll_outputs(now)

    def close(self) -> None:
        if self._deadline_timer is not None:
            self._deadline_timer.cancel()

    def statistics(self) -> CheckpointStatistics:
        return self.checkpointer.statistics()

    # -- on the task's turn ---------------------------------------------------------------

    def _trigger(self, spec: BarrierSpec) -> None:
        self.checkpointer.mark_first_barrier()
        self.checkpointer.snapshot(spec, unaligned=spec.mode == CheckpointMode.UNALIGNED)
        self._arm_deadline(spec)

    def _on_arrival(self, channel_id: int, spec: BarrierSpec) -> None:
        if self.barriers is not None:
            self._carry_out(self.barriers.on_arrival(channel_id, spec))

    def _carry_out(self, actions: list[Action]) -> None:
        gate = self.task.gate
        checkpointer = self.checkpointer
        for action in actions:
            if isinstance(action, Block):
                assert gate is not None
                gate.block(action.channel_id)
            elif isinstance(action, UnblockAll):
                if gate is not None:
                    gate.unblock_all()
            elif isinstance(action, Snapshot):
                checkpointer.snapshot(action.spec, unaligned=action.unaligned)
            elif isinstance(action, InputsComplete):
                checkpointer.inputs_complete(action.spec, unaligned=action.unaligned)
            elif isinstance(action, Abandon):
                checkpointer.abandon(action.checkpoint_id, "a newer checkpoint overtook it")

    def _arm_deadline(self, spec: BarrierSpec) -> None:
        if spec.mode != CheckpointMode.ALIGNED_TIMEOUT or spec.deadline is None:
            return
        if self._deadline_spec is not None and self._deadline_spec.checkpoint_id == spec.checkpoint_id:
            return
        if self._deadline_timer is not None:
            self._deadline_timer.cancel()
        self._deadline_spec = spec
        delay = max(0.0, spec.deadline - time.time())
        mail = Mail(self._on_deadline, f"aligned-timeout deadline of checkpoint {spec.checkpoint_id}")
        self._deadline_timer = asyncio.get_running_loop().call_later(delay, self.task.post, mail)

    def _on_deadline(self) -> None:
        now = time.time()
        spec = self._deadline_spec
        if self.barriers is not None and spec is not None:
            if self.barriers.pending is None:
                self.checkpointer.mark_first_barrier()
            self._carry_out(self.barriers.on_time(now, spec))
        self.checkpointer.poll_outputs(now)

    def _on_aborted(self, checkpoint_id: int) -> None:
        if self.barriers is not None:
            self._carry_out(self.barriers.abort(checkpoint_id))
        run = self.checkpointer.run
        if run is not None and run.spec.checkpoint_id == checkpoint_id and not run.acked:
            self.checkpointer.abandon(checkpoint_id, "aborted by the coordinator")
