"""What the coordinator must not forget across a crash: one JSON file per job in `<state_dir>/jobs/`.

A job's record holds what a restarted coordinator needs to carry the job on:
its submission (entry, sys_path, job config, checkpoint settings, restart
strategy, the checkpoint it was submitted with), where it got to (state,
attempt, restarts, the next checkpoint id) and the latest completed
checkpoint pointer. What its page shows goes along, bounded: the last
checkpoints (their start times as Unix time, since monotonic clocks do not
cross processes), the checkpoint counters, the exception history and the
graph with its record totals, so a standby that takes over shows the job's
past rather than zeros (a record without them, from an older version,
loads with empty ones). Each file is written whole and atomically
(runtime.common.files.write_atomically), so a crash leaves the old version or
the new one, never half of either; the body carries a checksum so a damaged
file is named and skipped, never half-trusted.

Records are written by one writer task, latest wins: a burst of state changes
of one job is one write, and writes of one job never overtake each other.
`record_of` and `job_from_record` are pure and are what the tests check.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from coordinator.checkpointing import CheckpointSettings, CompletedCheckpoint
from coordinator.exception_history import ExceptionEntry, ExceptionHistory
from coordinator.jobs import TERMINAL, JobRecord
from coordinator.load_scaler import LoadScaling
from coordinator.restarts import RestartStrategy
from runtime.common.checksums import checksum, mismatch
from runtime.common.files import write_atomically
from runtime.graph.enums import JobState
from runtime.graph.job_config import JobConfig

log = logging.getLogger("sluice.job_store")

FORMAT_VERSION = 1
JOBS_DIR = "jobs"
SUFFIX = ".json"
_STATES = frozenset(s.value for s in JobState)
CHECKPOINT_HISTORY = 50  # checkpoints persisted per job, the newest


def wall_offset() -> float:
    """Wall clock minus monotonic clock, now: converts checkpoint start times for the record and back."""
    return time.time() - time.monotonic()


class CorruptJobRecord(ValueError):
    """A job record that cannot be used; the message names the file and what is wrong."""


def record_of(job: JobRecord, *, wall_offset: float = 0.0) -> dict[str, Any]:
    """The persisted form of a job (without the format and checksum fields); `wall_offset` turns the
    checkpoints' monotonic start times into Unix time."""
    history = [{**h, "status": str(h["status"]), "started_at": float(h["started_at"]) + wall_offset}
               for h in job.checkpoint_history()[-CHECKPOINT_HISTORY:]]
    return {
        "job_id": job.job_id, "entry": job.entry, "name": job.name, "sys_path": job.sys_path,
        "config": job.config.to_document(),
        "checkpoint": asdict(job.checkpoint_settings) if job.checkpoint_settings is not None else None,
        "restart": asdict(job.restart_strategy) if job.restart_strategy is not None else None,
        "restored_from": job.restored_from, "upgrade_of": job.upgrade_of, "state": job.state,
        "attempt": job.attempt, "restarts": job.restarts,
        "error": job.error,
        "failures": job.failures[-10:], "submitted_at": job.submitted_at, "ended_at": job.ended_at,
        "next_checkpoint_id": job.next_checkpoint_id,
        "last_checkpoint": job.last_checkpoint.pointer() if job.last_checkpoint else None,
        "final_checkpoint_id": job.final_checkpoint_id, "restored_checkpoint_id": job.restored_checkpoint_id,
        "restart_s": job.restart_s[-50:], "rescale_s": job.rescale_s[-50:],
        "checkpoint_history": history, "checkpoint_counts": list(job.checkpoint_counts()),
        "exceptions": [e.to_dict() for e in job.exceptions.entries()], "graph": job.graph_snapshot(),
        "autoscaler": job.load_scaling.to_document() if job.load_scaling is not None else None,
    }


def encode(job: JobRecord, *, offset: float | None = None) -> bytes:
    body = {"format": FORMAT_VERSION, **record_of(job, wall_offset=wall_offset() if offset is None else offset)}
    return json.dumps({**body, "checksum": checksum(_body(body))}, indent=1, sort_keys=True).encode()


def _body(doc: dict[str, Any]) -> bytes:
    return json.dumps({k: v for k, v in doc.items() if k != "checksum"}, indent=1, sort_keys=True).encode()


def decode(data: bytes, where: str, *, offset: float | None = None) -> JobRecord:
    """A job back from its file's bytes; raises CorruptJobRecord naming `where` and the problem."""
    if not data.strip():
        raise CorruptJobRecord(f"{where}: job record is empty")
    try:
        doc = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CorruptJobRecord(f"{where}: job record is truncated or not JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise CorruptJobRecord(f"{where}: expected a JSON object, got {type(doc).__name__}")
    if doc.get("format") != FORMAT_VERSION:
        raise CorruptJobRecord(f"{where}: unsupported job record format {doc.get('format')!r} "
                               f"(this version reads format {FORMAT_VERSION})")
    problem = mismatch(_body(doc), doc.get("checksum"))
    if problem is not None:
        raise CorruptJobRecord(f"{where}: job record is corrupt: {problem}")
    try:
        return job_from_record(doc, wall_offset=wall_offset() if offset is None else offset)
    except (KeyError, TypeError, ValueError) as exc:
        raise CorruptJobRecord(f"{where}: job record is unusable: {type(exc).__name__}: {exc}") from None


def job_from_record(doc: dict[str, Any], *, wall_offset: float = 0.0) -> JobRecord:
    """Raises KeyError, TypeError or ValueError for a record that does not describe a job. `wall_offset`
    turns the checkpoints' Unix start times back into this process's monotonic clock."""
    def typed(key: str, kind: type | tuple[type, ...], optional: bool = False) -> Any:
        value = doc[key]
        if (value is None and optional) or (isinstance(value, kind) and not isinstance(value, bool)):
            return value
        raise TypeError(f"{key!r} must be {getattr(kind, '__name__', kind)}, got {value!r}")

    state = typed("state", str)
    if state not in _STATES:
        raise ValueError(f"unknown job state {state!r}")
    # a record another version wrote may hold settings this one does not know: they are dropped, not refused
    config = JobConfig.from_document(typed("config", dict), ignore_unknown=True)
    job = JobRecord(typed("job_id", str), typed("entry", str), typed("name", str), typed("sys_path", str), config)
    checkpoint = typed("checkpoint", dict, optional=True)
    job.checkpoint_settings = CheckpointSettings(**checkpoint) if checkpoint is not None else None
    restart = typed("restart", dict, optional=True)
    job.restart_strategy = RestartStrategy(**restart) if restart is not None else None
    job.state = state
    job.attempt = typed("attempt", int)
    job.restarts = typed("restarts", int)
    job.error = typed("error", str)
    job.failures = [str(f) for f in typed("failures", list)]
    job.submitted_at = float(typed("submitted_at", (int, float)))
    ended_at = typed("ended_at", (int, float), optional=True)
    job.ended_at = float(ended_at) if ended_at is not None else None
    job.next_checkpoint_id = typed("next_checkpoint_id", int)
    last = typed("last_checkpoint", dict, optional=True)
    job.last_checkpoint = CompletedCheckpoint.from_pointer(last) if last is not None else None
    job.final_checkpoint_id = typed("final_checkpoint_id", int, optional=True)
    job.restored_checkpoint_id = typed("restored_checkpoint_id", int, optional=True)
    job.restored_from = typed("restored_from", str)
    upgrade_of = doc.get("upgrade_of") or ""  # absent from records of older versions
    if not isinstance(upgrade_of, str):
        raise TypeError(f"'upgrade_of' must be str, got {upgrade_of!r}")
    job.upgrade_of = upgrade_of
    job.restart_s = [float(x) for x in typed("restart_s", list)]
    job.rescale_s = [float(x) for x in typed("rescale_s", list)]
    _history_from_record(job, doc, wall_offset)
    autoscaler = doc.get("autoscaler")  # absent from records of older versions
    if autoscaler is not None:
        if not isinstance(autoscaler, dict):
            raise TypeError(f"'autoscaler' must be an object, got {autoscaler!r}")
        job.load_scaling = LoadScaling.from_document(autoscaler)
    if job.terminal:
        job.ended.set()
    return job


def _history_from_record(job: JobRecord, doc: dict[str, Any], wall_offset: float) -> None:
    """The page's past (absent from records of older versions: then empty)."""
    history = doc.get("checkpoint_history") or []
    if not isinstance(history, list) or not all(isinstance(h, dict) and "status" in h for h in history):
        raise TypeError("'checkpoint_history' must be a list of checkpoints")
    job.earlier_checkpoints = [{**h, "started_at": float(h["started_at"]) - wall_offset} for h in history]
    done = sum(h["status"] == "COMPLETED" for h in history)
    failed = sum(h["status"] == JobState.FAILED for h in history)
    counts = doc.get("checkpoint_counts") or [done, failed]
    if not (isinstance(counts, list) and len(counts) == 2 and all(isinstance(n, int) for n in counts)):
        raise TypeError(f"'checkpoint_counts' must be [completed, failed], got {counts!r}")
    job.checkpoints_before = (max(0, counts[0] - done), max(0, counts[1] - failed))
    job.exceptions = ExceptionHistory([ExceptionEntry.from_dict(e) for e in doc.get("exceptions") or []])
    graph = doc.get("graph")
    if graph is not None and not (isinstance(graph, dict) and isinstance(graph.get("vertices"), list)):
        raise TypeError(f"'graph' must hold a list of vertices, got {graph!r}")
    job.saved_graph = graph


def needs_recovery(job: JobRecord) -> bool:
    """A job the previous coordinator left unfinished: it runs again (from its latest checkpoint)."""
    return job.state not in TERMINAL


def superseded(jobs: list[JobRecord]) -> dict[str, str]:
    """Unfinished jobs an upgrade replaced, each with the job that replaces it: the new version's record is
    written before the old version is cancelled (coordinator/upgrade.py), so a leader that finds it finishes
    the upgrade (the old version is cancelled, the new one starts from the savepoint) instead of running both."""
    unfinished = {j.job_id for j in jobs if needs_recovery(j)}
    return {j.upgrade_of: j.job_id for j in jobs if j.upgrade_of in unfinished}


class JobStore:
    """The job records of one state directory; `save` from the event loop, `load` once at start-up."""

    def __init__(self, state_dir: str, *, may_write: Callable[[], bool] = lambda: True) -> None:
        self.directory = os.path.join(os.path.abspath(state_dir), JOBS_DIR)
        self._may_write = may_write  # the leadership fence: a coordinator that lost its lease writes nothing
        self._pending: dict[str, bytes] = {}
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        # callers of `written`: for the next write of a job still pending, and for the write under way
        self._waiters: dict[str, list[asyncio.Future[None]]] = {}
        self._writing = ""
        self._writing_waiters: list[asyncio.Future[None]] = []
        self.writes = 0
        self.failed_writes = 0

    def path(self, job_id: str) -> str:
        if not job_id or "/" in job_id or job_id.startswith(".") or os.sep in job_id:
            raise ValueError(f"job id {job_id!r} cannot name a file")
        return os.path.join(self.directory, job_id + SUFFIX)

    def load(self) -> tuple[list[JobRecord], list[str]]:
        """Every readable job record, oldest submission first, and one line per file that was skipped."""
        try:
            names = sorted(os.listdir(self.directory))
        except FileNotFoundError:
            return [], []
        jobs: list[JobRecord] = []
        problems: list[str] = []
        for name in names:
            if name.startswith(".") or not name.endswith(SUFFIX):
                continue  # a temporary file a crash left behind: the record it was to replace is intact
            path = os.path.join(self.directory, name)
            try:
                with open(path, "rb") as f:
                    job = decode(f.read(), path)
            except OSError as exc:
                problems.append(f"{path}: cannot read job record: {exc.strerror}")
                continue
            except CorruptJobRecord as exc:
                problems.append(str(exc))
                continue
            if name != job.job_id + SUFFIX:
                problems.append(f"{path}: holds job {job.job_id!r}, not the one its name says")
                continue
            jobs.append(job)
        return sorted(jobs, key=lambda j: j.submitted_at), problems

    def save(self, job: JobRecord) -> None:
        """Queue the job's current record for writing (serialised now, so later changes are a later write)."""
        try:
            self._pending[job.job_id] = encode(job)
        except (TypeError, ValueError) as exc:  # a config value JSON cannot hold: the job runs, unrecorded
            self.failed_writes += 1
            log.error("cannot record job %s: %s", job.job_id, exc)
            return
        self._idle.clear()
        self._wake.set()

    async def run(self) -> None:
        """The writer: every queued record, latest version only, one job after another."""
        os.makedirs(self.directory, exist_ok=True)  # noqa: ASYNC240 - once, at start-up
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._pending:
                job_id, data = next(iter(self._pending.items()))
                del self._pending[job_id]
                self._writing, self._writing_waiters = job_id, self._waiters.pop(job_id, [])
                failure: OSError | None = None
                try:
                    if not self._may_write():
                        log.error("not writing the record of job %s: this coordinator is no longer the leader",
                                  job_id)
                        failure = OSError(f"job {job_id}: this coordinator is no longer the leader")
                        continue
                    try:
                        await asyncio.to_thread(write_atomically, self.path(job_id), data)
                        self.writes += 1
                    except OSError as exc:
                        # the job goes on; a crash now would recover it from its previous record
                        self.failed_writes += 1
                        log.error("cannot write the record of job %s: %s", job_id, exc)
                        failure = exc
                finally:
                    for fut in self._writing_waiters:
                        if not fut.done():
                            if failure is not None:
                                fut.set_exception(failure)
                            else:
                                fut.set_result(None)
                    self._writing, self._writing_waiters = "", []
            if not self._pending:
                self._idle.set()

    async def written(self, job_id: str) -> None:
        """Wait until the job's record as queued now is on disk (at once if nothing of it is queued); OSError
        if that write failed or this coordinator may no longer write. What a step that must not be lost in a
        crash waits for before the next one (coordinator/upgrade.py: the new version's record first)."""
        if job_id in self._pending:
            waiters = self._waiters.setdefault(job_id, [])
        elif job_id == self._writing:
            waiters = self._writing_waiters
        else:
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiters.append(fut)
        await fut

    async def flush(self, timeout_s: float = 10.0) -> None:
        """Wait until every queued record is written (at shutdown)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), timeout_s)
