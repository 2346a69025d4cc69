"""The traces of checkpoints and recoveries, as plain span records built from what the coordinator already knows
(pure: no OpenTelemetry, no clock; coordinator/telemetry.py exports them over OTLP).

A checkpoint is one trace, built when it ends, with explicit start and end times (no context travels to the
workers: each task's acknowledgement already carries its figures, runtime/graph/checkpoint_figures.py):

    checkpoint  (or savepoint)      trigger -> the last acknowledgement (the duration the REST API reports)
      checkpoint.task               one per task that acknowledged: its first barrier -> its acknowledgement
        checkpoint.alignment        first barrier -> last barrier
        checkpoint.sync             the synchronous snapshot
        checkpoint.async            the snapshot's writes, to the acknowledgement

A task's times are its figures' offsets from the trigger as the workers measured them (the wall clock of the
trigger travels in the trigger message), so a task span sits where the task spent the time; it is clipped to its
checkpoint's span, since another machine's clock may be a little off. The sync phase starts at the first barrier
of an unaligned checkpoint and after the alignment of an aligned one (the figures say how long it took, not when:
an aligned_timeout checkpoint that switched is drawn as aligned). Every figure the task reported is an attribute
of its span, exactly as reported. Tasks that had finished before the checkpoint (FLIP-147: acknowledged for them,
with no figures) get no span.

A recovery is one span from the failure's detection to the job running again (the restart time the REST API
reports), named `recovery`, with the cause and the checkpoint it restored.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from coordinator.checkpointing import CheckpointSummary, Status
from runtime.graph.checkpoint_figures import TaskCheckpointFigures
from runtime.graph.enums import CheckpointMode

AttributeValue = str | int | float | bool

# span names: few and fixed (what a span is), the ids are attributes
CHECKPOINT, SAVEPOINT, TASK, ALIGNMENT, SYNC, ASYNC, RECOVERY = (
    "checkpoint", "savepoint", "checkpoint.task", "checkpoint.alignment", "checkpoint.sync", "checkpoint.async",
    "recovery")
_NOT_MEASURED = TaskCheckpointFigures()  # what a task that had finished "acknowledges"


@dataclass(frozen=True, slots=True)
class SpanRecord:
    name: str
    start_s: float  # Unix time
    end_s: float
    attributes: Mapping[str, AttributeValue]
    children: tuple[SpanRecord, ...] = ()
    error: str = ""  # not empty: the span failed (its status is an error with this description)

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s

    def walk(self) -> list[SpanRecord]:
        """This span and all below it, depth first (parents before their children)."""
        out = [self]
        for child in self.children:
            out += child.walk()
        return out


SpanBuilder = Callable[[], "SpanRecord | None"]  # builds a trace off the event loop (coordinator/telemetry.py)
SpanSink = Callable[[SpanBuilder], None]  # where the runner and the job manager hand their builders


def checkpoint_span(summary: CheckpointSummary, tasks: Mapping[str, TaskCheckpointFigures], *, job_id: str,
                    attempt: int, wall_offset_s: float, trigger_wall_s: float | None = None) -> SpanRecord | None:
    """The trace of one ended checkpoint; None while it is in progress.

    `summary.started_at` is the coordinator's monotonic clock: `wall_offset_s` (wall minus monotonic) makes it
    Unix time. `trigger_wall_s` is the wall clock the trigger message carried, from which the tasks measured
    their offsets (None: the checkpoint's own start stands in)."""
    if summary.duration_s is None or summary.status == Status.IN_PROGRESS:
        return None
    start = summary.started_at + wall_offset_s
    end = start + summary.duration_s
    base = start if trigger_wall_s is None else trigger_wall_s
    aligned_first = summary.mode != CheckpointMode.UNALIGNED
    children = tuple(_task_span(task, figures, base, start, end, aligned_first=aligned_first)
                     for task, figures in sorted(tasks.items(), key=lambda kv: _task_order(kv[0]))
                     if figures != _NOT_MEASURED)
    attributes: dict[str, AttributeValue] = {
        "sluice.job.id": job_id, "sluice.job.attempt": attempt, "sluice.checkpoint.id": summary.checkpoint_id,
        "sluice.checkpoint.mode": str(summary.mode), "sluice.checkpoint.savepoint": summary.savepoint,
        "sluice.checkpoint.status": str(summary.status), "sluice.checkpoint.tasks": len(tasks),
        **{f"sluice.checkpoint.{k}": v for k, v in summary.figures.to_wire().items()}}
    error = (summary.failure_reason or "aborted") if summary.status == Status.FAILED else ""
    return SpanRecord(SAVEPOINT if summary.savepoint else CHECKPOINT, start, end, attributes, children, error)


def _task_span(task: str, f: TaskCheckpointFigures, base: float, low: float, high: float, *,
               aligned_first: bool) -> SpanRecord:
    def clip(t: float) -> float:
        return min(max(t, low), high)

    first = base + f.first_barrier_s
    done = first + f.sync_s + f.async_s  # the task's acknowledgement: its figures add up to it
    sync_start = min(first + f.alignment_s, done - f.sync_s) if aligned_first else first
    sync_end = sync_start + f.sync_s
    phases = ((ALIGNMENT, first, first + f.alignment_s), (SYNC, sync_start, sync_end), (ASYNC, sync_end, done))
    attributes = {"sluice.task": task, **{f"sluice.checkpoint.{k}": v for k, v in f.to_wire().items()}}
    return SpanRecord(TASK, clip(first), clip(done), attributes,
                      tuple(SpanRecord(name, clip(a), clip(b), {"sluice.task": task}) for name, a, b in phases))


def _task_order(task: str) -> tuple[int, int] | tuple[float, str]:
    """"vertex:subtask" in numeric order (2:10 after 2:9); anything else after them, by its text."""
    vertex, _, subtask = task.partition(":")
    return (int(vertex), int(subtask)) if vertex.isdigit() and subtask.isdigit() else (float("inf"), task)


def recovery_span(*, job_id: str, attempt: int, seconds: float, running_at_s: float, cause: str,
                  restored_checkpoint_id: int | None) -> SpanRecord:
    """A restart: from the failure's detection to the job running again (`seconds` long, ending at
    `running_at_s`, Unix time), the new attempt, the failure's cause and the checkpoint it restored."""
    attributes: dict[str, AttributeValue] = {"sluice.job.id": job_id, "sluice.job.attempt": attempt,
                                             "sluice.recovery.cause": cause}
    if restored_checkpoint_id is not None:
        attributes["sluice.recovery.restored_checkpoint_id"] = restored_checkpoint_id
    return SpanRecord(RECOVERY, running_at_s - seconds, running_at_s, attributes)

