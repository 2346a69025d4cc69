"""A job's exception history: every failure that stopped an attempt, its traceback, and what it caused.

Flink's web UI keeps the same list (root exception, time, where it happened,
and whether the job restarted). One entry per failover, recorded where the
failover begins (`record`); the entry learns its outcome when the job runs
again (`restarted`) or ends (`ended`). Failure reports that carry a
traceback (a task that raised, on its worker) leave it here first
(`stash`), keyed by the cause line the failover will record.

Pure: callers pass the wall-clock time in; JobRecord holds one of these and
coordinator/job_store.py persists it with the job, bounded.
"""

from __future__ import annotations

from collections import deque
from dataclasses import asdict, dataclass, fields
from typing import Any

HISTORY_SIZE = 20  # entries kept (and persisted) per job, newest last
TRACEBACK_CHARS = 8000  # a traceback's tail kept per entry: the innermost frames and the error line
STASH_SIZE = 16  # tracebacks of failures not recorded (yet): concurrent failures of one attempt

PENDING = "pending"  # the failover is under way
RESTARTED = "restarted"
FAILED = "failed"  # no restart left, or the restart itself failed
CANCELLED = "cancelled"  # cancelled by the user while restarting
REPORTED = "reported"  # not a failure: something the job should know (a user call running too long)


@dataclass
class ExceptionEntry:
    time: float  # Unix time the failure was recorded
    cause: str  # one line: "task 2:0 failed: ValueError: ..." or "worker w-1 lost: heartbeat timeout"
    attempt: int  # the attempt the failure stopped
    task: str | None = None
    worker: str | None = None
    traceback: str = ""
    outcome: str = PENDING
    restarted_attempt: int | None = None  # the attempt that ran next
    restart_s: float | None = None  # failure recorded -> running again
    restored_checkpoint_id: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> ExceptionEntry:
        """Raises TypeError/ValueError for an entry that is not one (a damaged record)."""
        known = {f.name for f in fields(cls)}
        entry = cls(**{k: v for k, v in raw.items() if k in known})
        if not isinstance(entry.cause, str) or not isinstance(entry.time, (int, float)):
            raise ValueError(f"not an exception entry: {raw!r}")
        return entry


@dataclass(frozen=True)
class Detail:
    """What a failure report knew beyond its cause line."""

    task: str | None = None
    worker: str | None = None
    traceback: str = ""


class ExceptionHistory:
    def __init__(self, entries: list[ExceptionEntry] | None = None) -> None:
        self._entries: deque[ExceptionEntry] = deque(entries or [], maxlen=HISTORY_SIZE)
        self._stash: dict[str, Detail] = {}

    def entries(self) -> list[ExceptionEntry]:
        return list(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def stash(self, cause: str, detail: Detail) -> None:
        """Keep a failure report's detail until the failover records `cause` (or a newer failure wins)."""
        self._stash[cause] = Detail(detail.task, detail.worker, detail.traceback[-TRACEBACK_CHARS:])
        while len(self._stash) > STASH_SIZE:
            del self._stash[next(iter(self._stash))]

    def record(self, cause: str, *, now: float, attempt: int) -> ExceptionEntry:
        """A failover begins: the root cause of this attempt's end. Details stashed for it are attached; the
        others were concurrent failures of the same attempt and are dropped."""
        detail = self._stash.pop(cause, Detail())
        self._stash.clear()
        entry = ExceptionEntry(now, cause, attempt, detail.task, detail.worker, detail.traceback)
        self._entries.append(entry)
        return entry

    def report(self, cause: str, detail: Detail, *, now: float, attempt: int) -> ExceptionEntry:
        """Something that did not stop the attempt but belongs in its history (a user call running past the
        worker's threshold): an entry of its own, outside any failover."""
        entry = ExceptionEntry(now, cause, attempt, detail.task, detail.worker, detail.traceback[-TRACEBACK_CHARS:],
                               outcome=REPORTED)
        self._entries.append(entry)
        return entry

    def restarted(self, *, now: float, attempt: int, restored_checkpoint_id: int | None) -> None:
        """The job runs again: every pending entry caused this restart."""
        for e in self._entries:
            if e.outcome == PENDING:
                e.outcome, e.restarted_attempt = RESTARTED, attempt
                e.restart_s = round(max(0.0, now - e.time), 3)
                e.restored_checkpoint_id = restored_checkpoint_id

    def ended(self, state: str) -> None:
        """The job ended while entries were pending: the failure ended it (FAILED) or the user did."""
        for e in self._entries:
            if e.outcome == PENDING:
                e.outcome = CANCELLED if state == "CANCELLED" else FAILED
