"""The checkpoint coordinator of one job, as a pure state machine.

It owns when checkpoints start, which acknowledgements complete them, when
they are aborted, how many failures the job tolerates and which completed
checkpoints are retained. It does no I/O and never reads the clock: every
stimulus method takes `now` and returns a list of instructions that a thin
shell executes (RPCs to tasks, writing `_metadata` through
coordinator/storage.py, deleting directories, failing the job), in the manner
of dask's `WorkerState.handle_stimulus`.

Life of one checkpoint:

    PENDING --last ack--> READY --older ones ended--> WRITING --metadata_written--> COMPLETED
       |                                                 '-----metadata_failed----> FAILED
       '--decline | timeout | task_failed | subsumed---------------------------------> FAILED

Concurrent checkpoints: several may be in flight where a newer barrier
cannot abandon an older one still aligning (`may_overlap`): unaligned ones
beside each other and beside one savepoint, and a plain aligned one (a
savepoint, or aligned without switching) beside any but at-least-once ones, its barriers
in-band behind theirs. Tasks take a newer barrier only once an older
unaligned checkpoint's inputs are complete there, and persist both at once;
an unaligned barrier that reaches a task aligning a savepoint is taken at
once beside it (runtime/checkpointing/barriers.py), so periodic unaligned
checkpoints start and complete while a savepoint aligns. An unaligned
checkpoint started beside a savepoint leaves the next id unused: tasks where
it overtook the savepoint snapshot the two out of id order, and label the
savepoint's sink pre-commits with that id (TaskCheckpointer._sink_label).
Completion stays in id order but for savepoints: a checkpoint whose acks are
all in is READY and writes its `_metadata` only when every older checkpoint
(not savepoint) has ended, so the latest completed checkpoint is always the
newest one (recovery uses it, never a savepoint); a savepoint waits for
every older one, and holds no newer one back.
A savepoint's completion is not told to the tasks unless the job stops with
it (`NotifyComplete.tasks`): its sinks' output is committed by the next
checkpoint, as Flink's savepoints commit no side effects.
When a checkpoint (not a savepoint) has all its acks, the older checkpoints
(not savepoints) still collecting acks are subsumed: aborted without
counting as failures, as Flink does; a savepoint is never subsumed and
completes on its own.

Scheduling:
- Periodic checkpoints: `tick` triggers one when `interval_s` has passed
  since the last trigger (of any kind), `min_pause_s` has passed since the
  last checkpoint ended, fewer than `max_concurrent` periodic ones are in
  flight (with the default of 1: none), and `may_overlap` allows it beside
  what is in flight: a periodic checkpoint, aligned or unaligned, starts
  while a savepoint aligns. Periodic triggers that fall due meanwhile are
  skipped, not queued.
- Manual checkpoints and savepoints (`request`) start at once when no other
  request is in flight and `may_overlap` allows it, so a savepoint never
  waits behind periodic aligned or unaligned checkpoints. Otherwise they are
  queued, FIFO, and start as soon as that allows (`min_pause_s` does not
  apply to them). The id is assigned at request
  time, so ids increase in request order; a queued request is started before
  any later periodic trigger.
- The timeout covers collecting acknowledgements only. Once every task has
  acknowledged, the tasks' state is durable and the checkpoint waits for the
  shell to report `metadata_written` or `metadata_failed`; a task failure
  then no longer aborts it either, so recovery may use it.
- Storage that lost files (a wiped or expired bucket): the shell checks that
  every file a checkpoint names is in storage before it writes `_metadata`;
  if not, `metadata_failed(..., files_lost=True)` aborts it and every later
  checkpoint (not savepoints) is triggered `full` (shares no file with an
  earlier one) until one of them completes: incremental checkpoints would
  otherwise go on referencing the lost files.
- A task failure aborts a PENDING checkpoint and drops every queued request
  (a failed execution cannot serve them): each dropped request gets a
  `NotifyAborted` and nothing else, since nothing was triggered or written.

Finished tasks (FLIP-147): `task_finished` records a task that has finished
(its last state is in a completed checkpoint and its sinks published it).
It counts as acknowledged, with the state `{"finished": True}`, in the
in-flight checkpoint (if it had not acknowledged yet) and every later one, so
checkpoints go on while the rest of the job runs, and restoring one of them
treats the task as finished.

Failures: every abort of a checkpoint counts one consecutive failure, and a
completed checkpoint resets the count; when the count exceeds
`tolerable_failures` the coordinator emits `FailJob`, drops queued requests
and ignores every later stimulus. Savepoints neither count nor reset: a
savepoint to a bad directory is reported to the user and must not kill the
job.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from runtime.graph.checkpoint_figures import CheckpointFigures, TaskCheckpointFigures
from runtime.graph.checkpoint_options import CheckpointOptions
from runtime.graph.config import parse_bytes, parse_duration, parse_duration_or_zero, parse_positive
from runtime.graph.enums import CHECKPOINT_MODES, CheckpointMode
from runtime.graph.flags import flag
from runtime.graph.job_config import CHECKPOINTS as GROUP

HISTORY_SIZE = 50
FINISHED_STATE = {"finished": True}  # what a finished task "acknowledges" (workers restore it as finished)


def check_mode(mode: str, aligned_timeout_s: float | None) -> CheckpointMode:
    """The mode named `mode`; ValueError for an unknown one or an aligned_timeout mode without its timeout."""
    if mode not in CHECKPOINT_MODES:
        raise ValueError(f"unknown checkpoint mode {mode!r}; accepted modes: {', '.join(CHECKPOINT_MODES)}")
    if mode == CheckpointMode.ALIGNED_TIMEOUT and aligned_timeout_s is None:
        raise ValueError("checkpoint mode 'aligned_timeout' needs aligned_timeout_s")
    return CheckpointMode(mode)


def may_overlap(new: CheckpointOptions, in_flight: Iterable[CheckpointOptions]) -> bool:
    """Whether a checkpoint taken as `new` may start while the checkpoints `in_flight` are still in progress.

    A task abandons a checkpoint that is aligning when a newer barrier reaches it, unless it can take the newer
    one beside it (runtime/checkpointing/barriers.py), so a newer checkpoint may start only where its barriers
    cannot abandon an older aligning one:

    - unaligned, beside unaligned checkpoints and at most one savepoint: the unaligned ones' barriers travel
      on the priority lane and do not align; a task holds a newer barrier back until an older unaligned one's
      inputs are complete there. The savepoint's barriers are fences in the output queues (a priority barrier
      overtakes only the data after them, netstack/credit.py), and a task aligning it takes the unaligned
      barrier at once beside it instead of abandoning it; there is room for one such checkpoint at a task.
      (The tasks would do the same for a periodic plain aligned checkpoint, but a newer checkpoint that
      completes subsumes it: not worth starting a manual unaligned one beside it.)
    - as a plain aligned checkpoint, beside any checkpoints but at-least-once ones: its barriers travel in-band
      behind every older barrier in each channel (the coordinator triggers the sources in id order,
      checkpoint_runner.py), so a task takes one only after the older barrier on that channel, whose channel
      stays blocked until the older alignment is done. Its alignment then waits behind the older one's and
      the little data between the two barriers, not behind a whole queue.

    Never an aligned_timeout or switching checkpoint beside an older aligned one: its barriers go on the
    priority lane at the deadline or at a channel's switch, and a task aligning the older one would abandon
    it (a savepoint must stay aligned: it cannot switch). Never a newer unaligned one beside those either, nor
    beside two plain aligned ones. An at-least-once checkpoint blocks no channel, so a newer barrier may reach
    a task before its own.
    """
    older = list(in_flight)
    unaligned = [o.mode == CheckpointMode.UNALIGNED and not o.savepoint for o in older]
    if all(unaligned):
        return True
    if new.mode == CheckpointMode.UNALIGNED and not new.savepoint:
        others = [o for o, u in zip(older, unaligned, strict=True) if not u]
        return len(others) == 1 and others[0].savepoint
    return new.plain_aligned and all(o.mode != CheckpointMode.AT_LEAST_ONCE for o in older)


def _cli_mode(text: str) -> str:
    return text.replace("-", "_")


@dataclass(frozen=True)
class CheckpointSettings:
    """A job's checkpoint settings (README, Checkpoints); each field's flag is its `sluice submit` option."""

    interval_s: float | None = field(metadata=flag(  # None = no periodic checkpoints
        "--checkpoint-interval", "take a checkpoint every INTERVAL (e.g. 1s)", parse=parse_duration, group=GROUP))
    timeout_s: float = field(default=60.0, metadata=flag(
        "--checkpoint-timeout", "abort a checkpoint after (60s)", parse=parse_duration, group=GROUP))
    # between the end of one checkpoint and the start of the next
    min_pause_s: float = field(default=0.0, metadata=flag(
        "--min-pause", "pause between checkpoints (0)", parse=parse_duration_or_zero, group=GROUP))
    # consecutive failed checkpoints tolerated; one more -> FailJob (the command line's default is 3)
    tolerable_failures: int = field(default=0, metadata=flag(
        "--tolerable-failures", "consecutive failed checkpoints tolerated (3)", parse=int, default=3, group=GROUP))
    # aligned | unaligned | aligned_timeout (the command line's --aligned-timeout) | at_least_once
    mode: CheckpointMode = field(default=CheckpointMode.ALIGNED, metadata=flag(
        "--checkpoint-mode", choices=("aligned", "unaligned", "at-least-once"), to_field=_cli_mode, group=GROUP))
    aligned_timeout_s: float | None = field(default=None, metadata=flag(  # used with mode aligned_timeout
        "--aligned-timeout", "aligned checkpoints switch to unaligned after this long (e.g. 100ms)",
        parse=parse_duration, group=GROUP))
    retain: int = field(default=3, metadata=flag(  # completed checkpoints kept
        "--retain", "completed checkpoints kept (3)", parse=parse_positive, group=GROUP))
    # aligned checkpoints whose channels switch to unaligned one by one (runtime/checkpointing/barriers.py):
    # at a barrier's wait behind data, or at the bytes ahead of it; and the cap on a task's persisted
    # in-flight bytes per checkpoint that bounds those switches
    channel_timeout_s: float | None = field(default=None, metadata=flag(
        "--channel-timeout", "with aligned: a channel whose barrier has waited this long behind data switches to "
        "unaligned on its own, the others stay aligned (e.g. 10ms)", parse=parse_duration, group=GROUP))
    channel_inflight_bytes: int | None = field(default=None, metadata=flag(
        "--channel-inflight", "with aligned: a channel whose barrier waits behind more than this much data "
        "switches to unaligned on its own (e.g. 256KiB)", parse=parse_bytes, metavar="BYTES", group=GROUP))
    max_inflight_bytes: int | None = field(default=None, metadata=flag(
        "--max-inflight", "with --channel-timeout/--channel-inflight: the most in-flight data a task persists "
        "per checkpoint; a switch that does not fit stays aligned (e.g. 4MiB)", parse=parse_bytes,
        metavar="BYTES", group=GROUP))
    # periodic checkpoints in flight at once (more than one: unaligned only)
    max_concurrent: int = field(default=1, metadata=flag(
        "--max-concurrent", "with unaligned: periodic checkpoints in flight at once (1)", parse=parse_positive,
        group=GROUP))

    def __post_init__(self) -> None:
        object.__setattr__(self, "mode", check_mode(self.mode, self.aligned_timeout_s))
        switching = self.channel_timeout_s is not None or self.channel_inflight_bytes is not None
        if switching and self.mode != CheckpointMode.ALIGNED:
            raise ValueError(f"channel_timeout_s / channel_inflight_bytes switch aligned checkpoints channel by "
                             f"channel; they do not apply to mode {self.mode!r}")
        for name in ("channel_timeout_s", "channel_inflight_bytes", "max_inflight_bytes"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"{name} must be positive or None, got {value}")
        if self.max_inflight_bytes is not None and not switching:
            raise ValueError("max_inflight_bytes caps the channel switches of an aligned checkpoint: set "
                             "channel_timeout_s or channel_inflight_bytes too")
        if self.max_concurrent < 1:
            raise ValueError(f"max_concurrent must be at least 1, got {self.max_concurrent}")
        if self.max_concurrent > 1 and self.mode != CheckpointMode.UNALIGNED:
            raise ValueError("max_concurrent > 1 needs mode 'unaligned': an aligned checkpoint is subsumed by the "
                             "next one's barriers, so they cannot overlap")
        if self.interval_s is not None and self.interval_s <= 0:
            raise ValueError(f"interval_s must be positive or None, got {self.interval_s}")
        if self.timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {self.timeout_s}")
        if self.min_pause_s < 0:
            raise ValueError(f"min_pause_s must not be negative, got {self.min_pause_s}")
        if self.tolerable_failures < 0:
            raise ValueError(f"tolerable_failures must not be negative, got {self.tolerable_failures}")
        if self.aligned_timeout_s is not None and self.aligned_timeout_s <= 0:
            raise ValueError(f"aligned_timeout_s must be positive or None, got {self.aligned_timeout_s}")
        if self.retain < 1:
            raise ValueError(f"retain must be at least 1, got {self.retain}")

    def options(self, mode: str | None = None, *, savepoint: bool = False) -> CheckpointOptions:
        """How one checkpoint of this job is taken: in `mode` (None: the job's), as a savepoint (always aligned,
        never switching channels) or not; only the settings its mode uses are set. ValueError for a bad mode."""
        if savepoint:
            if mode not in (None, CheckpointMode.ALIGNED):
                raise ValueError(f"savepoints are always aligned; cannot take one in mode {mode!r}")
            mode = CheckpointMode.ALIGNED
        chosen = self.mode if mode is None else check_mode(mode, self.aligned_timeout_s)
        switching = chosen == CheckpointMode.ALIGNED and not savepoint
        return CheckpointOptions(
            chosen, savepoint,
            aligned_timeout_s=self.aligned_timeout_s if chosen == CheckpointMode.ALIGNED_TIMEOUT else None,
            channel_timeout_s=self.channel_timeout_s if switching else None,
            channel_inflight_bytes=self.channel_inflight_bytes if switching else None,
            max_inflight_bytes=self.max_inflight_bytes if switching else None)


# -- instructions for the shell ---------------------------------------------------


@dataclass(frozen=True)
class Trigger:
    """Tell the sources to start checkpoint `checkpoint_id`, taken as `options` say (the shell sends them on as
    they are: the `trigger_checkpoint` message, then every barrier, carries the same value).

    `directory` is the user's savepoint directory (None for checkpoints, which
    go to the job's checkpoint storage).
    """

    checkpoint_id: int
    options: CheckpointOptions
    directory: str | None
    started_at: float

    @property
    def savepoint(self) -> bool:
        return self.options.savepoint


@dataclass(frozen=True)
class WriteMetadata:
    """Every task acknowledged: write `_metadata`, then call metadata_written or metadata_failed."""

    checkpoint_id: int
    directory: str | None
    savepoint: bool
    mode: CheckpointMode
    acks: dict[str, dict[str, Any]] = field(hash=False)  # task -> TaskAck.to_wire(), as _metadata holds it
    started_at: float
    completed_at: float


@dataclass(frozen=True)
class NotifyComplete:
    """`_metadata` is durable: tell whoever asked, and every task (sinks commit) unless `tasks` is False (a
    savepoint that commits nothing, below)."""

    checkpoint_id: int
    tasks: bool = True


@dataclass(frozen=True)
class NotifyAborted:
    """Tell every task (sinks roll back) and whoever requested the checkpoint."""

    checkpoint_id: int
    reason: str


@dataclass(frozen=True)
class DiscardCheckpoint:
    """Delete the checkpoint's files; for a savepoint, its directory under `directory`."""

    checkpoint_id: int
    reason: str
    savepoint: bool = False
    directory: str | None = None


@dataclass(frozen=True)
class FailJob:
    reason: str


Instruction = Trigger | WriteMetadata | NotifyComplete | NotifyAborted | DiscardCheckpoint | FailJob


# -- statistics ---------------------------------------------------------------------


class Status(enum.StrEnum):
    IN_PROGRESS = "IN_PROGRESS"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"


@dataclass(frozen=True)
class CheckpointSummary:
    """One checkpoint as metrics and the REST view show it; figures sum or max over the acks so far."""

    checkpoint_id: int
    status: Status
    mode: CheckpointMode
    savepoint: bool
    started_at: float
    duration_s: float | None  # until every task acked, or until the abort; None while in progress
    figures: CheckpointFigures
    failure_reason: str = ""

    def to_document(self) -> dict[str, Any]:
        """The summary as history documents and the REST API hold it: the figures beside the other fields."""
        return {"checkpoint_id": self.checkpoint_id, "status": self.status, "mode": self.mode,
                "savepoint": self.savepoint, "started_at": self.started_at, "duration_s": self.duration_s,
                **self.figures.to_wire(), "failure_reason": self.failure_reason}


@dataclass(frozen=True, slots=True)
class CompletedCheckpoint:
    """A job's latest completed checkpoint: where it is and, while this coordinator saw it complete, its summary
    (a job record keeps only the pointer: its figures are not needed to restore it)."""

    checkpoint_id: int
    path: str
    summary: CheckpointSummary | None = None

    def pointer(self) -> dict[str, Any]:
        """What a job record keeps."""
        return {"checkpoint_id": self.checkpoint_id, "path": self.path}

    def to_document(self) -> dict[str, Any]:
        """As `sluice status` and the REST API show it: the pointer and the summary's fields."""
        return {"checkpoint_id": self.checkpoint_id, "path": self.path,
                **(self.summary.to_document() if self.summary is not None else {})}

    @classmethod
    def from_pointer(cls, doc: Any) -> CompletedCheckpoint:
        """From a job record's pointer; ValueError names what is wrong with it."""
        if not (isinstance(doc, dict) and isinstance(doc.get("checkpoint_id"), int)
                and not isinstance(doc.get("checkpoint_id"), bool) and isinstance(doc.get("path"), str)):
            raise ValueError(f"'last_checkpoint' must name a checkpoint_id and a path, got {doc!r}")
        return cls(doc["checkpoint_id"], doc["path"])


@dataclass(frozen=True, slots=True)
class TaskAck:
    """One task's acknowledgement: its files (written to _metadata as they came) and its figures."""

    state: dict[str, Any]
    figures: TaskCheckpointFigures

    def to_wire(self) -> dict[str, Any]:
        return {"state": self.state, "figures": self.figures.to_wire()}


@dataclass(frozen=True)
class CheckpointStatistics:
    completed: int
    failed: int
    consecutive_failures: int
    in_flight_id: int | None
    queued: int
    last_completed_id: int | None
    last_completed: CheckpointSummary | None


# -- the state machine --------------------------------------------------------------


class Phase(enum.Enum):
    PENDING = "PENDING"  # collecting acknowledgements
    READY = "READY"  # every task acked; waits for the older checkpoints in flight to end
    WRITING = "WRITING"  # every task acked; the shell is writing _metadata


# Which stimuli each phase of the in-flight checkpoint accepts. Anything else
# (a late ack after an abort, a second metadata_written) is stale and ignored.
ACCEPTS: dict[Phase, frozenset[str]] = {
    Phase.PENDING: frozenset({"ack", "decline", "timeout", "task_failed"}),
    Phase.READY: frozenset(),
    Phase.WRITING: frozenset({"metadata_written", "metadata_failed"}),
}


@dataclass(frozen=True)
class _Request:
    checkpoint_id: int
    options: CheckpointOptions  # decided when it was requested (or fell due), carried to the barriers
    directory: str | None
    manual: bool = False  # asked for (sluice checkpoint / savepoint), not periodic
    # whether the tasks hear of its completion (sinks commit what they pre-committed up to it): every checkpoint,
    # and a savepoint only when the job stops with it (see `request`)
    commits: bool = True

    @property
    def mode(self) -> CheckpointMode:
        return self.options.mode

    @property
    def savepoint(self) -> bool:
        return self.options.savepoint


@dataclass
class _Checkpoint:
    request: _Request
    started_at: float
    phase: Phase = Phase.PENDING
    status: Status = Status.IN_PROGRESS
    acks: dict[str, TaskAck] = field(default_factory=dict)
    ended_at: float | None = None  # when the last ack arrived, or when it was aborted
    failure_reason: str = ""
    # (acks counted, their figures): acks are only ever added, so the figures change only when their count does;
    # history() summarises every retained checkpoint on each REST call and completion, O(history x tasks) without
    _figures: tuple[int, CheckpointFigures] | None = None

    def figures(self) -> CheckpointFigures:
        if self._figures is None or self._figures[0] != len(self.acks):
            self._figures = (len(self.acks), CheckpointFigures.of(ack.figures for ack in self.acks.values()))
        return self._figures[1]

    def summary(self) -> CheckpointSummary:
        return CheckpointSummary(
            checkpoint_id=self.request.checkpoint_id,
            status=self.status,
            mode=self.request.mode,
            savepoint=self.request.savepoint,
            started_at=self.started_at,
            duration_s=None if self.ended_at is None else self.ended_at - self.started_at,
            figures=self.figures(),
            failure_reason=self.failure_reason,
        )


class CheckpointCoordinator:
    """Checkpoint scheduling, completion and failure accounting for one job; see the module docstring."""

    def __init__(
        self,
        settings: CheckpointSettings,
        tasks: frozenset[str],
        *,
        first_id: int = 1,
        now: float,
        retained: Iterable[int] = (),
    ) -> None:
        """`retained`: ids of completed checkpoints already in storage (oldest first), for retention."""
        if not tasks:
            raise ValueError("a checkpoint coordinator needs at least one task")
        self.settings = settings
        self.tasks = frozenset(tasks)
        self._next_id = first_id
        self._labels: set[int] = set()  # ids kept unused (`_keep_label`)
        self._last_trigger_at = now  # the first periodic checkpoint falls due one interval after start
        self._last_end_at: float | None = None
        self._pending: dict[int, _Checkpoint] = {}  # in flight, by id (oldest first)
        self._queue: deque[_Request] = deque()
        self._retained: deque[int] = deque(retained)  # completed checkpoints (not savepoints), oldest first
        self._history: deque[_Checkpoint] = deque(maxlen=HISTORY_SIZE)
        self._last_completed: _Checkpoint | None = None
        self._completed = 0
        self._failed = 0
        self._consecutive_failures = 0
        self._job_failed = False
        self._finished: set[str] = set()
        self._full_until_completed = False  # storage lost files: trigger full checkpoints until one completes

    # -- stimuli ----------------------------------------------------------------

    def tick(self, now: float) -> list[Instruction]:
        out: list[Instruction] = []
        for cp in self._all_accepting("timeout"):
            if now - cp.started_at >= self.settings.timeout_s and self._pending.get(cp.request.checkpoint_id) is cp:
                out += self._abort(now, cp, f"timeout after {self.settings.timeout_s:g} s")
        if self._periodic_due(now):
            out += self._trigger(now, self._new_request(self.settings.options(), directory=None))
        return out

    def request(
        self, now: float, *, savepoint: bool = False, directory: str | None = None, mode: str | None = None,
        stopping: bool = False,
    ) -> tuple[int, list[Instruction]]:
        """A manual checkpoint or, with `savepoint=True`, a savepoint into `directory`.

        A savepoint commits no side effects (Flink 1.15's rule): its sinks' pre-commits are published by the next
        checkpoint's completion (sinks commit everything up to a completed id, and the savepoint's label is below
        the next id), or by a restore from the savepoint. Recovery restores checkpoints, never savepoints, so
        output a savepoint published would be produced again by a failover to the checkpoint before it, in sinks
        that cannot take output back (Kafka, PostgreSQL). `stopping`: the job stops with this savepoint (`sluice
        cancel --savepoint`, `sluice upgrade`): no checkpoint follows, so its completion commits."""
        if savepoint and directory is None:
            raise ValueError("a savepoint needs a directory")
        if not savepoint and directory is not None:
            raise ValueError("a directory is only for savepoints; checkpoints go to the job's checkpoint storage")
        req = self._new_request(self.settings.options(mode, savepoint=savepoint), directory=directory, manual=True,
                                commits=not savepoint or stopping)
        if self._job_failed:
            return req.checkpoint_id, [NotifyAborted(req.checkpoint_id, "job failed")]
        if self._queue or not self._may_start_request(req):
            self._queue.append(req)
            return req.checkpoint_id, []
        return req.checkpoint_id, self._trigger(now, req)

    def ack(
        self, now: float, checkpoint_id: int, task: str, state: dict[str, Any], figures: TaskCheckpointFigures
    ) -> list[Instruction]:
        cp = self._accepting(checkpoint_id, "ack")
        if cp is None or task not in self.tasks or task in cp.acks:
            return []
        cp.acks[task] = TaskAck(state, figures)
        if len(cp.acks) < len(self.tasks):
            return []
        return self._all_acked(now, cp)

    def decline(self, now: float, checkpoint_id: int, task: str, reason: str) -> list[Instruction]:
        cp = self._accepting(checkpoint_id, "decline")
        if cp is None or task not in self.tasks:
            return []
        return self._abort(now, cp, f"declined by {task}: {reason}")

    def storage_failed(self, now: float, checkpoint_id: int, reason: str) -> list[Instruction]:
        """The coordinator could not prepare the checkpoint's storage (its directory cannot be created): it is
        declined before any task took part, and counts as failed like any abort."""
        return self._abort_in_flight(now, checkpoint_id, f"checkpoint storage failed: {reason}")

    def trigger_failed(self, now: float, checkpoint_id: int, reason: str) -> list[Instruction]:
        """A worker could not be told to take the checkpoint (its RPC failed): the checkpoint cannot complete,
        so it is aborted now rather than at its timeout, and counts as failed like any abort."""
        return self._abort_in_flight(now, checkpoint_id, f"trigger failed: {reason}")

    def _all_acked(self, now: float, cp: _Checkpoint) -> list[Instruction]:
        """Every task acknowledged `cp`: subsume the older checkpoints still collecting acks (unless `cp` or
        they are savepoints), then write its `_metadata` once every older one has ended."""
        cp.phase = Phase.READY
        cp.ended_at = now
        out: list[Instruction] = []
        n = cp.request.checkpoint_id
        if not cp.request.savepoint:
            for older in [o for o in self._pending.values() if o.request.checkpoint_id < n]:
                if older.phase == Phase.PENDING and not older.request.savepoint:
                    reason = f"subsumed by checkpoint {n}"
                    self._end_blameless(now, older, reason)
                    out += [NotifyAborted(older.request.checkpoint_id, reason),
                            DiscardCheckpoint(older.request.checkpoint_id, reason)]
        return out + self._write_ready()

    def _write_ready(self) -> list[Instruction]:
        """The oldest checkpoint in flight writes its `_metadata` if all its acks are in (one at a time), and so do
        newer ones past savepoints in flight: a savepoint holds no checkpoint back (recovery never uses one),
        but it waits for every older checkpoint."""
        out: list[Instruction] = []
        for cp in list(self._pending.values()):  # oldest first
            if cp.phase == Phase.READY and (not out or not cp.request.savepoint):
                cp.phase = Phase.WRITING
                req = cp.request
                assert cp.ended_at is not None
                out.append(WriteMetadata(req.checkpoint_id, req.directory, req.savepoint, req.mode,
                                         {task: ack.to_wire() for task, ack in cp.acks.items()},
                                         cp.started_at, cp.ended_at))
            if not cp.request.savepoint:
                break
        return out

    def _abort_in_flight(self, now: float, checkpoint_id: int, reason: str) -> list[Instruction]:
        cp = self._accepting(checkpoint_id, "decline")
        return [] if cp is None else self._abort(now, cp, reason)

    def task_failed(self, now: float, reason: str) -> list[Instruction]:
        if self._job_failed:
            return []
        # Take the queue first so the abort below does not start a queued request on a failed execution.
        dropped, self._queue = list(self._queue), deque()
        out: list[Instruction] = []
        for cp in self._all_accepting("task_failed"):
            if not self._job_failed:
                out += self._abort(now, cp, f"task failure: {reason}")
        out += [NotifyAborted(req.checkpoint_id, f"task failure: {reason}") for req in dropped]
        return out

    def task_finished(self, now: float, task: str) -> list[Instruction]:
        if task not in self.tasks or task in self._finished:
            return []
        self._finished.add(task)
        out: list[Instruction] = []
        for cp in self._all_accepting("ack"):
            if task not in cp.acks:
                out += self.ack(now, cp.request.checkpoint_id, task, dict(FINISHED_STATE), TaskCheckpointFigures())
        return out

    def stopped(self, now: float, reason: str) -> list[Instruction]:
        """The runner stops (the job finished, is rescaled, or the lease is lost): a checkpoint still waiting for
        acks never completes, and is recorded as ended with `reason` rather than left IN_PROGRESS; it is no
        failure of the job's. One writing its `_metadata` is left to complete: a finishing job's commit."""
        for cp in self._all_accepting("timeout"):
            self._end_blameless(now, cp, reason)
        return []

    def _end_blameless(self, now: float, cp: _Checkpoint, reason: str) -> None:
        """End a checkpoint that did not complete, as FAILED (and counted so), without counting it towards
        tolerable_failures: `_abort` does that for the failures that are the job's."""
        cp.status = Status.FAILED
        cp.failure_reason = reason
        cp.ended_at = now
        self._pending.pop(cp.request.checkpoint_id, None)
        self._last_end_at = now
        self._failed += 1

    def metadata_written(self, now: float, checkpoint_id: int) -> list[Instruction]:
        cp = self._accepting(checkpoint_id, "metadata_written")
        if cp is None:
            return []
        cp.status = Status.COMPLETED
        if cp.request.options.full:
            self._full_until_completed = False
        self._pending.pop(checkpoint_id, None)
        self._last_end_at = now
        self._completed += 1
        if self._last_completed is None or checkpoint_id > self._last_completed.request.checkpoint_id:
            self._last_completed = cp  # the newest completed (a savepoint may complete after a newer checkpoint)
        out: list[Instruction] = [NotifyComplete(checkpoint_id, tasks=cp.request.commits)]
        if not cp.request.savepoint:
            self._consecutive_failures = 0
            self._retained.append(checkpoint_id)
            while len(self._retained) > self.settings.retain:
                out.append(DiscardCheckpoint(self._retained.popleft(), "retention"))
        return out + self._write_ready() + self._start_queued(now)

    def metadata_failed(self, now: float, checkpoint_id: int, reason: str, *,
                        files_lost: bool = False) -> list[Instruction]:
        """`files_lost`: storage no longer holds a file the checkpoint names (the shell checked before writing)."""
        cp = self._accepting(checkpoint_id, "metadata_failed")
        if cp is None:
            return []
        if files_lost:
            self._full_until_completed = True
            return self._abort(now, cp, reason)
        return self._abort(now, cp, f"metadata write failed: {reason}")

    # -- read-only views --------------------------------------------------------

    @property
    def retained(self) -> list[int]:
        """Ids of the completed checkpoints retention keeps, oldest first."""
        return list(self._retained)

    @property
    def in_flight_id(self) -> int | None:
        """The newest checkpoint in flight (`in_flight_ids` lists them all)."""
        return max(self._pending, default=None)

    @property
    def in_flight_ids(self) -> list[int]:
        return list(self._pending)

    def statistics(self) -> CheckpointStatistics:
        last = self._last_completed
        return CheckpointStatistics(
            completed=self._completed,
            failed=self._failed,
            consecutive_failures=self._consecutive_failures,
            in_flight_id=self.in_flight_id,
            queued=len(self._queue),
            last_completed_id=None if last is None else last.request.checkpoint_id,
            last_completed=None if last is None else last.summary(),
        )

    def history(self) -> list[CheckpointSummary]:
        """The last HISTORY_SIZE triggered checkpoints, oldest first."""
        return [cp.summary() for cp in self._history]

    def task_figures(self) -> dict[int, dict[str, TaskCheckpointFigures]]:
        """For each checkpoint in the history: task -> the figures it acknowledged with (start delay,
        alignment, sync/async time, bytes), for the REST API's per-task view; finished tasks have none."""
        return {cp.request.checkpoint_id: {task: ack.figures for task, ack in cp.acks.items()}
                for cp in self._history}

    def ended(self, checkpoint_id: int) -> tuple[CheckpointSummary, dict[str, TaskCheckpointFigures]] | None:
        """A checkpoint of the history that has ended (completed or aborted): its summary and the figures of the
        tasks that acknowledged it, for its trace (coordinator/trace_spans.py); None while in progress or unknown."""
        for cp in reversed(self._history):
            if cp.request.checkpoint_id == checkpoint_id:
                if cp.ended_at is None or cp.status == Status.IN_PROGRESS:
                    return None
                return cp.summary(), {task: ack.figures for task, ack in cp.acks.items()}
        return None

    # -- internals --------------------------------------------------------------

    def _accepting(self, checkpoint_id: int, stimulus: str) -> _Checkpoint | None:
        """The in-flight checkpoint `checkpoint_id` if its phase accepts `stimulus`."""
        cp = self._pending.get(checkpoint_id)
        if cp is None or self._job_failed or stimulus not in ACCEPTS[cp.phase]:
            return None
        return cp

    def _all_accepting(self, stimulus: str) -> list[_Checkpoint]:
        """Every in-flight checkpoint whose phase accepts `stimulus`, oldest first (a copy: callers end them)."""
        if self._job_failed:
            return []
        return [cp for cp in self._pending.values() if stimulus in ACCEPTS[cp.phase]]

    def _may_start_request(self, req: _Request) -> bool:
        """A manual checkpoint or savepoint starts beside periodic checkpoints it cannot disturb (may_overlap),
        one request at a time; an unaligned one beside a savepoint only with the id after its own kept
        unused (`_keep_label`: a queued request may have been given it)."""
        if any(cp.request.manual for cp in self._pending.values()) or not may_overlap(
                req.options, (cp.request.options for cp in self._pending.values())):
            return False
        return (req.options.mode != CheckpointMode.UNALIGNED or not self._beside_savepoint()
                or self._keep_label(req.checkpoint_id))

    def _periodic_due(self, now: float) -> bool:
        s = self.settings
        if self._job_failed or s.interval_s is None or self._finished == self.tasks or self._queue:
            return False
        # max_concurrent counts periodic checkpoints only: an aligned savepoint in flight does not pause them
        periodic = sum(not cp.request.manual for cp in self._pending.values())
        if periodic >= s.max_concurrent or not may_overlap(s.options(), (cp.request.options
                                                                         for cp in self._pending.values())):
            return False
        if now - self._last_trigger_at < s.interval_s:
            return False
        return self._last_end_at is None or now - self._last_end_at >= s.min_pause_s

    def _new_request(self, options: CheckpointOptions, *, directory: str | None, manual: bool = False,
                     commits: bool = True) -> _Request:
        req = _Request(self._next_id, options, directory, manual, commits)
        self._next_id += 1
        if options.mode == CheckpointMode.UNALIGNED and self._beside_savepoint():
            self._keep_label(req.checkpoint_id)
        return req

    def _beside_savepoint(self) -> bool:
        return any(cp.request.savepoint for cp in self._pending.values())

    def _keep_label(self, checkpoint_id: int) -> bool:
        """Keep `checkpoint_id + 1` unused, for the unaligned checkpoint `checkpoint_id` that starts beside a
        savepoint and may overtake it at some tasks: those label the savepoint's sink pre-commits with it
        (TaskCheckpointer._sink_label). False if that id went to another request already (a queued one's)."""
        if self._next_id == checkpoint_id + 1:
            self._next_id += 1
            self._labels.add(checkpoint_id + 1)
        return checkpoint_id + 1 in self._labels


    def _trigger(self, now: float, req: _Request) -> list[Instruction]:
        if self._full_until_completed and not req.options.savepoint:
            req = replace(req, options=replace(req.options, full=True))
        cp = _Checkpoint(req, started_at=now)
        cp.acks = {task: TaskAck(dict(FINISHED_STATE), TaskCheckpointFigures()) for task in self._finished}
        self._pending[req.checkpoint_id] = cp
        self._last_trigger_at = now
        self._history.append(cp)
        if len(cp.acks) == len(self.tasks):  # no task left to take it (asked for after the final checkpoint)
            reason = "every task has finished: nothing left to checkpoint"
            self._end_blameless(now, cp, reason)
            return [NotifyAborted(req.checkpoint_id, reason), *self._start_queued(now)]
        return [Trigger(req.checkpoint_id, req.options, req.directory, now)]

    def _start_queued(self, now: float) -> list[Instruction]:
        out: list[Instruction] = []
        while self._queue and not self._job_failed and self._may_start_request(self._queue[0]):
            out += self._trigger(now, self._queue.popleft())
        return out

    def _abort(self, now: float, cp: _Checkpoint, reason: str) -> list[Instruction]:
        req = cp.request
        self._end_blameless(now, cp, reason)  # and then blamed: it counts towards tolerable_failures below
        out: list[Instruction] = [
            NotifyAborted(req.checkpoint_id, reason),
            DiscardCheckpoint(req.checkpoint_id, reason, req.savepoint, req.directory),
        ]
        if not req.savepoint:
            self._consecutive_failures += 1
            if self._consecutive_failures > self.settings.tolerable_failures:
                return out + self._fail_job(now, req.checkpoint_id, reason)
        return out + self._write_ready() + self._start_queued(now)

    def _fail_job(self, now: float, checkpoint_id: int, reason: str) -> list[Instruction]:
        others = [cp for cp in self._pending.values() if cp.phase == Phase.PENDING]
        for cp in others:  # concurrent ones still collecting acks end with the job
            self._end_blameless(now, cp, "job failed")
        self._job_failed = True
        dropped, self._queue = [cp.request for cp in others] + list(self._queue), deque()
        n, limit = self._consecutive_failures, self.settings.tolerable_failures
        out: list[Instruction] = [FailJob(
            f"checkpoint {checkpoint_id} failed ({reason}); "
            f"{n} consecutive checkpoint failures exceed tolerable_failures={limit}"
        )]
        return out + [NotifyAborted(req.checkpoint_id, "job failed") for req in dropped]
