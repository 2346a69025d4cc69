"""A task's checkpoint listener: barriers in, the barrier handler's instructions carried out.

The task (runtime/execution) knows nothing of checkpoints. It hands this
listener every barrier it takes, every ended channel and every in-band
barrier that reaches its gate; the worker hands it triggers and the
coordinator's notifications. Decisions are the pure `BarrierHandler`'s; the
`TaskCheckpointer` snapshots, persists and acknowledges. Work that must run
on the task's turn (between records) is posted to the task's mailbox as Mail.

Checkpoints after tasks finished (the idea of Flink's FLIP-147): a task that
has reached the end of its input and sent "end" downstream can no longer get
barriers through its channels, so the worker triggers it directly, like a
source; it snapshots its state (sinks pre-commit their last files) without
putting a barrier after its "end", and acknowledges. It finishes only when
such a checkpoint has completed and its sinks have published it, so the end
of a bounded job is a checkpoint like any other: no separate final commit,
and restoring that checkpoint re-publishes exactly the same files. Once the
coordinator hears the task finished, later checkpoints record it as finished.
While a task past its end still has data queued before its "end" (downstream
backpressured), an unaligned checkpoint overtakes both and stores that data as
output channel state; downstream counts an "end" waiting in its gate as a
delivered barrier. So a finished input never holds unaligned checkpoints back.
A task whose every input's "end" has reached its gate, though it has not
taken them yet, gets no barrier either: the worker triggers it directly too,
and an unaligned checkpoint is taken at once, the queued data recorded as
input channel state (BarrierHandler.on_trigger).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from netstack.credit import Buffer
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

RECENT_SPECS = 8  # triggers a task remembers for its end of input (at most a few are ever in flight)


class TaskCheckpoints:
    def __init__(self, task: Task, checkpointer: TaskCheckpointer) -> None:
        self.task = task
        self.checkpointer = checkpointer
        self.barriers = (BarrierHandler(list(task.gate.channels), budget=checkpointer.budget)
                         if task.gate is not None else None)
        self._deadline_timer: asyncio.TimerHandle | None = None
        self._deadline_spec: BarrierSpec | None = None
        self.latest_spec: BarrierSpec | None = None  # the job's latest trigger on this worker (set by the worker)
        # the job's recent triggers on this worker by id (`remember`, by the worker): at its end of input a task
        # takes each one it has not taken, since a savepoint may be in flight beside a periodic aligned checkpoint
        self.recent_specs: dict[int, BarrierSpec] = {}
        self._last_snapshot_id = 0
        self._final_id: int | None = None  # the first checkpoint snapshotted after the end of input
        self._final_committed = False
        # a source that confirms its input when a checkpoint completes (a replication slot's position): the
        # positions of its checkpoints still in flight, by id
        self._source_positions: dict[int, Any] = {}
        self._last_barrier: tuple[dict[str, Any], BarrierSpec] | None = None  # see _spec

    def _spec(self, body: dict[str, Any]) -> BarrierSpec:
        """The barrier's spec. Every input channel brings the same barrier (500 channels a task at parallelism
        500): decoded once, and the others compared with it (a few dict lookups instead of a decode)."""
        last = self._last_barrier
        # the same dict on channels of one link (netstack decodes an event once) and on local channels
        if last is not None and (last[0] is body or last[0] == body):
            return last[1]
        spec = BarrierSpec.from_body(body)
        self._last_barrier = (body, spec)
        return spec

    # -- from the worker (any time) ----------------------------------------------------

    def trigger(self, spec: BarrierSpec) -> None:
        """A source starts checkpoint `spec` (the coordinator's trigger)."""
        self.task.post(Mail(lambda: self._trigger(spec), f"trigger checkpoint {spec.checkpoint_id}",
                            may_snapshot=True))

    def notify_complete(self, checkpoint_id: int) -> None:
        """The checkpoint completed everywhere: sinks publish what they pre-committed for it, on the task's turn.

        A task that is no longer running commits nothing (Flink's order: notifyCheckpointComplete of the final
        checkpoint, then close; no notification after). Its final checkpoint was committed before it finished
        (`Task._wait_final_checkpoint`), a later one holds nothing new of it (its sinks pre-commit nothing after
        their end), and from then on its sinks are being closed on its thread (`Task._close`): a commit then would
        run beside their close or after it. The commit itself is user code: it runs on the task's thread
        (`Task.defer_user_call`), so one that blocks holds up this task only."""
        if self.task.state == TaskState.RUNNING:
            self.task.post(Mail(lambda: self._on_complete(checkpoint_id), f"commit checkpoint {checkpoint_id}"))

    def notify_aborted(self, checkpoint_id: int) -> None:
        if self.task.state == TaskState.RUNNING:
            self.task.post(Mail(lambda: self._on_aborted(checkpoint_id), f"abort checkpoint {checkpoint_id}"))

    # -- the task's listener protocol ------------------------------------------------------

    def on_barrier(self, channel_id: int, body: dict[str, Any], *, priority: bool) -> None:
        if self.barriers is None:
            return
        spec = self._spec(body)
        self.checkpointer.mark_first_barrier(spec.checkpoint_id)
        queued = self._queued_bytes(channel_id) if priority and spec.switching else 0
        self._carry_out(self.barriers.on_barrier(channel_id, spec, priority=priority, now=time.time(),
                                                 queued_bytes=queued))
        self._arm_deadline(spec)

    def on_barrier_queued(self, channel_id: int, body: dict[str, Any]) -> None:
        """An aligned barrier reached the input gate (it may wait there behind data): start its clock, and let
        the barrier handler know, so that it counts once the checkpoint switches to unaligned. The same for a
        channel's end of partition: unaligned checkpoints count it at once (FLIP-147)."""
        if body.get("t") == "end":
            # may_snapshot: an end can complete a checkpoint or take one (every input ended), so a drain-mode
            # task quiesces before it as before a barrier
            self.task.post(Mail(lambda: self._on_end_arrival(channel_id), "end of partition queued",
                                may_snapshot=True))
            return
        spec = self._spec(body)
        if spec.switching:  # called before the barrier is queued: the gate holds exactly the data ahead of it
            arrived_at, ahead = time.time(), self._queued_bytes(channel_id)
            self._arm_channel_timer(spec)
            self.task.post(Mail(lambda: self._on_arrival(channel_id, spec, arrived_at, ahead), "barrier queued",
                                may_snapshot=True))
            return
        if spec.mode != CheckpointMode.ALIGNED_TIMEOUT:
            return
        if self._deadline_spec is None or spec.checkpoint_id > self._deadline_spec.checkpoint_id:
            self._arm_deadline(spec)
        self.task.post(Mail(lambda: self._on_arrival(channel_id, spec), "barrier queued", may_snapshot=True))

    def on_channel_ended(self, channel_id: int) -> None:
        if self.barriers is not None:
            self._carry_out(self.barriers.on_channel_ended(channel_id))

    def remember(self, spec: BarrierSpec) -> None:
        """A trigger of the job reached this worker (the worker calls it for every task)."""
        self.recent_specs[spec.checkpoint_id] = spec
        while len(self.recent_specs) > RECENT_SPECS:
            del self.recent_specs[min(self.recent_specs)]

    def on_end_of_input(self) -> None:
        """The task sent "end" downstream. Checkpoints triggered while its last input was still open may never
        bring it a barrier (its upstream ended too): take them now, oldest first (two aligned ones may be in
        flight: a savepoint beside a periodic checkpoint); an older one this task gave up is left out."""
        latest = self.latest_spec
        for checkpoint_id, spec in sorted(self.recent_specs.items()):
            gave_up = self.barriers is not None and self.barriers.gave_up(checkpoint_id)
            if checkpoint_id > self._last_snapshot_id and (spec is latest or not gave_up):
                self._snapshot_ended(spec)
        if latest is not None and latest.checkpoint_id > self._last_snapshot_id:
            self._snapshot_ended(latest)

    def final_committed(self) -> bool:
        return self._final_committed

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
        if self.task.end_of_input:  # it may have ended since the trigger was posted
            self._snapshot_ended(spec)
            return
        if self.task.source is None:  # every input ended (the worker's inputs_ended): no barrier will come
            self._trigger_ended_inputs(spec)
            return
        if spec.checkpoint_id <= self._last_snapshot_id:
            return
        self._last_snapshot_id = spec.checkpoint_id
        self.checkpointer.mark_first_barrier(spec.checkpoint_id)
        self.checkpointer.snapshot(spec, unaligned=spec.mode == CheckpointMode.UNALIGNED)
        if hasattr(self.task.source, "checkpoint_complete"):
            self._source_positions[spec.checkpoint_id] = self.task.source_position()
        self._arm_deadline(spec)
        self._arm_channel_timer(spec)

    def inputs_ended(self) -> bool:
        """Every input's end has reached the gate, the task has not reached its own end: it takes checkpoints
        when triggered directly, as a source does (FLIP-147)."""
        return self.barriers is not None and self.barriers.inputs_ended and not self.task.end_of_input

    def _trigger_ended_inputs(self, spec: BarrierSpec) -> None:
        barriers = self.barriers
        if barriers is None or spec.checkpoint_id <= self._last_snapshot_id:
            return
        self.checkpointer.mark_first_barrier(spec.checkpoint_id)
        self._carry_out(barriers.on_trigger(spec, now=time.time()))

    def _snapshot_ended(self, spec: BarrierSpec) -> None:
        """A checkpoint of a task past its end of input: state only. Its inputs have all ended and were
        processed, and its output got no barrier (it carries "end"); downstream counts the ended channel."""
        if spec.checkpoint_id <= self._last_snapshot_id:
            return
        self._last_snapshot_id = spec.checkpoint_id
        if self._final_id is None:
            self._final_id = spec.checkpoint_id
        self.checkpointer.mark_first_barrier(spec.checkpoint_id)
        # unaligned: data still queued before its "end" is overtaken and stored (TaskCheckpointer._overtake_end)
        self.checkpointer.snapshot(spec, unaligned=spec.mode == CheckpointMode.UNALIGNED)
        run = self.checkpointer.run
        if run is not None:
            run.files["ended"] = "true"  # a marker among its files: restored, the task must not finish() again
            if self.task.restore is not None and self.task.restore.finished:
                run.files["finished"] = "true"  # it has no position to store: keep it finished on the next restore
        self.checkpointer.inputs_complete(spec, unaligned=False)

    def _on_complete(self, checkpoint_id: int) -> None:
        self.checkpointer.channel_files.completed(checkpoint_id)  # later checkpoints may reference its segments
        confirmed: tuple[int, Any] | None = None
        done = [c for c in self._source_positions if c <= checkpoint_id]
        if done:
            position = self._source_positions[max(done)]
            for c in done:
                del self._source_positions[c]
            confirmed = (max(done), position[0] if position else None)
        if self.task.chain.sinks or confirmed is not None:
            # user code (a sink publishing to a slow system): on the task's thread, awaited before the next message,
            # so commits keep the checkpoints' order and the final one still comes before the close
            self.task.defer_user_call(self._commit, (checkpoint_id, confirmed),
                                      lambda _: self._committed(checkpoint_id))
        else:
            self._committed(checkpoint_id)

    def _commit(self, checkpoint_id: int, confirmed: tuple[int, Any] | None) -> None:
        """On the task's thread: the sinks publish what they pre-committed for `checkpoint_id`; a source that
        confirms its input learns the position of the latest completed checkpoint it took."""
        self.task.chain.commit_sinks(checkpoint_id)
        if confirmed is not None:
            source: Any = self.task.source  # one with checkpoint_complete (_trigger kept its positions)
            source.checkpoint_complete(*confirmed)

    def _committed(self, checkpoint_id: int) -> None:
        if self._final_id is not None and checkpoint_id >= self._final_id:
            self._final_committed = True
            self.task.wake()

    def _on_arrival(self, channel_id: int, spec: BarrierSpec, arrived_at: float = 0.0, ahead: int = 0) -> None:
        if self.barriers is not None:
            self._carry_out(self.barriers.on_arrival(channel_id, spec, now=arrived_at, bytes_ahead=ahead))

    def _on_end_arrival(self, channel_id: int) -> None:
        if self.barriers is not None:
            self._carry_out(self.barriers.on_end_arrival(channel_id))
            # the last end arrived after the worker passed this task by for the latest trigger: take it now
            spec = self.latest_spec
            if spec is not None and self.task.source is None and self.inputs_ended():
                self._trigger_ended_inputs(spec)

    def _carry_out(self, actions: list[Action]) -> None:
        gate = self.task.gate
        checkpointer = self.checkpointer
        for action in actions:
            if isinstance(action, Block):
                assert gate is not None
                gate.block(action.channel_id)
            elif isinstance(action, UnblockAll):
                if gate is not None:
                    gate.unblock_all(action.keep)
            elif isinstance(action, Snapshot):
                self._last_snapshot_id = max(self._last_snapshot_id, action.spec.checkpoint_id)
                checkpointer.snapshot(action.spec, unaligned=action.unaligned, record_inputs=action.record_inputs)
                self._arm_channel_timer(action.spec)
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
        mail = Mail(self._on_deadline, f"aligned-timeout deadline of checkpoint {spec.checkpoint_id}",
                    may_snapshot=True)
        self._deadline_timer = asyncio.get_running_loop().call_later(delay, self.task.post, mail)

    def _queued_bytes(self, channel_id: int) -> int:
        gate = self.task.gate
        return 0 if gate is None else sum(len(b.data) for _, b in gate.queues[channel_id] if isinstance(b, Buffer))

    def _arm_channel_timer(self, spec: BarrierSpec) -> None:
        """Per-channel switching: at the channel timeout, switch the input channels and promote the output
        barriers that are due (`_on_channel_timer`)."""
        if not spec.switching or spec.channel_timeout_s is None:
            return
        mail = Mail(lambda: self._on_channel_timer(spec), f"channel timeout of checkpoint {spec.checkpoint_id}",
                    may_snapshot=True)
        # a little late rather than early: the timer's clock is not the wall clock the handler compares
        asyncio.get_running_loop().call_later(spec.channel_timeout_s + 0.001, self.task.post, mail)

    def _on_channel_timer(self, spec: BarrierSpec) -> None:
        now = time.time()
        if self.barriers is not None:
            self._carry_out(self.barriers.on_time(now, spec))
        self.checkpointer.poll_outputs(now)

    def _on_deadline(self) -> None:
        now = time.time()
        spec = self._deadline_spec
        if self.barriers is not None and spec is not None:
            self.checkpointer.mark_first_barrier(spec.checkpoint_id)
            self._carry_out(self.barriers.on_time(now, spec))
        self.checkpointer.poll_outputs(now)

    def _on_aborted(self, checkpoint_id: int) -> None:
        self.checkpointer.channel_files.aborted(checkpoint_id)
        self.checkpointer.lift_fence(checkpoint_id)
        if self.barriers is not None:
            self._carry_out(self.barriers.abort(checkpoint_id))
        self.checkpointer.abandon(checkpoint_id, "aborted by the coordinator")  # its run, if not acked yet
