"""What the table sinks (Delta, Iceberg) share: Parquet data files written while a checkpoint runs, pending
entries in the checkpoint and in staging manifests, and one table commit per completed checkpoint made by
subtask 0, or when it finished before that checkpoint (a bounded input whose subtasks end at different
checkpoints) by the lowest-numbered subtask still running: each subtask writes a finish marker
(`finished/<attempt>-<subtask>.json`) at the checkpoint it takes at its end of input (restored already
finished: when it opens, `restored_at_end`), and all read them the same way (`committer_of`). The protocol
and its invariant: runtime/connectors/lake_commits.py.

Staging manifests live beside the table, under `<table>/_sluice/<app id>/` (readers of Delta and Iceberg
tables ignore what the table's log or metadata does not name, and `_`-prefixed directories by convention):
`<checkpoint>-<subtask>.json` lists a subtask's pending entries at that checkpoint's barrier, written before
the subtask acknowledges the checkpoint, so when the checkpoint completes every subtask's list is there for
the committer. `committed.json` is the committer's note of the versions it last saw in the table; the other
subtasks read it at their barriers to forget entries the table has (a stale or missing note only makes them
list an entry once more, which the committer then skips).

The committer's work (reading the manifests, the table's versions, the commit: tens to hundreds of
milliseconds against an object store) runs on a thread of its own, in checkpoint order, so the worker's event
loop, which calls `commit`, is not held up; a failed commit fails the task at its next barrier or commit (the
restore lists the files again). At the end of a bounded input `close` waits for the commits handed over, so a
FINISHED job's table is complete.

Files written and never committed (a failed attempt's) stay in the table's directory unnamed by the table:
Delta's VACUUM and Iceberg's orphan-file removal delete them.
"""

from __future__ import annotations

import concurrent.futures
import json
import logging
import os
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

from runtime.common import extras, objectstore
from runtime.connectors.lake_commits import (
    FINISHED_BEFORE_THIS_RUN,
    CommitPlan,
    Entry,
    app_id_of,
    apps_of,
    committer_of,
    finish_marker_name,
    finished_in_attempt,
    manifest_name,
    manifests_of,
    manifests_up_to,
    plan_commit,
    still_pending,
)
from runtime.connectors.sinks import ForgedSinkState, Sink

log = logging.getLogger("sluice.tables")

COMMITTED_NOTE = "committed.json"


class TableConfigError(ValueError):
    """The sink's table, catalog or path cannot be used as configured; the message is one line."""


@dataclass(slots=True)
class TableSinkStatistics:
    """A table sink subtask's figures (docs/METRICS.md, Table sinks)."""

    files_pending: int = 0  # data files pre-committed and not yet seen in the table
    files_written: int = 0
    rows_written: int = 0
    commits: int = 0  # table commits this subtask made (the committer: subtask 0 while it runs)
    commits_skipped: int = 0  # checkpoints with nothing new for the table (no files, or all in it already)
    files_already_committed: int = 0  # files listed again and found in the table (a replay, or a note not seen yet)
    last_commit_s: float = 0.0  # duration of the last table commit


def pyarrow_module() -> Any:
    try:
        import pyarrow as pa
        import pyarrow.parquet  # noqa: F401 - the writer
    except ImportError as exc:
        raise extras.MissingExtra(["parquet"]) from exc
    return pa


def local_path(uri: str) -> str:
    """A file:// URI or a plain path -> the local path; an s3:// URL unchanged."""
    return uri[len("file://"):] if uri.startswith("file://") else uri


class TableSink(Sink):
    """A two-phase table sink (module docstring). Subclasses say where data files go, how to read the versions
    the table records, and how to make the commit.

    Records are dicts (column -> value) or tuples/lists with `columns` naming their fields. The table's schema
    is the one pyarrow infers from the records (`schema` overrides it: a pyarrow schema). Rows are buffered and
    written as Parquet files of up to `file_rows` rows; at a barrier the rest is written.
    """

    def __init__(self, *, columns: list[str] | None = None, schema: Any = None, file_rows: int = 1_000_000,
                 close_timeout_s: float = 120.0, cancel_wait_s: float = 2.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.columns = list(columns) if columns else None
        self.schema = schema
        self.file_rows = file_rows
        self.close_timeout_s = close_timeout_s  # end of a bounded input: wait this long for commits under way
        self.cancel_wait_s = cancel_wait_s  # after a cancel or failure (the restore redoes what is left)
        self.job_id = "local"
        self.uid = "sink"

    # -- what a subclass provides ------------------------------------------------------------------------------

    def table_root(self) -> str:
        """The table's directory or s3:// prefix (staging manifests go under `_sluice/` in it)."""
        raise NotImplementedError

    def write_data_files(self, table: Any) -> list[dict[str, Any]]:
        """Write one arrow table of rows as data files; their descriptions (each with a unique "path")."""
        raise NotImplementedError

    def committed_versions(self, apps: list[str]) -> dict[str, int | None]:
        """The highest checkpoint the table records for each app (None: none)."""
        raise NotImplementedError

    def commit_files(self, plan: CommitPlan, checkpoint_id: int) -> None:
        """Make the one table commit of `plan`, recording its versions in the same commit."""
        raise NotImplementedError

    # -- life cycle --------------------------------------------------------------------------------------------

    def bind(self, job_id: str, uid: str) -> None:
        self.job_id, self.uid = job_id, uid

    def open(self, subtask_index: int, parallelism: int, attempt: int) -> None:
        """Quick: the heavy set-up (`prepare`: importing the table library, loading the table) runs on the sink's
        thread, because open runs on the worker's event loop, which an import of seconds on a busy machine
        would stall past its heartbeats. The first barrier waits for it."""
        super().open(subtask_index, parallelism, attempt)
        self.app_id = app_id_of(self.job_id, self.uid)
        self._rows: list[Any] = []
        self._written: list[dict[str, Any]] = []  # data files since the last barrier
        self._pending: list[Entry] = []
        self._file_counter = 0
        self.stats = TableSinkStatistics()
        self._lock = threading.Lock()  # _pending: the barrier (task) and the commit thread both change it
        # one thread per subtask: the set-up, then (the committer) the commits, in checkpoint order
        thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=f"table-sink-{subtask_index}")
        self._thread: concurrent.futures.ThreadPoolExecutor | None = thread
        self._prepared = thread.submit(self.prepare)
        self._commits: list[concurrent.futures.Future[None]] = []
        self._error: BaseException | None = None
        self._finished = False
        self._marked = False  # the finish marker is written

    def prepare(self) -> None:
        """The set-up a subclass needs before the first barrier (on the sink's thread)."""
        self._pa = pyarrow_module()

    def _ready(self) -> None:
        self._prepared.result()

    @property
    def staging(self) -> str:
        return objectstore.join(self.table_root(), "_sluice", self.app_id)

    def statistics(self) -> TableSinkStatistics:
        self.stats.files_pending = len(self._pending) + len(self._written)
        return self.stats

    def drain(self) -> None:
        """Wait for the commits handed over (tests and benchmarks: the table is then up to date), re-raising a
        commit's failure."""
        self.wait_committed(self.close_timeout_s)
        self._check()

    def data_file_name(self) -> str:
        self._file_counter += 1
        return (f"part-{self.subtask_index:05d}-{self.attempt}-{self._file_counter:05d}-"
                f"{uuid.uuid4().hex[:12]}.parquet")

    def write(self, record: Any) -> None:
        self._rows.append(record)
        if len(self._rows) >= self.file_rows:
            self._flush()

    def _arrow(self, rows: list[Any]) -> Any:
        pa = self._pa
        if isinstance(rows[0], dict):
            return pa.Table.from_pylist(rows, schema=self.schema)
        if self.columns is None:
            raise TableConfigError(f"{type(self).__name__}: records are {type(rows[0]).__name__}s, not dicts: "
                                   "give the sink columns=[...] to name their fields")
        names = self.columns
        return pa.Table.from_pydict({name: [r[i] for r in rows] for i, name in enumerate(names)}, schema=self.schema)

    def _flush(self) -> None:
        if not self._rows:
            return
        self._ready()
        table = self._arrow(self._rows)
        files = self.write_data_files(table)
        self._written += files
        self.stats.files_written += len(files)
        self.stats.rows_written += len(self._rows)
        self._rows = []

    def _check(self) -> None:
        if self._error is not None:
            raise self._error

    def snapshot_state(self, checkpoint_id: int) -> Any:
        self._check()
        self._ready()
        self._flush()
        note = self._read_note()  # what the committer saw in the table (it may be another subtask)
        with self._lock:
            self._pending += [[checkpoint_id, self.app_id, f] for f in self._written]
            self._written = []
            self._pending = still_pending(self._pending, note)
            pending = [list(e) for e in self._pending]
        if self._finished and not self._marked:  # the checkpoint at its end of input: say so (committer_of)
            self._write_finish_marker(checkpoint_id)
        manifest = json.dumps({"app": self.app_id, "checkpoint": checkpoint_id, "subtask": self.subtask_index,
                               "pending": pending}, separators=(",", ":")).encode()
        objectstore.write(objectstore.join(self.staging, manifest_name(checkpoint_id, self.subtask_index)), manifest)
        return {"pending": pending, "checkpoint": checkpoint_id}

    def commit(self, checkpoint_id: int) -> None:
        """The committer of the checkpoint (subtask 0 while it runs; `committer_of`) hands its commit to the
        sink's thread (module docstring) and returns."""
        self._check()
        if self._thread is None:  # finished and closed: it finished before this checkpoint, another commits it
            return
        future = self._thread.submit(self._commit_if_mine, checkpoint_id)
        future.add_done_callback(self._committed)
        self._commits = [f for f in self._commits if not f.done()] + [future]

    def _committed(self, future: concurrent.futures.Future[None]) -> None:
        if not future.cancelled() and future.exception() is not None and self._error is None:
            self._error = future.exception()
            log.error("%s: commit failed: %s", type(self).__name__, self._error)

    def wait_committed(self, timeout_s: float) -> bool:
        """Wait until every commit handed to the commit thread is done; false if one is still running."""
        done, running = concurrent.futures.wait(self._commits, timeout=timeout_s)
        return not running

    def finished_subtasks(self) -> dict[int, int]:
        """This attempt's finish markers: subtask -> the checkpoint it took at its end of input."""
        directory = objectstore.join(self.staging, "finished")
        return {subtask: int(json.loads(objectstore.read(objectstore.join(directory, name)))["checkpoint"])
                for subtask, name in finished_in_attempt(objectstore.list_children(directory), self.attempt)}

    def _commit_if_mine(self, checkpoint_id: int) -> None:
        if committer_of(checkpoint_id, self.parallelism, self.finished_subtasks()) == self.subtask_index:
            self.commit_checkpoint(checkpoint_id)

    def commit_checkpoint(self, checkpoint_id: int) -> None:
        """The one table commit of checkpoint `checkpoint_id` from every subtask's manifest of it, then the
        clean-up of the manifests up to it. Runs on the commit thread."""
        names = objectstore.list_children(self.staging)
        entries: list[Entry] = []
        for name in manifests_of(names, checkpoint_id):
            entries += json.loads(objectstore.read(objectstore.join(self.staging, name)))["pending"]
        self.commit_entries(entries, checkpoint_id)
        for name in manifests_up_to(names, checkpoint_id):
            try:
                objectstore.delete(objectstore.join(self.staging, name))
            except OSError as exc:  # only garbage left behind: the next commit's clean-up tries again
                log.warning("%s: cannot remove staging manifest %s: %s", type(self).__name__, name, exc)

    def commit_entries(self, entries: list[Entry], checkpoint_id: int) -> CommitPlan:
        """One table commit of the entries listed at `checkpoint_id`, unless the table already has them."""
        started = time.monotonic()
        apps = sorted({*apps_of(entries), self.app_id})
        committed = self.committed_versions(apps)
        plan = plan_commit(entries, committed, checkpoint_id=checkpoint_id, app_id=self.app_id)
        # listed again: by a subtask that had not seen the last commit's note yet, or restored from a checkpoint
        # whose commit had happened (a replay)
        self.stats.files_already_committed += len(entries) - len(still_pending(entries, committed))
        if plan.empty:
            self.stats.commits_skipped += 1
        else:
            self.commit_files(plan, checkpoint_id)
            self.stats.commits += 1
            committed.update(dict(plan.versions))
        self.stats.last_commit_s = time.monotonic() - started
        with self._lock:
            self._pending = still_pending(self._pending, committed)
        note = {app: v for app, v in committed.items() if v is not None}
        objectstore.write(objectstore.join(self.staging, COMMITTED_NOTE),
                          json.dumps({"versions": note}, separators=(",", ":")).encode())
        return plan

    def _read_note(self) -> dict[str, int | None]:
        try:
            return dict(json.loads(objectstore.read(objectstore.join(self.staging, COMMITTED_NOTE)))["versions"])
        except FileNotFoundError:
            return {}

    def restore_state(self, state: Any) -> None:
        """The restored checkpoint's pending entries stay pending: they go into this subtask's next manifest,
        and the next commit adds those the table does not have (a commit of the restored checkpoint that
        happened before the failure is thereby skipped, not repeated). Every entry's data file must be a path
        inside the table (ForgedSinkState otherwise, before anything is pending): a forged checkpoint must not
        add a file from elsewhere to the table. (The table's place may come with the set-up: waited for.)"""
        pending = [list(e) for e in (state or {}).get("pending", [])]
        if pending:
            self._ready()
        for entry in pending:
            described = entry[2] if len(entry) == 3 and isinstance(entry[2], dict) else {}
            try:
                objectstore.confined_join(self.table_root(), described.get("path"), what="data file")
            except objectstore.OutsideDirectory:
                raise ForgedSinkState(f"{type(self).__name__} {self.table_root()}: the restored state names a "
                                      "data file that is not inside the table: refused") from None
        with self._lock:
            self._pending = pending

    def finish(self) -> None:
        self._flush()
        self._finished = True

    def restored_at_end(self, *, finished: bool) -> None:
        """Restored at its end of input, `finish` does not run again, yet the others must learn it ended
        (`committer_of`): restored finished, it takes part in no checkpoint of this run, and says so now (before
        its task ends, so before any checkpoint can complete without it); restored at its end, its next
        snapshot is its final one and writes the marker."""
        self._finished = True
        if finished:
            self._write_finish_marker(FINISHED_BEFORE_THIS_RUN)

    def _write_finish_marker(self, checkpoint_id: int) -> None:
        self._ready()  # the table's place may come with the set-up
        objectstore.write(objectstore.join(self.staging, "finished",
                                          finish_marker_name(self.attempt, self.subtask_index)),
                          json.dumps({"checkpoint": checkpoint_id}).encode())
        self._marked = True

    def close(self) -> None:
        """Waits for the commits under way: long at the end of a bounded input (the job's table is then
        complete when it is FINISHED), briefly after a cancel or failure (the restore lists the files again)."""
        self._rows = []
        thread = getattr(self, "_thread", None)
        if thread is None:
            return  # never opened, or closed
        timeout_s = self.close_timeout_s if self._finished else self.cancel_wait_s
        if not self.wait_committed(timeout_s):
            log.warning("%s: a table commit is still running after %gs; the restore redoes it if it does not land",
                        type(self).__name__, timeout_s)
        thread.shutdown(wait=False, cancel_futures=True)
        self._thread = None


def ensure_writable(root: str, what: str) -> None:
    """A local table directory can be created and written, or an s3:// bucket answers: else one line."""
    root = local_path(root)
    if objectstore.is_url(root):
        try:
            objectstore.check_reachable(root)
        except (OSError, objectstore.ObjectStoreUnavailable) as exc:
            raise TableConfigError(f"{what}: {exc}") from None
        return
    probe = root
    while probe and not os.path.exists(probe):
        probe = os.path.dirname(probe.rstrip("/")) or ""
    target = probe or "."
    if not os.path.isdir(target) or not os.access(target, os.W_OK | os.X_OK):
        raise TableConfigError(f"{what}: {root} is not writable ({target} is not a writable directory)")
