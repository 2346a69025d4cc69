"""What the table sinks (Delta, Iceberg) share: Parquet data files written while a checkpoint runs, pending
entries in the checkpoint and in staging manifests, and one table commit per completed checkpoint made by
subtask 0 (the protocol and its invariant: runtime/connectors/lake_commits.py).

Staging manifests live beside the table, under `<table>/_sluice/<app id>/` (readers of Delta and Iceberg
tables ignore what the table's log or metadata does not name, and `_`-prefixed directories by convention):
`<checkpoint>-<subtask>.json` lists a subtask's pending entries at that checkpoint's barrier, written before
the subtask acknowledges the checkpoint, so when the checkpoint completes every subtask's list is there for
the committer. `committed.json` is the committer's note of the versions it last saw in the table; the other
subtasks read it at their barriers to forget entries the table has (a stale or missing note only makes them
list an entry once more, which the committer then skips).

Files written and never committed (a failed attempt's) stay in the table's directory unnamed by the table:
Delta's VACUUM and Iceberg's orphan-file removal delete them.
"""

from __future__ import annotations

import json
import logging
import os
import time
import uuid
from dataclasses import dataclass
from typing import Any

from runtime.common import extras, objectstore
from runtime.connectors.lake_commits import (
    CommitPlan,
    Entry,
    app_id_of,
    apps_of,
    manifest_name,
    manifests_of,
    manifests_up_to,
    plan_commit,
    still_pending,
)
from runtime.connectors.sinks import Sink

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
    commits: int = 0  # table commits this subtask made (subtask 0 only)
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
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.columns = list(columns) if columns else None
        self.schema = schema
        self.file_rows = file_rows
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
        super().open(subtask_index, parallelism, attempt)
        self.app_id = app_id_of(self.job_id, self.uid)
        self._pa = pyarrow_module()
        self._rows: list[Any] = []
        self._written: list[dict[str, Any]] = []  # data files since the last barrier
        self._pending: list[Entry] = []
        self._file_counter = 0
        self.stats = TableSinkStatistics()

    @property
    def staging(self) -> str:
        return objectstore.join(self.table_root(), "_sluice", self.app_id)

    def statistics(self) -> TableSinkStatistics:
        self.stats.files_pending = len(self._pending) + len(self._written)
        return self.stats

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
        table = self._arrow(self._rows)
        files = self.write_data_files(table)
        self._written += files
        self.stats.files_written += len(files)
        self.stats.rows_written += len(self._rows)
        self._rows = []

    def snapshot_state(self, checkpoint_id: int) -> Any:
        self._flush()
        self._pending += [[checkpoint_id, self.app_id, f] for f in self._written]
        self._written = []
        if self.subtask_index != 0:  # subtask 0 knows what it committed; the others learn it from the note
            self._pending = still_pending(self._pending, self._read_note())
        manifest = json.dumps({"app": self.app_id, "checkpoint": checkpoint_id, "subtask": self.subtask_index,
                               "pending": self._pending}, separators=(",", ":")).encode()
        objectstore.write(objectstore.join(self.staging, manifest_name(checkpoint_id, self.subtask_index)), manifest)
        return {"pending": [list(e) for e in self._pending], "checkpoint": checkpoint_id}

    def commit(self, checkpoint_id: int) -> None:
        if self.subtask_index != 0:
            return
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
        happened before the failure is thereby skipped, not repeated)."""
        self._pending = [list(e) for e in (state or {}).get("pending", [])]

    def finish(self) -> None:
        self._flush()

    def close(self) -> None:
        self._rows = []


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
