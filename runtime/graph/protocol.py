"""The coordinator's RPC payloads as typed messages: what workers report about their tasks, and what clients ask.

Each message is a frozen dataclass with the RPC `method` it travels as. `to_wire()` is the msgpack document
(the field names as keys, the shape the handlers always read); `from_wire()` checks a received document
field by field and raises BadArguments naming the field, so a malformed call is refused with a reason
(InvalidRequest on the wire) instead of failing inside a handler. Fields with a default may be absent.

Each message also names the `reply` its call answers (runtime/graph/replies.py): `call(link, message)` sends it
and returns that reply, checked. A handler table registers each handler with its message type
(runtime/common/dispatch.py typed_handlers) and sends the reply a handler returns as its `to_wire()` document.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, Generic, Protocol, TypeVar, cast

from runtime.common.dispatch import BadArguments
from runtime.graph import replies as r
from runtime.graph.checkpoint_figures import TaskCheckpointFigures
from runtime.graph.checkpoint_options import CheckpointOptions
from runtime.graph.wire import decode_fields, encode_value

M = TypeVar("M", bound="Message[Any]")
R = TypeVar("R", bound=r.Reply)


@dataclass(frozen=True, slots=True)
class Message(Generic[R]):
    method: ClassVar[str]
    reply: ClassVar[type[r.Reply]]  # what the call answers (runtime/graph/replies.py)

    def reply_type(self) -> type[R]:
        return cast("type[R]", self.reply)

    def to_wire(self) -> dict[str, Any]:
        return {f.name: encode_value(getattr(self, f.name)) for f in fields(self)}

    @classmethod
    def from_wire(cls: type[M], doc: Any) -> M:
        if not isinstance(doc, Mapping):
            raise BadArguments(f"{cls.method}: arguments must be an object, got {doc!r}")
        return cls(**decode_fields(fields(cls), doc, lambda problem: BadArguments(f"{cls.method}: {problem}")))


# -- what workers report ----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Register(Message[r.Ok]):
    method = "register"
    reply = r.Ok
    slots: int
    host: str
    data_port: int
    id: str = ""
    metrics_port: int | None = None
    pid: int | None = None


TASK_IDENTITY = ("job", "task", "attempt")  # what names a task report's task, in every heartbeat entry


def task_report_key(report: Mapping[str, Any]) -> tuple[Any, Any, Any]:
    return report.get("job"), report.get("task"), report.get("attempt")


@dataclass(frozen=True, slots=True)
class Heartbeat(Message[r.Ok]):
    """A worker is alive, with its tasks' statistics: `tasks` carries whole reports (runtime/worker/worker.py
    task_report()), `changes` only the fields that changed since the heartbeat before, for tasks the coordinator
    holds a report of (runtime/worker/heartbeat_reports.py). Together they name every task the worker runs; an
    older worker sends whole reports only."""

    method = "heartbeat"
    reply = r.Ok
    id: str = ""
    tasks: list[Any] = field(default_factory=list)
    process: Mapping[str, Any] | None = None  # the worker process's memory and CPU (log_tail.process_figures)
    changes: list[Any] = field(default_factory=list)

    @classmethod
    def from_wire(cls, doc: Any) -> Heartbeat:
        beat = Message.from_wire.__func__(cls, doc)  # type: ignore[attr-defined]
        for name in ("tasks", "changes"):
            for i, entry in enumerate(getattr(beat, name)):
                if not isinstance(entry, Mapping):
                    raise BadArguments(f"{cls.method}: {name}[{i}] must be an object, got {entry!r}")
                job, task, attempt = task_report_key(entry)
                if not isinstance(job, str) or not isinstance(task, str) or not isinstance(attempt, int):
                    raise BadArguments(f"{cls.method}: {name}[{i}] must name its job, task and attempt "
                                       f"(got {job!r}, {task!r}, {attempt!r})")
        return cast("Heartbeat", beat)


@dataclass(frozen=True, slots=True)
class TaskReport(Message[r.Ok]):
    """About one task of one attempt: the coordinator ignores reports of an attempt that is not the current."""

    reply = r.Ok
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
class AckCheckpoints(Message[r.Ok]):
    """The acknowledgements of several tasks of one job attempt, from one worker in one call: the coordinator's
    per-message work per checkpoint is one call per worker instead of one per task. On the wire each
    acknowledgement is an AckCheckpoint's document without the job and attempt, checked as one when decoded."""

    method = "ack_checkpoints"
    reply = r.Ok
    job_id: str
    attempt: int
    acks: list[Any] = field(default_factory=list)  # AckCheckpoint, each of this job attempt

    def to_wire(self) -> dict[str, Any]:
        return {"job_id": self.job_id, "attempt": self.attempt,
                "acks": [{k: v for k, v in ack.to_wire().items() if k not in ("job_id", "attempt")}
                         for ack in self.acks]}

    @classmethod
    def from_wire(cls, doc: Any) -> AckCheckpoints:
        batch = Message.from_wire.__func__(cls, doc)  # type: ignore[attr-defined]
        acks = []
        for i, ack in enumerate(batch.acks):
            if not isinstance(ack, Mapping):
                raise BadArguments(f"{cls.method}: acks[{i}] must be an object, got {ack!r}")
            acks.append(AckCheckpoint.from_wire({**ack, "job_id": batch.job_id, "attempt": batch.attempt}))
        return cls(batch.job_id, batch.attempt, acks)


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
class JobError(Message[r.Ok]):
    method = "job_error"
    reply = r.Ok
    job_id: str
    attempt: int
    error: str = "?"


REPORTS: tuple[type[Message], ...] = (Register, Heartbeat, AckCheckpoint, AckCheckpoints, DeclineCheckpoint,
                                      ProbeDone, TaskEnded, TaskFinished, TaskFailed, SlowCall, JobError)

# -- what clients ask -------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class JobQuery(Message[R]):
    """A request about one job."""

    method = ""
    job_id: str


@dataclass(frozen=True, slots=True)
class Cancel(JobQuery[r.Cancelled]):
    """Cancel the job; with `savepoint`, stop it with a savepoint first (coordinator/upgrade.py)."""

    method = "cancel"
    reply = r.Cancelled
    savepoint: bool = False
    directory: str | None = None  # the savepoint's (None: the configured savepoint directory)
    timeout_s: float = 600.0


@dataclass(frozen=True, slots=True)
class Checkpoints(JobQuery[r.CheckpointList]):
    method = "checkpoints"
    reply = r.CheckpointList


@dataclass(frozen=True, slots=True)
class Status(Message[r.JobSummary | r.ClusterOverview]):
    """What the handler decodes; a caller sends JobStatus or Overview, which say which answer they get."""

    method = "status"
    job_id: str | None = None  # None: the cluster's overview

    def reply_type(self) -> type[r.JobSummary | r.ClusterOverview]:  # type: ignore[override]
        return r.JobSummary if self.job_id else r.ClusterOverview


@dataclass(frozen=True, slots=True)
class JobStatus(JobQuery[r.JobSummary]):
    """`status` of one job."""

    method = "status"
    reply = r.JobSummary


@dataclass(frozen=True, slots=True)
class Overview(Message[r.ClusterOverview]):
    """`status` of the cluster: its workers and jobs."""

    method = "status"
    reply = r.ClusterOverview


@dataclass(frozen=True, slots=True)
class WaitJob(JobQuery[r.JobSummary]):
    method = "wait_job"
    reply = r.JobSummary
    timeout_s: float | None = None  # None: the coordinator's longest wait


@dataclass(frozen=True, slots=True)
class Probe(JobQuery[r.ProbeResult]):
    method = "probe"
    reply = r.ProbeResult
    timeout_s: float = 30.0


@dataclass(frozen=True, slots=True)
class TakeCheckpoint(JobQuery[r.CheckpointDone]):
    method = "checkpoint"
    reply = r.CheckpointDone
    savepoint: bool = False
    directory: str | None = None  # a savepoint's (None: the configured savepoint directory)
    mode: str | None = None  # None: the job's own mode
    timeout_s: float = 600.0


@dataclass(frozen=True, slots=True)
class Rescale(JobQuery[r.Rescaled]):
    method = "rescale"
    reply = r.Rescaled
    parallelism: Mapping[str, Any] | None = None  # NAME or "*" -> N >= 1 (the handler checks the values)
    timeout_s: float = 600.0


@dataclass(frozen=True, slots=True)
class Upgrade(JobQuery[r.Upgraded]):
    """Stop the job with a savepoint and start `entry` from it (coordinator/upgrade.py)."""

    method = "upgrade"
    reply = r.Upgraded
    entry: str = ""
    name: str | None = None  # None: the running job's
    sys_path: str | None = None  # None: the running job's
    parallelism: Mapping[str, Any] | None = None  # NAME/uid or "*" -> N >= 1, merged as a rescale's
    allow_non_restored_state: bool = False
    directory: str | None = None  # the savepoint's (None: the configured savepoint directory)
    timeout_s: float = 600.0


@dataclass(frozen=True, slots=True)
class WorkerLog(Message[r.LogLines]):
    method = "worker_log"
    reply = r.LogLines
    worker_id: str
    lines: int = 200  # the handler keeps it within 1..1000


PROFILE_SECONDS = (1, 30)  # how long a profile of a worker may sample (runtime/worker/profiler.py)


@dataclass(frozen=True, slots=True)
class WorkerProfile(Message[r.Profile]):
    """Profile a worker for `seconds` (py-spy on its process): the coordinator asks the worker (`Profile`)."""

    method = "worker_profile"
    reply = r.Profile
    worker_id: str
    seconds: int = 5  # within PROFILE_SECONDS, or the call is refused


@dataclass(frozen=True, slots=True)
class Submit(Message[r.Submitted]):
    method = "submit"
    reply = r.Submitted
    entry: str = ""
    name: str | None = None
    config: Mapping[str, Any] | None = None  # JobConfig's document with "checkpoint" and "restart" settings
    sys_path: str | None = None
    restore: str | None = None  # a checkpoint or savepoint to start from


# -- what the coordinator asks of workers -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Deploy(Message[r.Deployed]):
    method = "deploy"
    reply = r.Deployed
    plan: Mapping[str, Any]  # Plan.to_dict(): the worker builds its Plan from it


@dataclass(frozen=True, slots=True)
class StartJob(JobQuery[r.Started]):
    method = "start"
    reply = r.Started


@dataclass(frozen=True, slots=True)
class CancelJob(JobQuery[r.CancelledHere]):
    method = "cancel"
    reply = r.CancelledHere
    attempt: int | None = None  # None: whichever attempt runs


@dataclass(frozen=True, slots=True)
class TriggerCheckpoint(JobQuery[r.SourcesReached]):
    method = "trigger_checkpoint"
    reply = r.SourcesReached
    attempt: int
    checkpoint_id: int
    options: CheckpointOptions  # how to take it, as the coordinator decided at the request
    started_at: float  # wall clock of the trigger
    directory: str


@dataclass(frozen=True, slots=True)
class CheckpointNotice(JobQuery[r.Notified]):
    """checkpoint_complete (sinks commit), to every task of the attempt."""

    method = "checkpoint_complete"
    reply = r.Notified
    checkpoint_id: int
    attempt: int | None = None


@dataclass(frozen=True, slots=True)
class CheckpointAborted(CheckpointNotice):
    method = "checkpoint_aborted"


@dataclass(frozen=True, slots=True)
class InjectProbe(JobQuery[r.SourcesReached]):
    method = "probe"
    reply = r.SourcesReached
    probe_id: int


@dataclass(frozen=True, slots=True)
class LogTail(Message[r.LogLines]):
    method = "log_tail"
    reply = r.LogLines
    lines: int = 200


@dataclass(frozen=True, slots=True)
class Profile(Message[r.Profile]):
    method = "profile"
    reply = r.Profile
    seconds: int = 5


# -- calling ----------------------------------------------------------------------------------------------------


class Caller(Protocol):
    """Anything that makes an RPC call by name (netstack's Link)."""

    async def call(self, method: str, args: dict[str, Any], *, timeout_s: float = ...) -> Any: ...


async def call(link: Caller, message: Message[R], *, timeout_s: float = 30.0) -> R:
    """Send `message` on `link` and return its reply, checked (BadReply when it does not fit)."""
    answer = await link.call(message.method, message.to_wire(), timeout_s=timeout_s)
    return message.reply_type().from_wire(answer)
