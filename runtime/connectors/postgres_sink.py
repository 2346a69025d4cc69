"""A PostgreSQL sink: a checkpoint's rows in one transaction, exactly once by two-phase commit.

Records are buffered between checkpoints (in upsert mode one row per key, the last one wins). At a checkpoint's
snapshot the buffer is written in one transaction that is then prepared, `PREPARE TRANSACTION '<gid>'`, with
a transaction id naming the job, the sink, the subtask and the checkpoint (`transaction_id`): the rows are
durable in the server but invisible. When the checkpoint completes (`commit`), `COMMIT PREPARED` publishes
them. A restore resolves the prepared transactions of this sink by their ids (`recovery_plan`): those the
restored checkpoint lists as pending (it and older ones whose commit had not landed) are committed, every
other one of the subtasks it takes over (later checkpoints, whose rows will be written again) is rolled back.

`mode="upsert"` writes `INSERT ... ON CONFLICT (key) DO UPDATE`, so a row per key; `mode="append"` plain
INSERTs. `delivery="at-least-once"` commits at the snapshot instead of preparing (no prepared transactions; a
restore writes the rows after the checkpoint again: idempotent in upsert mode, duplicated in append mode).

Writes happen only at the snapshot, never in `write`: a row lock held by a prepared transaction can therefore
only delay a snapshot, never the records flowing. A snapshot that meets such a lock (the previous
checkpoint's transaction still prepared because its completion notice has not arrived, or that checkpoint
was aborted) waits up to `lock_timeout_s`, then fails the checkpoint; the restore resolves it.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

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

    blocking = True  # writes wait on the server: the task runs the chain on a thread of its own
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
        self._pending: list[list[Any]] = []  # [checkpoint id, gid], prepared, not known committed
        self.rows_written = 0
        self.transactions_committed = 0

        def read_table() -> Any:
            with self._cursor() as cur:
                return pgc.table_info(cur, self.table)

        info = self._retrying("reading the table's columns", read_table)
        if info is None:
            raise PostgresConfigError(f"PostgresSink: no table {self.table}")
        self._columns = self.columns or info.columns
        self._key_positions = [self._columns.index(k) for k in self.key]
        self._statement = self._insert_statement()
        self._token = secrets.token_hex(3)
        schema, _ = pgc.split_table(self.table)
        self._marker_table = f'"{schema}".{MARKER_TABLE}'
        self._marker_insert = f"INSERT INTO {self._marker_table} VALUES (%s, %s, %s, %s)"
        self._marker_cleanup = (f"DELETE FROM {self._marker_table} WHERE sink = %s AND subtask = %s "  # noqa: S608
                                "AND checkpoint < %s")
        if self.delivery == "exactly-once":
            self._retrying("creating the transaction marker table", self._create_marker_table)

    def _create_marker_table(self) -> None:
        """The marker rows say which transactions committed: each prepared transaction inserts its own, so a
        restore can tell a batch that was committed from one that never was (deferred rows, below)."""
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

    def write(self, record: Any) -> None:
        if isinstance(record, dict):
            self._rows.append(tuple(record.get(c) for c in self._columns))
        else:
            self._rows.append(tuple(record))

    def snapshot_state(self, checkpoint_id: int) -> Any:
        if self._rows:
            rows = upsert_rows(self._rows, self._key_positions) if self.mode == "upsert" else self._rows
            self._rows = []
            if self.delivery != "exactly-once":
                self._retrying(f"writing checkpoint {checkpoint_id}'s {len(rows)} rows",
                               lambda: self._write(rows, None, checkpoint_id))
            elif self._pending:
                # an earlier checkpoint's transaction is still prepared (its completion notice has not come,
                # or it was aborted): its row locks could block this one's writes, and the notice that
                # releases them waits behind this snapshot. The rows go into the checkpoint instead, and are
                # written once the earlier transactions are committed (`commit`)
                self._pending.append([checkpoint_id, transaction_id(self.prefix, self.subtask_index,
                                                                    checkpoint_id, self._token), list(rows)])
            else:
                gid = transaction_id(self.prefix, self.subtask_index, checkpoint_id, self._token)
                self._retrying(f"writing checkpoint {checkpoint_id}'s {len(rows)} rows",
                               lambda: self._write(rows, gid, checkpoint_id))
                self._pending.append([checkpoint_id, gid, None])
            self.rows_written += len(rows)
        return {"pending": [list(p) for p in self._pending], "checkpoint": checkpoint_id}

    def _write(self, rows: Sequence[Sequence[Any]], gid: str | None, checkpoint_id: int) -> None:
        """The rows in one transaction: prepared as `gid` with its marker row (exactly once), or committed."""
        pg = pgc.psycopg2()
        with self._cursor() as cur:
            if gid is not None and gid in self._prepared(cur):
                return  # prepared before the connection broke: the answer was lost, not the transaction
            cur.execute("BEGIN")
            try:
                cur.execute(f"SET LOCAL lock_timeout = {int(self.lock_timeout_s * 1000)}")
                pg.extras.execute_values(cur, self._statement, rows, page_size=self.page_rows)
                if gid is None:
                    cur.execute("COMMIT")
                    return
                cur.execute(self._marker_insert, (gid, self.prefix, self.subtask_index, checkpoint_id))
                cur.execute(self._marker_cleanup, (self.prefix, self.subtask_index, checkpoint_id - MARKERS_KEPT))
                cur.execute("PREPARE TRANSACTION %s", (gid,))
            except BaseException:
                if not self._conn.closed:
                    try:
                        cur.execute("ROLLBACK")
                    except pg.Error:
                        pass
                raise

    def commit(self, checkpoint_id: int) -> None:
        """Commit the prepared transactions up to `checkpoint_id`, then write what waited for them: deferred
        rows of completed checkpoints are prepared and committed, the first of a later one prepared."""
        try:
            self._retrying(f"committing checkpoint {checkpoint_id}", lambda: self._commit_due(checkpoint_id),
                           retry_s=min(self.retry_s, 2.0))
        except PostgresError as exc:  # they stay pending: the next commit, or a restore, commits them
            log.warning("postgres sink %d: %s (retried at the next checkpoint)", self.subtask_index, exc)

    def _commit_due(self, checkpoint_id: int) -> None:
        while self._pending:
            entry = self._pending[0]
            if entry[2] is not None:  # deferred rows: nothing is prepared before them any more
                self._write(entry[2], entry[1], entry[0])
                entry[2] = None
            if entry[0] > checkpoint_id:
                return  # prepared, committed when its checkpoint completes
            self._finish_prepared([entry[1]], commit=True)
            self._pending.pop(0)

    def _finish_prepared(self, gids: list[str], *, commit: bool) -> None:
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

    def restore_state(self, state: Any) -> None:
        state = state or {}
        if self.delivery != "exactly-once":
            return
        pending = [list(p) for p in state.get("pending", [])]
        owners = {self.subtask_index, *(int(s) for s in state.get("subtasks", []))}

        def resolve() -> RecoveryPlan:
            with self._cursor() as cur:
                prepared = self._prepared(cur)
                cur.execute(f"SELECT gid FROM {self._marker_table} WHERE gid = ANY(%s)",  # noqa: S608
                            ([p[1] for p in pending],))
                committed = {r[0] for r in cur.fetchall()}
            plan = recovery_plan(prepared, self.prefix, pending=pending, committed=committed, owners=owners,
                                 restored_checkpoint=state.get("checkpoint"))
            self._finish_prepared(list(plan.commit), commit=True)
            self._finish_prepared(list(plan.rollback), commit=False)
            for entry in pending:  # after the rollbacks: their locks are gone
                if entry[1] in plan.rewrite:
                    self._write(entry[2], entry[1], entry[0])
                    self._finish_prepared([entry[1]], commit=True)
            return plan

        plan = self._retrying("resolving prepared transactions", resolve)
        if plan.commit or plan.rollback or plan.rewrite:
            log.info("postgres sink %d: restored: committed %d, rolled back %d prepared transactions, wrote %d "
                     "deferred batches", self.subtask_index, len(plan.commit), len(plan.rollback),
                     len(plan.rewrite))
        if plan.orphans:
            log.warning("postgres sink %d: rolled back %s, prepared for a checkpoint the restored state does not "
                        "list", self.subtask_index, ", ".join(plan.orphans))

    def close(self) -> None:
        """Rows since the last snapshot are dropped (the restore produces them again); prepared transactions
        stay for the commit or the restore that resolves them."""
        self._rows = []
        self._drop_connection()

    # -- connections ---------------------------------------------------------------------------------------

    def statistics(self) -> dict[str, float]:
        return {"open_prepared_transactions": float(len(getattr(self, "_pending", []))),
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


def _has_unique_index(cur: Any, table: str, columns: Sequence[str]) -> bool:
    schema, name = pgc.split_table(table)
    cur.execute(
        "SELECT array_agg(a.attname::text) FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid "
        "JOIN pg_namespace n ON n.oid = c.relnamespace "
        "JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = ANY(i.indkey) "
        "WHERE n.nspname = %s AND c.relname = %s AND i.indisunique GROUP BY i.indexrelid", (schema, name))
    return any(set(r[0]) == set(columns) for r in cur.fetchall())
