"""The coordinator's RPC payloads as typed messages: what workers report about their tasks, and what clients ask.

Each message is a frozen dataclass with the RPC `method` it travels as. `to_wire()` is the msgpack document
(the field names as keys, the shape the handlers always read); `from_wire()` checks a received document
field by field and raises BadArguments naming the field, so a malformed call is refused with a reason
(InvalidRequest on the wire) instead of failing inside a handler. Fields with a default may be absent.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, ClassVar, TypeVar

from runtime.common.dispatch import BadArguments
from runtime.graph.checkpoint_figures import TaskCheckpointFigures
from runtime.graph.checkpoint_options import CheckpointOptions

M = TypeVar("M", bound="Message")


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {value!r}")
    return value


def _integer(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"expected an integer, got {value!r}")
    return value


def _number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise TypeError(f"expected a number, got {value!r}")
    return float(value)  # a string as the REST API's JSON may carry it: "30" (and "soon" raises ValueError)


def _document(value: Any) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise TypeError(f"expected an object, got {value!r}")
    return dict(value)


def _items(value: Any) -> list[Any]:
    if not isinstance(value, list | tuple):
        raise TypeError(f"expected a list, got {value!r}")
    return list(value)


# a field's declared type (as written: the module uses postponed annotations) -> its check and conversion
_DECODE: dict[str, Callable[[Any], Any]] = {
    "str": _text, "int": _integer, "float": _number, "bool": bool, "Mapping[str, Any]": _document,
    "list[Any]": _items, "TaskCheckpointFigures": TaskCheckpointFigures.from_wire,
    "CheckpointOptions": CheckpointOptions.from_wire,
}


@dataclass(frozen=True, slots=True)
class Message:
    method: ClassVar[str]

    def to_wire(self) -> dict[str, Any]:
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            out[f.name] = value.to_wire() if hasattr(value, "to_wire") else value
        return out

    @classmethod
    def from_wire(cls: type[M], doc: Any) -> M:
        if not isinstance(doc, Mapping):
            raise BadArguments(f"{cls.method}: arguments must be an object, got {doc!r}")
        values = {}
        for f in fields(cls):
            value = doc.get(f.name)
            if value is None:
                if f.default is MISSING and f.default_factory is MISSING:
                    raise BadArguments(f"{cls.method}: {f.name!r} is required")
                continue
            try:
                values[f.name] = _DECODE[str(f.type).removesuffix(" | None")](value)
            except (TypeError, ValueError) as exc:
                raise BadArguments(f"{cls.method}: {f.name!r}: {exc}") from None
        return cls(**values)


# -- what workers report ----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Register(Message):
    method = "register"
    slots: int
    host: str
    data_port: int
    id: str = ""
    metrics_port: int | None = None
    pid: int | None = None


@dataclass(frozen=True, slots=True)
class Heartbeat(Message):
    method = "heartbeat"
    id: str = ""
    tasks: list[Any] = field(default_factory=list)  # runtime/worker/worker.py task_report(), one per task
    process: Mapping[str, Any] | None = None  # the worker process's memory and CPU (log_tail.process_figures)


@dataclass(frozen=True, slots=True)
class TaskReport(Message):
    """About one task of one attempt: the coordinator ignores reports of an attempt that is not the current."""

    job_id: str
    attempt: int
    task: str  # "vertex:subtask"


@dataclass(frozen=True, slots=True)
class AckCheckpoint(TaskReport):
    method = "ack_checkpoint"
    checkpoint_id: int
    state: Mapping[str, Any]  # the task's files (TaskFiles' wire form), written to _metadata as they came
    figures: TaskCheckpointFigures = TaskCheckpointFigures()


@dataclass(frozen=True, slots=True)
class DeclineCheckpoint(TaskReport):
    method = "decline_checkpoint"
    checkpoint_id: int
    reason: str = ""


@dataclass(frozen=True, slots=True)
class ProbeDone(TaskReport):
    method = "probe_done"
    probe_id: int
    overtaken_output_buffers: int = 0
    overtaken_input_buffers: int = 0


@dataclass(frozen=True, slots=True)
class TaskEnded(TaskReport):
    method = "task_ended"


@dataclass(frozen=True, slots=True)
class TaskFinished(TaskReport):
    method = "task_finished"
    stats: Mapping[str, Any] | None = None  # its last task_report()


@dataclass(frozen=True, slots=True)
class TaskFailed(TaskReport):
    method = "task_failed"
    error: str = "?"
    traceback: str = ""  # the task's, for the exception history
    fatal: bool = False  # a restart cannot repair it (the exception says `unrecoverable`): fail the job at once


@dataclass(frozen=True, slots=True)
class SlowCall(TaskReport):
    """A user call of the task has been running past the worker's threshold (it may still return)."""

    method = "slow_call"
    function: str = "?"  # "module.function (file:line)"
    stack: str = ""  # the task thread's stack when it was found
    running_s: float = 0.0


@dataclass(frozen=True, slots=True)
class JobError(Message):
    method = "job_error"
    job_id: str
    attempt: int
    error: str = "?"


REPORTS: tuple[type[Message], ...] = (Register, Heartbeat, AckCheckpoint, DeclineCheckpoint, ProbeDone, TaskEnded,
                                      TaskFinished, TaskFailed, SlowCall, JobError)

# -- what clients ask -------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class JobQuery(Message):
    """A request about one job."""

    method = ""
    job_id: str


@dataclass(frozen=True, slots=True)
class Cancel(JobQuery):
    """Cancel the job; with `savepoint`, stop it with a savepoint first (coordinator/upgrade.py)."""

    method = "cancel"
    savepoint: bool = False
    directory: str | None = None  # the savepoint's (None: the configured savepoint directory)
    timeout_s: float = 600.0


@dataclass(frozen=True, slots=True)
class Checkpoints(JobQuery):
    method = "checkpoints"


@dataclass(frozen=True, slots=True)
class Status(Message):
    method = "status"
    job_id: str | None = None  # None: the cluster's overview


@dataclass(frozen=True, slots=True)
class WaitJob(JobQuery):
    method = "wait_job"
    timeout_s: float | None = None  # None: the coordinator's longest wait


@dataclass(frozen=True, slots=True)
class Probe(JobQuery):
    method = "probe"
    timeout_s: float = 30.0


@dataclass(frozen=True, slots=True)
class TakeCheckpoint(JobQuery):
    method = "checkpoint"
    savepoint: bool = False
    directory: str | None = None  # a savepoint's (None: the configured savepoint directory)
    mode: str | None = None  # None: the job's own mode
    timeout_s: float = 600.0


@dataclass(frozen=True, slots=True)
class Rescale(JobQuery):
    method = "rescale"
    parallelism: Mapping[str, Any] | None = None  # NAME or "*" -> N >= 1 (the handler checks the values)
    timeout_s: float = 600.0


@dataclass(frozen=True, slots=True)
class Upgrade(JobQuery):
    """Stop the job with a savepoint and start `entry` from it (coordinator/upgrade.py)."""

    method = "upgrade"
    entry: str = ""
    name: str | None = None  # None: the running job's
    sys_path: str | None = None  # None: the running job's
    parallelism: Mapping[str, Any] | None = None  # NAME/uid or "*" -> N >= 1, merged as a rescale's
    allow_non_restored_state: bool = False
    directory: str | None = None  # the savepoint's (None: the configured savepoint directory)
    timeout_s: float = 600.0


@dataclass(frozen=True, slots=True)
class WorkerLog(Message):
    method = "worker_log"
    worker_id: str
    lines: int = 200  # the handler keeps it within 1..1000


@dataclass(frozen=True, slots=True)
class Submit(Message):
    method = "submit"
    entry: str = ""
    name: str | None = None
    config: Mapping[str, Any] | None = None  # JobConfig's document with "checkpoint" and "restart" settings
    sys_path: str | None = None
    restore: str | None = None  # a checkpoint or savepoint to start from


# -- what the coordinator asks of workers -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Deploy(Message):
    method = "deploy"
    plan: Mapping[str, Any]  # Plan.to_dict(): the worker builds its Plan from it


@dataclass(frozen=True, slots=True)
class StartJob(JobQuery):
    method = "start"


@dataclass(frozen=True, slots=True)
class CancelJob(JobQuery):
    method = "cancel"
    attempt: int | None = None  # None: whichever attempt runs


@dataclass(frozen=True, slots=True)
class TriggerCheckpoint(JobQuery):
    method = "trigger_checkpoint"
    attempt: int
    checkpoint_id: int
    options: CheckpointOptions  # how to take it, as the coordinator decided at the request
    started_at: float  # wall clock of the trigger
    directory: str


@dataclass(frozen=True, slots=True)
class CheckpointNotice(JobQuery):
    """checkpoint_complete (sinks commit) or checkpoint_aborted, to every task of the attempt."""

    method = "checkpoint_complete"
    checkpoint_id: int
    attempt: int | None = None


@dataclass(frozen=True, slots=True)
class InjectProbe(JobQuery):
    method = "probe"
    probe_id: int


@dataclass(frozen=True, slots=True)
class LogTail(Message):
    method = "log_tail"
    lines: int = 200
