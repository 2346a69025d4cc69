"""What the RPC calls answer, as typed values: each request of runtime/graph/protocol.py names one of these as
its `reply`, and `protocol.call(link, message)` returns it.

A reply is a frozen dataclass whose fields are the keys its readers rely on. `to_wire()` is the document the
handler always sent (the field names as keys, then `extra`); `from_wire()` checks the declared fields and
keeps every other key in `extra`, so a coordinator of a newer version may add keys without breaking an older
client, and a reply read and sent again is the same document. A field declared with `optional()` is left out
of the document while it is None (the handler never sent it then).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import Field, dataclass, field, fields
from types import MappingProxyType
from typing import Any, TypeVar

from runtime.graph.wire import decode_fields, encode_value

R = TypeVar("R", bound="Reply")

_OMIT_NONE = "omit_none"


def optional() -> Any:
    """A field that may be absent from the document (None here, and not sent while None)."""
    return field(default=None, metadata={_OMIT_NONE: True})


def _no_extra() -> Mapping[str, Any]:
    return MappingProxyType({})


class BadReply(ValueError):
    """A reply that does not fit its call's reply type: the peer broke the protocol (a version mismatch)."""


@dataclass(frozen=True, slots=True)
class Reply:
    extra: Mapping[str, Any] = field(default_factory=_no_extra, kw_only=True)  # keys this version does not read

    def to_wire(self) -> dict[str, Any]:
        doc = dict(self.extra)
        for f in _declared(type(self)):
            value = getattr(self, f.name)
            if value is None and f.metadata.get(_OMIT_NONE):
                continue
            doc[f.name] = encode_value(value)
        return doc

    @classmethod
    def from_wire(cls: type[R], doc: Any) -> R:
        if not isinstance(doc, Mapping):
            raise BadReply(f"{cls.__name__}: the reply must be an object, got {doc!r}")
        declared = _declared(cls)
        values = decode_fields(declared, doc, lambda problem: BadReply(
            f"{cls.__name__}: {problem} (the reply was {str(dict(doc))[:200]})"))
        names = {f.name for f in declared}
        extra = MappingProxyType({k: v for k, v in doc.items() if k not in names})
        return cls(**values, extra=extra)


def _declared(cls: type[Reply]) -> list[Field[Any]]:
    return [f for f in fields(cls) if f.name != "extra"]


# -- answers to workers' reports and to the coordinator's instructions ------------------------------------------


@dataclass(frozen=True, slots=True)
class Ok(Reply):
    """Taken (or, `ignored`, a report of an attempt that is no longer the current)."""

    ignored: bool = False

    def to_wire(self) -> dict[str, Any]:
        return {**self.extra, "ignored": True} if self.ignored else {**self.extra, "ok": True}

    @classmethod
    def from_wire(cls, doc: Any) -> Ok:
        if not isinstance(doc, Mapping):
            raise BadReply(f"Ok: the reply must be an object, got {doc!r}")
        return cls(ignored=bool(doc.get("ignored")),
                   extra=MappingProxyType({k: v for k, v in doc.items() if k not in ("ok", "ignored")}))


@dataclass(frozen=True, slots=True)
class Deployed(Reply):
    tasks: list[Any]  # the task ids deployed on the worker


@dataclass(frozen=True, slots=True)
class Started(Reply):
    started: int  # tasks started


@dataclass(frozen=True, slots=True)
class CancelledHere(Reply):
    cancelled: bool  # False: the worker runs a later attempt, which the cancel does not stop


@dataclass(frozen=True, slots=True)
class SourcesReached(Reply):
    """A checkpoint trigger or a probe: how many source tasks of the worker took it."""

    sources: int


@dataclass(frozen=True, slots=True)
class Notified(Reply):
    tasks: int  # tasks told that a checkpoint completed or was aborted (0: another attempt's notice)


@dataclass(frozen=True, slots=True)
class LogLines(Reply):
    lines: list[Any]
    worker_id: str | None = None


@dataclass(frozen=True, slots=True)
class Profile(Reply):
    """A worker's profile of itself (runtime/worker/profiler.py): py-spy's collapsed stacks."""

    worker_id: str
    seconds: int
    rate_hz: int  # samples a second per thread
    samples: int  # every sample taken, those of the stacks left out to fit the reply too
    stacks: list[Any]  # [thread, task or None, "frame;frame;..." root first, samples], most samples first
    dropped_samples: int = 0  # of the thinnest stacks, left out to fit the reply


# -- answers to clients ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Submitted(Reply):
    job_id: str
    tasks: int


@dataclass(frozen=True, slots=True)
class JobSummary(Reply):
    """One job (coordinator/jobs.py JobRecord.summary); `status` adds its "scaling"."""

    job_id: str
    name: str
    state: str
    tasks_total: int
    tasks_finished: int
    tasks: list[Any]  # one document per task: state, records, busy/idle/backpressured seconds, worker
    attempt: int = 0
    error: str | None = None
    final_checkpoint_id: int | None = None
    checkpoints_completed: int = 0
    vertices: list[Any] = field(default_factory=list)  # {"id", "name", "parallelism"[, "asked_parallelism"]}

    @property
    def scaling(self) -> Mapping[str, Any]:
        return self.extra.get("scaling") or {}


@dataclass(frozen=True, slots=True)
class ClusterOverview(Reply):
    workers: list[Any]
    jobs: list[Any]  # {"job_id", "name", "state", "error"}
    coordinator: Mapping[str, Any] | None = optional()  # id, lease epoch, recovered jobs


@dataclass(frozen=True, slots=True)
class Cancelled(Reply):
    state: str
    savepoint: str | None = optional()  # a stop with a savepoint: its path
    checkpoint_id: int | None = optional()


@dataclass(frozen=True, slots=True)
class CheckpointDone(Reply):
    """A checkpoint or savepoint taken on request: COMPLETED with its path, or ABORTED with the reason."""

    status: str
    checkpoint_id: int | None = optional()  # None: the job stopped before one was started
    path: str | None = optional()
    reason: str | None = optional()

    @property
    def completed(self) -> bool:
        return self.status == "COMPLETED"


@dataclass(frozen=True, slots=True)
class CheckpointList(Reply):
    job_id: str
    history: list[Any]  # the coordinator's recent checkpoints, newest last (CheckpointSummary documents)
    retained: list[Any]  # {"checkpoint_id", "path"} of the completed checkpoints storage keeps
    last_completed: Mapping[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class Rescaled(Reply):
    job_id: str
    attempt: int
    downtime_s: float
    vertices: list[Any]  # {"name", "parallelism"} as it runs now
    checkpoint_id: int | None = None  # the one the job was restored from
    requested_checkpoint_id: int | None = None
    inflight_bytes: int | None = None
    mode: str | None = None


@dataclass(frozen=True, slots=True)
class Upgraded(Reply):
    job_id: str
    previous_job_id: str
    savepoint: str
    checkpoint_id: int
    savepoint_s: float
    downtime_s: float
    vertices: list[Any]


@dataclass(frozen=True, slots=True)
class ProbeResult(Reply):
    probe_id: int
    complete: bool
    tasks_total: int
    tasks: list[Any]  # {"task", "arrival_s", "overtaken_output_buffers", "overtaken_input_buffers"}, by arrival
    duration_s: float | None = None
