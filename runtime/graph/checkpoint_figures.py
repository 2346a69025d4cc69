"""The figures a checkpoint is measured by, declared once.

A task acknowledges a checkpoint with a TaskCheckpointFigures (runtime/checkpointing/checkpointer.py measures
them); the coordinator folds the tasks' into one CheckpointFigures as each figure's `aggregate` says; the REST
API lists both together with this declaration, Prometheus exports the aggregated ones that name a `metric`,
and the web UI draws its tables from the declaration it gets with the REST answer. Adding a figure is a field
and a line here, its measurement in the checkpointer, and its schema in coordinator/ui/openapi.json (a unit
test holds the three together).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from typing import Any

SUM, MAX = "sum", "max"


@dataclass(frozen=True, slots=True)
class Figure:
    name: str  # the field of TaskCheckpointFigures (and of CheckpointFigures when aggregated)
    unit: str  # "s", "bytes", "records" or "bool": how the UI formats it and its JSON type
    label: str  # the UI's column heading
    aggregate: str = ""  # SUM or MAX over the tasks for the checkpoint's own figure; "": per task only
    optional: bool = False  # measured by some tasks only (a state backend, an async operator): absent otherwise
    metric: str = ""  # the Prometheus gauge of the last completed checkpoint's aggregate, if exported
    help: str = ""  # its help text


FIGURES: tuple[Figure, ...] = (
    Figure("start_delay_s", "s", "start delay", MAX, metric="sluice_checkpoint_last_start_delay_seconds",
           help="Longest trigger-to-first-barrier delay in the last completed checkpoint"),
    Figure("alignment_s", "s", "alignment", MAX, metric="sluice_checkpoint_last_alignment_seconds",
           help="Longest alignment of a task in the last completed checkpoint"),
    Figure("sync_s", "s", "sync"),
    Figure("async_s", "s", "async"),
    Figure("state_bytes", "bytes", "state", SUM, metric="sluice_checkpoint_last_state_bytes",
           help="Operator state persisted by the last completed checkpoint"),
    Figure("inflight_bytes", "bytes", "in-flight", SUM, metric="sluice_checkpoint_last_persisted_inflight_bytes",
           help="In-flight data (channel state) persisted by the last completed checkpoint"),
    Figure("unaligned", "bool", "unaligned"),
    # barrier timeline, seconds after the trigger: the first barrier (or the trigger, at a source) and the last
    # one (alignment done), so _metadata shows where an aligned checkpoint spent its time
    Figure("first_barrier_s", "s", "first barrier"),
    Figure("last_barrier_s", "s", "last barrier"),
    # what a state backend's snapshot cost: its synchronous part, and how incremental it was
    Figure("backend_sync_s", "s", "backend sync", optional=True),
    Figure("backend_uploaded_bytes", "bytes", "uploaded", optional=True),
    Figure("backend_total_bytes", "bytes", "backend total", optional=True),
    Figure("async_captured_records", "records", "async captured", optional=True),  # in flight, for replay
    # an aligned checkpoint with per-channel switching (checkpoint.channel_timeout_s / channel_inflight_bytes):
    # the task's channels (input and output) that switched to unaligned for it; the checkpoint's: over its tasks
    Figure("switched_channels", "records", "switched channels", SUM, optional=True),
)
AGGREGATED: tuple[Figure, ...] = tuple(f for f in FIGURES if f.aggregate)


@dataclass(frozen=True, slots=True)
class TaskCheckpointFigures:
    """What one task's part of a checkpoint cost; the ack carries it as `to_wire()`."""

    start_delay_s: float = 0.0
    alignment_s: float = 0.0
    sync_s: float = 0.0
    async_s: float = 0.0
    state_bytes: int = 0
    inflight_bytes: int = 0
    unaligned: bool = False
    first_barrier_s: float = 0.0
    last_barrier_s: float = 0.0
    backend_sync_s: float | None = None
    backend_uploaded_bytes: int | None = None
    backend_total_bytes: int | None = None
    async_captured_records: int | None = None
    switched_channels: int | None = None

    def to_wire(self) -> dict[str, Any]:
        """The figures as a JSON/msgpack document; optional ones only when measured."""
        return {f.name: getattr(self, f.name) for f in FIGURES if getattr(self, f.name) is not None}

    @classmethod
    def from_wire(cls, doc: Mapping[str, Any] | None) -> TaskCheckpointFigures:
        """From an ack's document; a figure it lacks (an older worker's ack) keeps its default, unknown ones are
        ignored, each value is coerced to the figure's type."""
        doc = doc or {}
        return cls(**{f.name: _typed(f, doc[f.name]) for f in FIGURES if doc.get(f.name) is not None})


@dataclass(frozen=True, slots=True)
class CheckpointFigures:
    """The checkpoint's own figures: each aggregated figure over the tasks that acknowledged so far."""

    start_delay_s: float = 0.0  # max over tasks
    alignment_s: float = 0.0  # max over tasks
    state_bytes: int = 0  # sum over tasks
    inflight_bytes: int = 0  # sum over tasks
    switched_channels: int = 0  # sum over tasks (per-channel switching)

    @classmethod
    def of(cls, tasks: Iterable[TaskCheckpointFigures]) -> CheckpointFigures:
        tasks = list(tasks)
        values: dict[str, Any] = {}
        for f in AGGREGATED:
            present = [getattr(t, f.name) for t in tasks if getattr(t, f.name) is not None]
            total = sum(present) if f.aggregate == SUM else max(present, default=0)
            values[f.name] = _typed(f, total)
        return cls(**values)

    def to_wire(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in AGGREGATED}


def declaration() -> list[dict[str, Any]]:
    """The figures as the REST API describes them to its clients (the web UI draws its columns from it)."""
    return [{"name": f.name, "unit": f.unit, "label": f.label, "aggregate": f.aggregate or None}
            for f in FIGURES]


def _typed(figure: Figure, value: Any) -> Any:
    if figure.unit == "bool":
        return bool(value)
    if figure.unit in ("bytes", "records"):
        return int(value)
    return float(value)


def _check_declaration() -> None:
    """The declaration and the records name the same figures (checked at import: a mismatch is a bug here)."""
    if [f.name for f in FIGURES] != [f.name for f in fields(TaskCheckpointFigures)]:
        raise AssertionError("FIGURES and TaskCheckpointFigures must list the same figures, in the same order")
    if [f.name for f in AGGREGATED] != [f.name for f in fields(CheckpointFigures)]:
        raise AssertionError("the aggregated FIGURES and CheckpointFigures must list the same figures")


_check_declaration()
