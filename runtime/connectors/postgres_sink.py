"""A PostgreSQL sink: a checkpoint's rows in one transaction, exactly once by two-phase commit.

Records are buffered between checkpoints (in upsert mode one row per key, the last one wins). At a checkpoint's
snapshot the buffer becomes a batch, written in one transaction with a marker row and prepared, `PREPARE
TRANSACTION '<gid>'`, with a transaction id naming the job, the sink, the subtask and the checkpoint
(`transaction_id`): durable in the server, invisible. When the checkpoint completes (`commit`), `COMMIT
PREPARED` publishes it. A batch's rows stay in every checkpoint's state until its transaction is committed. A
restore resolves this sink's prepared transactions by id (`recovery_plan`): those of the restored state's
batches are committed, every other one of the subtasks it takes over (later checkpoints, whose rows come
again) is rolled back, and a batch neither prepared nor committed (its marker row absent) is written.

The I/O runs on a thread of the sink's own (`_Committer`): `snapshot_state` and `commit` are called on the
worker's event loop and return at once, so a slow or restarting server never stalls the worker (a server
restart is retried for `retry_s`). `restore_state` (on the task's thread) waits for the recovery, so every
restored batch is in before any checkpoint of the new run completes: after a rescale another subtask may
own its keys and write them anew. Batches are prepared and committed in checkpoint order, and a batch is
prepared only once the one before it is committed: an earlier checkpoint's transaction still prepared (its
completion notice not here yet, or that checkpoint aborted) holds row locks that could block it.

`mode="upsert"` writes `INSERT ... ON CONFLICT (key) DO UPDATE`, so a row per key; `mode="append"` plain
INSERTs. `delivery="at-least-once"` commits each batch without preparing it (no ids, no markers; a restore
writes the batches of its state again: idempotent in upsert mode, duplicated in append mode).
"""

from __future__ import annotations

import hashlib
import logging
import secrets
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from runtime.common.backoff import RetryWindow
from runtime.connectors import postgres as pgc
from runtime.connectors.postgres import PostgresConfigError, PostgresError
from runtime.connectors.sinks import Sink

if TYPE_CHECKING:
    from runtime.connectors.submit import SubmitContext

log = logging.getLogger("sluice.postgres")

MODES = ("upsert", "append")
DELIVERIES = ("exactly-once", "at-least-once")
GID_MAX = 200  # PostgreSQL's limit on a prepared transaction's id (GIDSIZE - 1)
UNDEFINED_OBJECT = "42704"  # COMMIT/ROLLBACK PREPARED of an id the server does not hold
MARKER_TABLE = "sluice_sink_transactions"
MARKERS_KEPT = 1000  # checkpoints a subtask's marker rows are kept for: a restore looks back at most that far


# -- pure parts ----------------------------------------------------------------------------------------------


def gid_prefix(job: str, sink: str) -> str:
    """The part of every transaction id that names the job and the sink: `sluice:<job>:<sink>:`. Names too
    long for the id (with room for subtask and checkpoint) are replaced by a digest of themselves."""
    prefix = f"sluice:{job}:{sink}:"
    if len(prefix.encode()) > GID_MAX - 40:
        digest = hashlib.sha256(f"{job}\x00{sink}".encode()).hexdigest()[:32]
        prefix = f"sluice:{digest}:"
    return prefix


def transaction_id(prefix: str, subtask: int, checkpoint_id: int, token: str) -> str:
    """`<prefix><subtask>:<checkpoint>:<token>`; the token is drawn per opened sink, since checkpoint ids start
    again at 1 when a job is submitted anew."""
    return f"{prefix}{subtask}:{checkpoint_id}:{token}"


def parse_transaction_id(gid: str, prefix: str) -> tuple[int, int] | None:
    """(subtask, checkpoint) of one of this sink's transaction ids, None for anyone else's."""
    if not gid.startswith(prefix):
        return None
    rest = gid[len(prefix):].split(":")
    if len(rest) != 3 or not rest[0].isdigit() or not rest[1].isdigit() or not rest[2].isalnum():
        return None
    return int(rest[0]), int(rest[1])


@dataclass(frozen=True, slots=True)
class RecoveryPlan:
    commit: tuple[str, ...]  # prepared, of completed checkpoints: COMMIT PREPARED
    rollback: tuple[str, ...]  # prepared, of checkpoints after the restored one: ROLLBACK PREPARED
    rewrite: tuple[str, ...]  # deferred rows of completed checkpoints never committed: write, prepare, commit
    orphans: tuple[str, ...]  # rolled back although at or before the restored checkpoint (never in its state)


def recovery_plan(prepared: Iterable[str], prefix: str, *, pending: Iterable[Sequence[Any]], committed: Iterable[str],
                  owners: Iterable[int], restored_checkpoint: int | None) -> RecoveryPlan:
    """What to do on a restore. `pending`: the restored state's entries [checkpoint, gid, deferred rows or
    None], all of completed checkpoints; `committed`: the gids whose marker row is in the table (committed);
    `prepared`: the server's prepared transactions. Those of this sink and of the subtasks in `owners` are
    committed when pending, else rolled back (later checkpoints: their rows come again); deferred rows not
    prepared nor committed are written. Other sinks' and subtasks' transactions are left alone."""
    entries = [list(p) for p in pending]
    pending_gids, done, owner_set = {p[1] for p in entries}, set(committed), set(owners)
    prepared_ours = []
    for gid in sorted(prepared):
        parsed = parse_transaction_id(gid, prefix)
        if parsed is not None and parsed[0] in owner_set:
            prepared_ours.append((gid, parsed))
    commit = tuple(gid for gid, _ in prepared_ours if gid in pending_gids)
    rollback = tuple(gid for gid, _ in prepared_ours if gid not in pending_gids)
    orphans = tuple(gid for gid, (_, cp) in prepared_ours if gid not in pending_gids
                    and restored_checkpoint is not None and cp <= restored_checkpoint)
    prepared_gids = {gid for gid, _ in prepared_ours}
    rewrite = tuple(p[1] for p in entries if p[2] is not None and p[1] not in prepared_gids and p[1] not in done)
    return RecoveryPlan(commit, rollback, rewrite, orphans)


class Deleted(tuple):  # type: ignore[type-arg]
    """A buffered delete (`PostgresSink.delete`): the key's values, in `key` order. In memory only: a batch
    carries its deleted keys apart from its rows (`net_changes`)."""


def net_changes(changes: Iterable[Sequence[Any]], key_positions: Sequence[int]
                ) -> tuple[list[Sequence[Any]], list[tuple[Any, ...]]]:
    """(rows to upsert, keys to delete) of a checkpoint's writes and deletes in upsert mode: the last change of
    a key wins, so a key is in one list at most (a delete then a write of it is a write, a write then a delete
    is a delete)."""
    by_key: dict[Any, Sequence[Any]] = {}
    for change in changes:
        key = tuple(change) if isinstance(change, Deleted) else tuple(change[i] for i in key_positions)
        by_key[key] = change
    rows = [c for c in by_key.values() if not isinstance(c, Deleted)]
    return rows, [tuple(c) for c in by_key.values() if isinstance(c, Deleted)]


def upsert_rows(rows: Iterable[Sequence[Any]], key_positions: Sequence[int]) -> list[Sequence[Any]]:
    """One row per key, the last one written, in the order keys first appeared (ON CONFLICT DO UPDATE may not
    touch a row twice in one statement)."""
    by_key: dict[Any, Sequence[Any]] = {}
    for row in rows:
        by_key[tuple(row[i] for i in key_positions)] = row
    return list(by_key.values())


# -- the sink --------------------------------------------------------------------------------------------------


class PostgresSink(Sink):
    """Writes records (dicts by column name, or tuples in `columns` order) to `table`; see the module docstring.

    `key`: the conflict columns of upsert mode (a primary key or unique index of the table). `columns`: the
    columns written (default: the table's, read at open). `name`: the sink's part of the transaction ids
    (default: the table), unique among the sinks of a job that write to one table.
    """

    extras = ("postgres",)

    def __init__(self, dsn: str, table: str, *, key: Sequence[str] = (), mode: str = "upsert",
                 delivery: str = "exactly-once", columns: Sequence[str] | None = None, name: str | None = None,
                 page_rows: int = 1000, lock_timeout_s: float = 10.0, retry_s: float = 60.0,
                 connect_timeout_s: float = 10.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, not {mode!r}")
        if delivery not in DELIVERIES:
            raise ValueError(f"delivery must be one of {', '.join(DELIVERIES)}, not {delivery!r}")
        if mode == "upsert" and not key:
            raise ValueError("mode='upsert' needs key=[...]: the columns of the table's primary key")
        self.dsn = dsn
        self.table = pgc.qualified(table)
        self.key = tuple(key)
        self.mode = mode
        self.delivery = delivery
        self.columns = tuple(columns) if columns is not None else None
        self.name = name or self.table
        self.page_rows = page_rows
        self.lock_timeout_s = lock_timeout_s
        self.retry_s = retry_s
        self.connect_timeout_s = connect_timeout_s
        self.job_name = "job"

    def bind_job(self, job_name: str) -> None:
        """The job that holds this sink (DataStream.sink calls it): part of the transaction ids."""
        self.job_name = job_name

    @property
    def prefix(self) -> str:
        return gid_prefix(self.job_name, self.name)

    # -- configuration checks (at submit) ------------------------------------------------------------------

    def check_at_submit(self, context: SubmitContext) -> None:
        """The coordinator's submit check (runtime/graph/admission.py): one line, raised."""
        problem = self.check_submission(restore=context.restore)
        if problem:
            raise ValueError(problem)

    def check_submission(self, *, restore: bool) -> str | None:
        """One line saying why this sink cannot work against its server, or None. A new job (not a restore)
        is also refused while prepared transactions of this sink are left from an earlier run."""
        try:
            conn = pgc.connect(self.dsn, connect_timeout_s=self.connect_timeout_s)
        except PostgresError as exc:
            return str(exc)
        try:
            with conn.cursor() as cur:
                problem = self._check(cur)
                if problem is None and self.delivery == "exactly-once" and not restore:
                    left = [g for g in self._prepared(cur) if parse_transaction_id(g, self.prefix) is not None]
                    if left:
                        problem = (f"PostgresSink {self.table}: {len(left)} prepared transactions of this sink are "
                                   f"left from an earlier run ({left[0]}): restore that job from its checkpoint, "
                                   f"or roll them back (ROLLBACK PREPARED '{left[0]}')")
            return problem
        finally:
            conn.close()

    def _check(self, cur: Any) -> str | None:
        info = pgc.table_info(cur, self.table)
        where = f"PostgresSink {self.table}"
        if info is None:
            return f"{where}: no such table"
        columns = self.columns or info.columns
        unknown = [c for c in (*columns, *self.key) if c not in info.columns]
        if unknown:
            return f"{where}: no column {', '.join(unknown)} (the table has {', '.join(info.columns)})"
        if self.mode == "upsert" and set(self.key) != set(info.key) and not _has_unique_index(cur, self.table,
                                                                                               self.key):
            return (f"{where}: key {list(self.key)} is not the table's primary key or a unique index (ON CONFLICT "
                    "needs one)")
        privileges = ("INSERT", "UPDATE") if self.mode == "upsert" else ("INSERT",)
        for privilege in privileges:
            cur.execute("SELECT has_table_privilege(%s, %s)", (self.table, privilege))
            if not cur.fetchone()[0]:
                cur.execute("SELECT current_user")
                return f"{where}: user {cur.fetchone()[0]} has no {privilege} privilege on the table"
        if self.delivery == "exactly-once":
            cur.execute("SHOW max_prepared_transactions")
            if int(cur.fetchone()[0]) == 0:
                return (f"{where}: the server has max_prepared_transactions = 0, which exactly-once delivery needs "
                        "above 0 (set it in postgresql.conf and restart), or choose delivery='at-least-once'")
        return None

    @staticmethod
    def _prepared(cur: Any) -> list[str]:
        cur.execute("SELECT gid FROM pg_prepared_xacts WHERE database = current_database()")
        return [r[0] for r in cur.fetchall()]

    # -- the task's calls ------------------------------------------------------------------------------------

    def open(self, subtask_index: int, parallelism: int, attempt: int) -> None:
        super().open(subtask_index, parallelism, attempt)
        self._conn: Any = None
        self._rows: list[Sequence[Any]] = []
        self.rows_written = 0
        self.transactions_committed = 0
        self._token = secrets.token_hex(3)
        schema, _ = pgc.split_table(self.table)
        self._marker_table = f'"{schema}".{MARKER_TABLE}'
        self._marker_insert = f"INSERT INTO {self._marker_table} VALUES (%s, %s, %s, %s)"
        self._marker_cleanup = (f"DELETE FROM {self._marker_table} WHERE sink = %s AND subtask = %s "  # noqa: S608
                                "AND checkpoint < %s")

        def prepare_table() -> Any:
            with self._cursor() as cur:
                info = pgc.table_info(cur, self.table)
            if info is not None and self.delivery == "exactly-once":
                self._create_marker_table()
            return info

        info = self._retrying("reading the table's columns", prepare_table)
        if info is None:
            raise PostgresConfigError(f"PostgresSink: no table {self.table}")
        self._columns = self.columns or info.columns
        self._key_positions = [self._columns.index(k) for k in self.key]
        self._statement = self._insert_statement()
        self._io = _Committer(self)
        self._io.start()

    def _create_marker_table(self) -> None:
        """The marker rows say which transactions committed: each prepared transaction inserts its own, so a
        restore can tell a batch that was committed from one that never was."""
        pg = pgc.psycopg2()
        with self._cursor() as cur:
            try:
                cur.execute(f"CREATE TABLE IF NOT EXISTS {self._marker_table} (gid text PRIMARY KEY, "
                            "sink text NOT NULL, subtask int NOT NULL, checkpoint bigint NOT NULL)")
            except (pg.errors.UniqueViolation, pg.errors.DuplicateObject, pg.errors.DuplicateTable):
                pass  # another subtask created it at the same moment

    def _insert_statement(self) -> Any:
        sql = pgc.psycopg2().sql
        schema, name = pgc.split_table(self.table)
        target = sql.SQL("INSERT INTO {}.{} ({}) VALUES %s").format(
            sql.Identifier(schema), sql.Identifier(name), sql.SQL(", ").join(map(sql.Identifier, self._columns)))
        if self.mode == "append":
            return target
        others = [c for c in self._columns if c not in self.key]
        conflict = sql.SQL(" ON CONFLICT ({}) ").format(sql.SQL(", ").join(map(sql.Identifier, self.key)))
        if others:
            action = sql.SQL("DO UPDATE SET {}").format(sql.SQL(", ").join(
                sql.SQL("{} = EXCLUDED.{}").format(sql.Identifier(c), sql.Identifier(c)) for c in others))
        else:
            action = sql.SQL("DO NOTHING")
        return sql.Composed([target, conflict, action])

    def _delete_statement(self) -> Any:
        sql = pgc.psycopg2().sql
        schema, name = pgc.split_table(self.table)
        keys = sql.SQL(", ").join(map(sql.Identifier, self.key))
        return sql.SQL("DELETE FROM {}.{} WHERE ({}) IN (VALUES %s)").format(sql.Identifier(schema),
                                                                           sql.Identifier(name), keys)

    def write(self, record: Any) -> None:
        if isinstance(record, dict):
            self._rows.append(tuple(record.get(c) for c in self._columns))
        else:
            self._rows.append(tuple(record))

    def delete(self, record: Any) -> None:
        """Delete the row of this record's key (upsert mode; a dict by column name or a tuple in `columns`
        order): in the checkpoint's transaction, after or instead of the key's earlier writes (the last wins)."""
        if self.mode != "upsert":
            raise ValueError(f"PostgresSink {self.table}: a delete needs mode='upsert' (a key to delete by)")
        if isinstance(record, dict):
            self._rows.append(Deleted(record.get(k) for k in self.key))
        else:
            self._rows.append(Deleted(record[i] for i in self._key_positions))

    def snapshot_state(self, checkpoint_id: int) -> Any:
        """Hand the checkpoint's rows to the committer thread, which prepares them at once (unless an earlier
        checkpoint's transaction is still prepared: its row locks could block them, see the module docstring);
        the rows stay in every checkpoint's state until their transaction is committed."""
        self._io.check()
        if self._rows:
            rows, deletes = net_changes(self._rows, self._key_positions) if self.mode == "upsert" else (self._rows, [])
            self._rows = []
            gid = transaction_id(self.prefix, self.subtask_index, checkpoint_id, self._token)
            self._io.add(_Batch(checkpoint_id, gid if self.delivery == "exactly-once" else None, list(rows),
                                deletes=deletes))
        return self._io.state(checkpoint_id)

    def commit(self, checkpoint_id: int) -> None:
        self._io.check()
        self._io.complete(checkpoint_id)

    def restore_state(self, state: Any) -> None:
        """The restored checkpoint completed: its batches are committed (prepared ones), or written (those
        neither prepared nor committed); this subtask's other prepared transactions (and those of the
        subtasks it takes over after a rescale) are rolled back. On the committer thread, first; returns when
        that is done."""
        state = state or {}
        batches = [_Batch(int(cp), gid, [tuple(r) for r in rows], completed=True,
                          deletes=[tuple(k) for k in (deleted[0] if deleted else [])])
                   for cp, gid, rows, *deleted in state.get("pending", [])]
        owners = {self.subtask_index, *(int(s) for s in state.get("subtasks", []))}
        self._io.restore(batches, owners, state.get("checkpoint"))
        # Waited for (on the task's thread: SinkOperator.open): no checkpoint after the restore can complete,
        # and so no later batch be committed, before every subtask's recovery is done. After a rescale a
        # restored batch's keys may belong to another subtask, which writes them anew: an upsert of the old
        # rows (a batch deferred, never written) landing after its commit would overwrite newer rows, and a
        # batch still prepared would hold its rows' locks against it.
        self._io.wait_recovered()

    def _write(self, rows: Sequence[Sequence[Any]], gid: str | None, checkpoint_id: int,
               deletes: Sequence[Sequence[Any]] = ()) -> None:
        """The rows (and deleted keys) in one transaction: prepared as `gid` with its marker row (exactly once),
        or committed."""
        pg = pgc.psycopg2()
        with self._cursor() as cur:
            if gid is not None and gid in self._prepared(cur):
                return  # prepared before the connection broke: the answer was lost, not the transaction
            cur.execute("BEGIN")
            try:
                cur.execute(f"SET LOCAL lock_timeout = {int(self.lock_timeout_s * 1000)}")
                if rows:
                    pg.extras.execute_values(cur, self._statement, rows, page_size=self.page_rows)
                if deletes:
                    pg.extras.execute_values(cur, self._delete_statement(), deletes, page_size=self.page_rows)
                if gid is None:
                    cur.execute("COMMIT")
                else:
                    cur.execute(self._marker_insert, (gid, self.prefix, self.subtask_index, checkpoint_id))
                    cur.execute(self._marker_cleanup, (self.prefix, self.subtask_index, checkpoint_id - MARKERS_KEPT))
                    cur.execute("PREPARE TRANSACTION %s", (gid,))
            except BaseException:
                if self._conn is not None and not self._conn.closed:
                    try:
                        cur.execute("ROLLBACK")
                    except pg.Error:
                        pass
                raise
        self.rows_written += len(rows)

    def _finish_prepared(self, gids: Sequence[str], *, commit: bool) -> None:
        pg = pgc.psycopg2()
        verb = "COMMIT PREPARED" if commit else "ROLLBACK PREPARED"
        with self._cursor() as cur:
            for gid in gids:
                try:
                    cur.execute(f"{verb} %s", (gid,))  # noqa: S608 - the verb is one of two constants
                except pg.Error as exc:
                    if getattr(exc, "pgcode", None) != UNDEFINED_OBJECT:
                        raise
                    # not there: committed before (the notice or our answer was lost), or rolled back
                if commit:
                    self.transactions_committed += 1

    def _recover(self, batches: list[_Batch], owners: set[int], restored: int | None) -> RecoveryPlan:
        with self._cursor() as cur:
            prepared = self._prepared(cur)
            cur.execute(f"SELECT gid FROM {self._marker_table} WHERE gid = ANY(%s)",  # noqa: S608
                        ([b.gid for b in batches if b.gid is not None],))
            committed = {r[0] for r in cur.fetchall()}
        plan = recovery_plan(prepared, self.prefix, pending=[[b.checkpoint, b.gid, b.rows] for b in batches],
                             committed=committed, owners=owners, restored_checkpoint=restored)
        self._finish_prepared(plan.commit, commit=True)
        self._finish_prepared(plan.rollback, commit=False)
        for batch in batches:  # after the rollbacks: their row locks are gone
            if batch.gid in plan.rewrite:
                self._write(batch.rows, batch.gid, batch.checkpoint, batch.deletes)
                self._finish_prepared([batch.gid], commit=True)
        if plan.commit or plan.rollback or plan.rewrite:
            log.info("postgres sink %d: restored: committed %d, rolled back %d prepared transactions, wrote %d "
                     "batches again", self.subtask_index, len(plan.commit), len(plan.rollback), len(plan.rewrite))
        if plan.orphans:
            log.warning("postgres sink %d: rolled back %s, prepared for a checkpoint the restored state does not "
                        "list", self.subtask_index, ", ".join(plan.orphans))
        return plan

    def finish(self) -> None:
        self._finished = True

    def close(self) -> None:
        """At the end of a bounded input, waits (up to `retry_s`) until every completed checkpoint's batch is
        committed. Rows since the last snapshot are dropped (a restore produces them again); prepared
        transactions of checkpoints not completed stay for the restore that resolves them."""
        self._rows = []
        io = getattr(self, "_io", None)
        if io is not None:
            io.stop(wait_s=self.retry_s if getattr(self, "_finished", False) else 0.0)
        self._drop_connection()

    # -- connections ---------------------------------------------------------------------------------------

    def statistics(self) -> dict[str, float]:
        io = getattr(self, "_io", None)
        return {"open_prepared_transactions": float(io.open_batches() if io is not None else 0),
                "rows_written": float(getattr(self, "rows_written", 0))}

    def _cursor(self) -> Any:
        if self._conn is None or self._conn.closed:
            self._conn = pgc.connect(self.dsn, connect_timeout_s=self.connect_timeout_s)
            self._conn.autocommit = True
        return self._conn.cursor()

    def _drop_connection(self) -> None:
        conn, self._conn = getattr(self, "_conn", None), None
        if conn is not None and not conn.closed:
            try:
                conn.close()
            except Exception:  # closing a broken connection: nothing more to lose
                pass

    def _retrying(self, what: str, step: Any, *, retry_s: float | None = None) -> Any:
        """Run `step` until it succeeds; a lost connection or an unavailable server is retried on a new
        connection for up to `retry_s` (the server restarting), anything else fails at once."""
        pg = pgc.psycopg2()
        deadline = time.monotonic() + (self.retry_s if retry_s is None else retry_s)
        delay = 0.1
        while True:
            try:
                return step()
            except (pg.OperationalError, pg.InterfaceError, PostgresError) as exc:
                if isinstance(exc, PostgresConfigError):
                    raise
                lock_timeout = getattr(exc, "pgcode", None) == "55P03"
                self._drop_connection()
                if lock_timeout or time.monotonic() > deadline:
                    raise PostgresError(f"PostgresSink {self.table} subtask {self.subtask_index}: {what}: "
                                        f"{pgc.describe(exc)}") from None
                log.warning("postgres sink %d: %s: %s; retrying", self.subtask_index, what, pgc.describe(exc))
                time.sleep(delay)
                delay = min(delay * 2, 1.0)
            except pg.Error as exc:
                self._drop_connection()
                raise PostgresError(f"PostgresSink {self.table} subtask {self.subtask_index}: {what}: "
                                    f"{pgc.describe(exc)}") from None


@dataclass(slots=True)
class _Batch:
    """A checkpoint's rows until their transaction is committed."""

    checkpoint: int
    gid: str | None  # None: at least once (no transaction id, no marker)
    rows: list[Any]
    prepared: bool = False
    completed: bool = False  # its checkpoint completed
    deletes: list[Any] = field(default_factory=list)  # keys deleted (upsert mode), none of them in `rows`


class _Committer(threading.Thread):
    """The sink's I/O, off the task's thread and the worker's loop: the task hands it batches (at the snapshot)
    and completions (at the commit) and returns at once; it prepares, commits and recovers in checkpoint
    order, retrying a lost server for up to `retry_s` before the error fails the task at its next call."""

    def __init__(self, sink: PostgresSink) -> None:
        super().__init__(name=f"postgres-sink-{sink.subtask_index}", daemon=True)
        self.sink = sink
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._batches: list[_Batch] = []
        self._recovery: tuple[list[_Batch], set[int], int | None] | None = None
        self._recovered = threading.Event()
        self._owners: set[int] = set()
        self.error: BaseException | None = None

    # -- from the task ---------------------------------------------------------------------------------

    def check(self) -> None:
        if self.error is not None:
            raise self.error

    def add(self, batch: _Batch) -> None:
        with self._lock:
            self._batches.append(batch)
        self._wake.set()

    def complete(self, checkpoint_id: int) -> None:
        with self._lock:
            for batch in self._batches:
                if batch.checkpoint <= checkpoint_id:
                    batch.completed = True
        self._wake.set()

    def restore(self, batches: list[_Batch], owners: set[int], restored: int | None) -> None:
        with self._lock:
            self._batches = [*batches, *self._batches]
            self._recovery = (batches, owners, restored)
            self._owners = owners
        self._wake.set()

    def wait_recovered(self) -> None:
        """Until the restore's recovery is done (its `retry_s` bounds it: then the error is raised here)."""
        while not self._recovered.wait(0.05):
            if self.error is not None:
                raise self.error
            if not self.is_alive():
                raise PostgresError(f"PostgresSink {self.sink.table} subtask {self.sink.subtask_index}: its "
                                    "committer stopped before the restore was resolved")

    def state(self, checkpoint_id: int) -> dict[str, Any]:
        with self._lock:
            # [checkpoint, gid, rows], and the deleted keys fourth when there are any
            state: dict[str, Any] = {"pending": [[b.checkpoint, b.gid, list(b.rows)]
                                                 + ([list(b.deletes)] if b.deletes else [])
                                                 for b in self._batches],
                                     "checkpoint": checkpoint_id}
            if self._recovery is not None:  # not resolved yet: a restore from this state must do it
                state["subtasks"] = sorted(self._owners - {self.sink.subtask_index})
        return state

    def open_batches(self) -> int:
        with self._lock:
            return len(self._batches)

    def stop(self, *, wait_s: float) -> None:
        deadline = time.monotonic() + wait_s
        while wait_s > 0 and self.is_alive() and self.error is None and time.monotonic() < deadline:
            with self._lock:
                if not any(b.completed for b in self._batches) and self._recovery is None:
                    break
            time.sleep(0.01)
        self._stopping.set()
        self._wake.set()
        conn = self.sink._conn
        if conn is not None and not conn.closed:
            try:
                conn.cancel()  # a statement waiting on the server
            except Exception:  # broken already
                pass
        self.join(10)

    # -- on the thread -------------------------------------------------------------------------------------

    def run(self) -> None:
        pg = pgc.psycopg2()
        retry = RetryWindow(self.sink.retry_s)
        while not self._stopping.is_set():
            self._wake.wait(0.5)
            self._wake.clear()
            try:
                self._step()
                retry.succeeded()
            except (pg.OperationalError, pg.InterfaceError, PostgresError) as exc:
                if self._stopping.is_set():
                    return
                lock_timeout = getattr(exc, "pgcode", None) == "55P03"
                self.sink._drop_connection()
                if lock_timeout or isinstance(exc, PostgresConfigError) or not retry.failed(time.monotonic()):
                    self.error = PostgresError(f"PostgresSink {self.sink.table} subtask {self.sink.subtask_index}: "
                                               f"{pgc.describe(exc)}")
                    return
                log.warning("postgres sink %d: %s; retrying", self.sink.subtask_index, pgc.describe(exc))
                self._stopping.wait(0.2)
                self._wake.set()
            except pg.Error as exc:
                if not self._stopping.is_set():
                    self.error = PostgresError(f"PostgresSink {self.sink.table} subtask {self.sink.subtask_index}: "
                                               f"{pgc.describe(exc)}")
                return

    def _step(self) -> None:
        sink = self.sink
        with self._lock:
            recovery = self._recovery
        if recovery is not None:
            batches, owners, restored = recovery
            if sink.delivery == "exactly-once":
                sink._recover(batches, owners, restored)
            else:
                for batch in batches:  # at least once: written again
                    sink._write(batch.rows, None, batch.checkpoint, batch.deletes)
            with self._lock:
                self._batches = [b for b in self._batches if all(b is not r for r in batches)]
                self._recovery = None
            self._recovered.set()
        while not self._stopping.is_set():
            with self._lock:
                if not self._batches:
                    return
                batch = self._batches[0]  # in checkpoint order: an earlier prepared one is committed first
            if batch.gid is None:
                sink._write(batch.rows, None, batch.checkpoint, batch.deletes)
            elif not batch.prepared:
                sink._write(batch.rows, batch.gid, batch.checkpoint, batch.deletes)
                batch.prepared = True
                continue
            elif batch.completed:
                sink._finish_prepared([batch.gid], commit=True)
            else:
                return  # prepared; committed when its checkpoint completes
            with self._lock:
                self._batches.pop(0)


def _has_unique_index(cur: Any, table: str, columns: Sequence[str]) -> bool:
    schema, name = pgc.split_table(table)
    cur.execute(
        "SELECT array_agg(a.attname::text) FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid "
        "JOIN pg_namespace n ON n.oid = c.relnamespace "
        "JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = ANY(i.indkey) "
        "WHERE n.nspname = %s AND c.relname = %s AND i.indisunique GROUP BY i.indexrelid", (schema, name))
    return any(set(r[0]) == set(columns) for r in cur.fetchall())
