"""PostgreSQL change data capture: a consistent snapshot of the tables, then the logical replication stream.

Start. A new job (no restored position) creates the replication slot with `EXPORT_SNAPSHOT` (an existing,
idle slot of that name is dropped first: a new job starts from scratch). The slot's consistent point L0 and
the exported snapshot meet exactly: a transaction is in the snapshot iff its commit record lies before L0,
and the slot streams exactly the transactions whose commit lies at or after it.

Snapshot. The tables are read in order, each by primary key in chunks of `chunk_rows` (keyset pagination), as
records with op "r". The position is the last key read; a restore mid-snapshot cannot have the exported
snapshot back (it lived as long as the connection that created it), so it reads the rest as of a new
snapshot, exported by a temporary slot with consistent point L1, and records a *region*: keys after the
resume point were read as of L1. In the stream, a change to a key is emitted only if its transaction
committed at or after the L of the region that holds the key (`Regions.emits`): earlier ones are in the rows
the snapshot gave. So snapshot and stream meet exactly across any number of restores.

Stream. pgoutput (decoded by runtime/connectors/pgoutput.py) from the slot, as change records (op c/u/d/t,
before/after, table, commit LSN and time). The position is [end LSN of the last whole transaction handed
out, changes of the next transaction already handed out]; a restore starts the stream at that LSN and skips
those changes. The slot's confirmed flush LSN is advanced only to the position of a completed checkpoint
(`checkpoint_complete`), so the server keeps every change a restore may need; a position older than the slot's
confirmed LSN (a restore from a checkpoint older than the latest) is a clear error, as is a dropped slot or a
missing publication.

All I/O runs on a reader thread that fills a bounded queue; `read_batch` only drains it. A lost connection
(the server restarting) is retried from the last change queued for up to `retry_s`.

Parallel. Subtask i of p owns the primary keys whose md5 falls on i (`key_partition`, the same in SQL for the
snapshot: `partition_sql`) and has a slot of its own, `<slot>_<i>`: it snapshots its keys and streams their
changes (each subtask decodes the whole stream and keeps its keys), so the snapshot is read in parallel and a
key's changes stay in order in one subtask. What subtask i of p reads depends only on i, p and its position,
so at another parallelism each old subtask moves whole (`subtask_splits`, connectors/splits.py).
"""

from __future__ import annotations

import collections
import hashlib
import logging
import queue
import select
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from runtime.common.backoff import RetryWindow
from runtime.connectors import postgres as pgc
from runtime.connectors.pgoutput import ChangeDecoder, convert, lsn_text, parse_lsn
from runtime.connectors.postgres import PostgresConfigError, PostgresError, TableInfo
from runtime.connectors.source import Source

if TYPE_CHECKING:
    from runtime.connectors.submit import SubmitContext

log = logging.getLogger("sluice.postgres")

SLOT_RELEASE_S = 15.0  # how long a new job waits for the reader of an earlier attempt to let go of the slot
_NO_RECORD = object()  # a queue entry that only moves the position (a transaction with nothing to emit)


class SlotGone(PostgresConfigError):
    """The replication slot a restored job reads from no longer exists (or moved past the restored position)."""


# -- pure parts ----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Regions:
    """Which LSN the snapshot read each key at. `bounds` lists (table index, key after which the region
    starts (None: the table's start), LSN), in the order the snapshot resumed: each later region starts
    further on and covers the rest of the snapshot's order."""

    bounds: tuple[tuple[int, tuple[Any, ...] | None, int], ...]

    def lsn_of(self, table: int, key: tuple[Any, ...] | None) -> int:
        lsn = self.bounds[0][2]
        for bound_table, bound_key, bound_lsn in self.bounds:
            if table > bound_table or (table == bound_table and (bound_key is None or (key is not None
                                                                                     and key > bound_key))):
                lsn = bound_lsn
        return lsn

    def emits(self, table: int, key: tuple[Any, ...] | None, commit_lsn: int) -> bool:
        """Is a change of this key committed at `commit_lsn` new after the snapshot? Its transaction committed
        at or after the point the snapshot read the key at."""
        return commit_lsn >= self.lsn_of(table, key)

    def resumed(self, table: int, key: tuple[Any, ...] | None, lsn: int) -> Regions:
        return Regions((*self.bounds, (table, key, lsn)))


@dataclass(frozen=True, slots=True)
class CdcPosition:
    """Where the source stands: the regions, the snapshot's progress ([table index, last key]; None when it is
    done) and the stream's ([end LSN of the last whole transaction, changes of the next one handed out])."""

    regions: Regions
    snapshot: tuple[int, tuple[Any, ...] | None] | None
    lsn: int
    skip: int

    def to_state(self) -> dict[str, Any]:
        return {"regions": [[t, None if k is None else list(k), lsn] for t, k, lsn in self.regions.bounds],
                "snapshot": None if self.snapshot is None else [self.snapshot[0], None if self.snapshot[1] is None
                                                                else list(self.snapshot[1])],
                "lsn": lsn_text(self.lsn), "skip": self.skip}

    @staticmethod
    def from_state(state: dict[str, Any]) -> CdcPosition:
        regions = Regions(tuple((int(t), None if k is None else tuple(k), int(lsn))
                                for t, k, lsn in state["regions"]))
        snapshot = state["snapshot"]
        return CdcPosition(regions, None if snapshot is None else (int(snapshot[0]), None if snapshot[1] is None
                                                                   else tuple(snapshot[1])),
                           parse_lsn(state["lsn"]), int(state["skip"]))


def key_text(value: Any) -> str:
    """A key value as PostgreSQL's `::text` writes it (integers, text, numeric, booleans, uuids)."""
    if value is True or value is False:
        return "t" if value else "f"
    return "" if value is None else str(value)


def key_partition(key: Sequence[Any], parallelism: int) -> int:
    """Which subtask of a parallel source owns a primary key: the first 28 bits of the md5 of its text form
    (columns joined by U+001F), mod the parallelism. `partition_sql` computes the same in the database."""
    text = "\x1f".join(key_text(v) for v in key)
    return int(hashlib.md5(text.encode()).hexdigest()[:7], 16) % parallelism


def partition_sql(key_columns: Sequence[str], parallelism: int, subtask: int) -> str:
    """The snapshot's filter for subtask `subtask`: `key_partition` in SQL (identifiers already quoted)."""
    text = "concat_ws(chr(31), " + ", ".join(f"{c}::text" for c in key_columns) + ")"
    return f"mod(('x' || substr(md5({text}), 1, 7))::bit(28)::int, {int(parallelism)}) = {int(subtask)}"


def change_key(change: dict[str, Any], key_columns: Sequence[str]) -> tuple[Any, ...] | None:
    row = change["after"] if change["after"] is not None else change["before"]
    if row is None or not key_columns:
        return None
    return tuple(row.get(c) for c in key_columns)


class ChangeQueue:
    """The queued changes (each with the source's position after it), handed out as records. A change may make
    several records (`records_of`: a SQL table's update is -U then +U) and a batch holds at most `max_records`,
    so a batch may end inside a change: the position is then the one before that change plus the records of it
    already handed out (`rows` in the state), and a restore hands out the rest of it, exactly. The task counts
    a batch's records emitted and skips that many after a restore (runtime/execution/source_driver.py), so a
    batch must never hold more records than asked for.

    SNAPSHOT_ROWS_ALONE: that skip needs the records after a position to come again the same, which the stream
    does (the slot replays it) but a snapshot restored midway does not: its rest is read as of a new snapshot
    (a row deleted or changed since is not there, or differs, and its change is not streamed either). So a
    snapshot row is a batch of its own: a checkpoint never falls inside one, and the position it stores is
    after the last row handed out."""

    def __init__(self) -> None:
        self.entries: collections.deque[tuple[Any, CdcPosition]] = collections.deque()
        self.position: CdcPosition | None = None  # after the last change handed out whole
        self.rows_out = 0  # records of the next change already handed out
        self.last_commit_ms: int | None = None

    def restore(self, state: dict[str, Any]) -> CdcPosition:
        self.position = CdcPosition.from_state(state)
        self.rows_out = int(state.get("rows", 0))
        return self.position

    def state(self) -> dict[str, Any] | None:
        if self.position is None:
            return None
        state = self.position.to_state()
        if self.rows_out:
            state["rows"] = self.rows_out
        return state

    def take(self, max_records: int, records_of: Callable[[Any], list[Any]] | None) -> list[Any]:
        """Up to `max_records` records from the front; `records_of` None: each change is one record. The first
        batch only takes the position the reader queues first (the slot's start): the task stores the position
        before a batch, and a batch handed out from no position could not be resumed (a restore without one
        starts afresh: a new slot and snapshot)."""
        entries = self.entries
        out: list[Any] = []
        if self.position is None:
            while entries and entries[0][0] is _NO_RECORD:
                self.position = entries.popleft()[1]
            if self.position is not None:
                return out
        while entries and len(out) < max_records:
            change, position = entries[0]
            if change is not _NO_RECORD:
                if records_of is None:
                    out.append(change)
                else:
                    records = records_of(change)
                    room = max_records - len(out)
                    if len(records) - self.rows_out > room:  # the batch ends inside this change
                        out.extend(records[self.rows_out:self.rows_out + room])
                        self.rows_out += room
                        break
                    out.extend(records[self.rows_out:])
                    self.rows_out = 0
                if change.get("ts_ms") is not None:
                    self.last_commit_ms = change["ts_ms"]
                if change["op"] == "r":  # a snapshot row: a batch of its own (SNAPSHOT_ROWS_ALONE)
                    entries.popleft()
                    self.position = position
                    break
            entries.popleft()
            self.position = position
        return out


# -- the source ------------------------------------------------------------------------------------------------


class PostgresCdcSource(Source):
    """Snapshot then change stream of `tables` (see the module docstring). `publication` must exist and hold
    the tables (CREATE PUBLICATION <name> FOR TABLE ...); the slot is created by the job. With
    `snapshot=False` only the changes after the slot's creation are read."""

    bounded = False
    extras = ("postgres",)
    subtask_splits = True  # subtask i of p: its keys, its slot (see the module docstring)
    expands = False  # True: `records_of` may make several records of a change

    def __init__(self, dsn: str, tables: Sequence[str], *, slot: str = "sluice", publication: str = "sluice",
                 snapshot: bool = True, chunk_rows: int = 2000, max_buffered: int = 20000,
                 status_interval_s: float = 1.0, retry_s: float = 60.0, connect_timeout_s: float = 10.0) -> None:
        if not tables:
            raise ValueError("PostgresCdcSource needs at least one table")
        self.dsn = dsn
        self.tables = tuple(pgc.qualified(t) for t in tables)
        self.slot = slot
        self.publication = publication
        self.snapshot = snapshot
        self.chunk_rows = chunk_rows
        self.max_buffered = max_buffered
        self.status_interval_s = status_interval_s
        self.retry_s = retry_s
        self.connect_timeout_s = connect_timeout_s

    # -- configuration checks (at submit) ------------------------------------------------------------------

    def check_at_submit(self, context: SubmitContext) -> None:
        """The coordinator's submit check (runtime/graph/admission.py): one line, raised."""
        problem = self.check_submission(restore=context.restore)
        if problem:
            raise ValueError(problem)

    def check_submission(self, *, restore: bool) -> str | None:
        try:
            conn = pgc.connect(self.dsn, connect_timeout_s=self.connect_timeout_s)
        except PostgresError as exc:
            return str(exc)
        try:
            conn.autocommit = True
            with conn.cursor() as cur:
                _, problem = self._check(cur, restore=restore)
                return problem
        finally:
            conn.close()

    def _check(self, cur: Any, *, restore: bool) -> tuple[list[TableInfo], str | None]:
        where = "PostgresCdcSource"
        cur.execute("SHOW wal_level")
        if cur.fetchone()[0] != "logical":
            return [], f"{where}: the server's wal_level is not 'logical' (set it in postgresql.conf and restart)"
        cur.execute("SELECT rolreplication OR rolsuper FROM pg_roles WHERE rolname = current_user")
        if not cur.fetchone()[0]:
            return [], f"{where}: the user has no REPLICATION privilege (ALTER ROLE ... WITH REPLICATION)"
        infos = []
        for table in self.tables:
            info = pgc.table_info(cur, table)
            if info is None:
                return [], f"{where}: no table {table}"
            if not info.key:
                return [], f"{where}: table {table} has no primary key (the snapshot is read in its order)"
            cur.execute("SELECT has_table_privilege(%s, 'SELECT')", (table,))
            if not cur.fetchone()[0]:
                return [], f"{where}: no SELECT privilege on {table}"
            infos.append(info)
        cur.execute("SELECT 1 FROM pg_publication WHERE pubname = %s", (self.publication,))
        if cur.fetchone() is None:
            return [], (f"{where}: publication {self.publication!r} does not exist: CREATE PUBLICATION "
                        f"{self.publication} FOR TABLE {', '.join(self.tables)}")
        cur.execute("SELECT schemaname || '.' || tablename FROM pg_publication_tables WHERE pubname = %s",
                    (self.publication,))
        published = {r[0] for r in cur.fetchall()}
        missing = [t for t in self.tables if t not in published]
        if missing:
            return [], (f"{where}: publication {self.publication!r} does not hold {', '.join(missing)}: "
                        f"ALTER PUBLICATION {self.publication} ADD TABLE {', '.join(missing)}")
        if restore:  # the slot, or subtask 0's of a parallel source
            cur.execute("SELECT 1 FROM pg_replication_slots WHERE slot_name IN (%s, %s)", (self.slot, f"{self.slot}_0"))
            if cur.fetchone() is None:
                return [], f"{where}: replication slot {self.slot!r} is gone: the restored position cannot be read"
        return infos, None

    # -- the task's calls ------------------------------------------------------------------------------------

    @property
    def slot_name(self) -> str:
        """The replication slot of this subtask: `slot` alone, `<slot>_<i>` for subtask i of a parallel one."""
        return self.slot if self.parallelism == 1 else f"{self.slot}_{self.subtask_index}"

    def open(self, subtask_index: int, parallelism: int) -> None:
        super().open(subtask_index, parallelism)
        self._restored: CdcPosition | None = None
        self._reader: _Reader | None = None
        self._queue = ChangeQueue()

    def restore(self, position: Any) -> None:
        if position is not None:
            self._restored = self._queue.restore(position)

    def position(self) -> Any:
        return self._queue.state()

    def records_of(self, change: dict[str, Any]) -> list[Any]:
        """The records one change becomes: itself. A subclass may make several (a SQL table's update is -U
        and +U); it sets `expands`, and a batch may then end inside a change (ChangeQueue)."""
        return [change]

    def read_batch(self, max_records: int) -> list[Any] | None:
        reader = self._reader
        if reader is None:
            reader = self._reader = _Reader(self, self._restored)
            reader.start()
        entries = self._queue.entries
        while len(entries) < max_records:
            try:
                entries.extend(reader.out.get_nowait())
            except queue.Empty:
                break
        if not entries and reader.error is not None:
            raise reader.error
        return self._queue.take(max_records, self.records_of if self.expands else None)

    def idle_wait_s(self) -> float:
        return 0.005

    def checkpoint_complete(self, checkpoint_id: int, position: Any) -> None:
        """A checkpoint that stored `position` completed: the slot may forget what lies before it."""
        if position is not None and self._reader is not None:
            self._reader.confirm(CdcPosition.from_state(position).lsn)

    def statistics(self) -> dict[str, float]:
        """Replication lag: bytes of WAL the server has sent beyond what the task was handed, and the age of the
        commit of the last change handed on while there is more (0 when caught up). Once the reader has
        decoded all the server sent and the task took every queued change, the source has handed on all WAL
        up to there, also that of other tables' transactions, which move no position: no lag."""
        reader, changes = getattr(self, "_reader", None), getattr(self, "_queue", None)
        position = None if changes is None else changes.position
        if reader is None or changes is None or position is None or position.snapshot is not None:
            return {}
        decoded_to = reader.decoded_to  # read before the queues: a change queued after it is seen below
        queued = bool(changes.entries) or not reader.out.empty()
        handed_to = position.lsn if queued else max(position.lsn, decoded_to)
        lag_bytes = max(0, reader.wal_end - handed_to) if reader.wal_end else 0
        behind = queued or lag_bytes > 0
        last_ms = changes.last_commit_ms
        lag_s = (time.time() - last_ms / 1000.0) if behind and last_ms else 0.0
        return {"replication_lag_bytes": float(lag_bytes), "replication_lag_seconds": max(0.0, lag_s),
                "confirmed_lsn": float(reader.confirmed)}

    def close(self) -> None:
        if getattr(self, "_reader", None) is not None:
            assert self._reader is not None
            self._reader.stop()
            self._reader = None


class _Reader(threading.Thread):
    """The source's I/O: set-up, snapshot and stream, into `out` (lists of (record, position after it))."""

    def __init__(self, source: PostgresCdcSource, start: CdcPosition | None) -> None:
        super().__init__(name=f"postgres-cdc-{source.slot_name}", daemon=True)
        self.source = source
        self.start_position = start
        self.out: queue.Queue[list[tuple[Any, CdcPosition]]] = queue.Queue(
            maxsize=max(2, source.max_buffered // max(1, source.chunk_rows)))
        self.error: BaseException | None = None
        self.wal_end = 0  # the server's WAL position in its last message or keepalive
        self.decoded_to = 0  # wal_end when the reader last found nothing more to read between transactions
        self.confirmed = 0
        self._confirm_to = 0
        self._stopping = threading.Event()
        self._conns: list[Any] = []

    def confirm(self, lsn: int) -> None:
        self._confirm_to = max(self._confirm_to, lsn)

    def stop(self) -> None:
        self._stopping.set()
        for conn in list(self._conns):
            try:
                conn.cancel()
            except Exception:  # already closed or broken
                pass
        self.join(10)

    def run(self) -> None:
        try:
            self._run()
        except BaseException as exc:  # handed to read_batch, which raises it on the task
            if not self._stopping.is_set():
                self.error = exc
        finally:
            for conn in self._conns:
                try:
                    conn.close()
                except Exception:  # closing a broken connection
                    pass

    # -- connections -----------------------------------------------------------------------------------

    def _connect(self, *, replication: bool = False) -> Any:
        conn = pgc.connect(self.source.dsn, replication=replication, connect_timeout_s=self.source.connect_timeout_s)
        self._conns.append(conn)
        return conn

    def _close(self, conn: Any) -> None:
        if conn in self._conns:
            self._conns.remove(conn)
        try:
            conn.close()
        except Exception:  # broken already
            pass

    def _put(self, entries: list[tuple[Any, CdcPosition]]) -> None:
        while not self._stopping.is_set():
            try:
                self.out.put(entries, timeout=0.2)
                return
            except queue.Full:
                continue
        raise _Stopped

    # -- the phases ------------------------------------------------------------------------------------

    def _run(self) -> None:
        src = self.source
        pg = pgc.psycopg2()
        position = self.start_position
        retry = RetryWindow(src.retry_s)
        while not self._stopping.is_set():
            try:
                conn = self._connect()
                conn.autocommit = True
                with conn.cursor() as cur:
                    infos, problem = src._check(cur, restore=position is not None)
                    if problem is not None:
                        raise (SlotGone if "slot" in problem else PostgresConfigError)(problem)
                    if position is not None:
                        self._check_slot(cur, position)
                self._close(conn)
                if position is None:
                    position = self._create_slot_and_snapshot(infos)
                elif position.snapshot is not None:
                    position = self._resume_snapshot(infos, position)
                retry.succeeded()
                position = self._stream(infos, position)
                return
            except _Stopped:
                return
            except (pg.DatabaseError, pg.InterfaceError, PostgresError) as exc:
                # lost connections: OperationalError, or a DatabaseError without a server message (libpq's
                # "error with status PGRES_COPY_BOTH" when the server dies mid-stream); the rest is no
                # matter of waiting
                lost = isinstance(exc, (pg.OperationalError, pg.InterfaceError)) or (
                    isinstance(exc, pg.DatabaseError) and getattr(exc, "pgcode", None) is None)
                if isinstance(exc, PostgresConfigError) or self._stopping.is_set() or not (
                        lost or isinstance(exc, PostgresError)):
                    raise
                if not retry.failed(time.monotonic()):
                    raise PostgresError(f"PostgresCdcSource: failing for {src.retry_s:g}s: "
                                        f"{pgc.describe(exc)}") from None
                position = self._queued_position or position
                log.warning("postgres cdc %s: %s; reconnecting", src.slot_name, pgc.describe(exc))
                for conn in list(self._conns):
                    self._close(conn)
                self._stopping.wait(0.5)

    _queued_position: CdcPosition | None = None

    def _check_slot(self, cur: Any, position: CdcPosition) -> None:
        cur.execute("SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s",
                    (self.source.slot_name,))
        row = cur.fetchone()
        if row is None:
            raise SlotGone(f"PostgresCdcSource: replication slot {self.source.slot_name!r} is gone: the restored "
                           "position cannot be read (start the job afresh for a new snapshot)")
        confirmed = parse_lsn(row[0]) if row[0] else 0
        self.confirmed = max(self.confirmed, confirmed)
        if confirmed > position.lsn and position.snapshot is None:
            # psycopg2 moves the confirmed LSN on to the server's WAL end on a keepalive once everything
            # received was confirmed (nothing of ours lies between), so this is no proof of a gap; a restore
            # from a checkpoint older than the latest would have one
            log.warning("postgres cdc: slot %s has confirmed %s, after the restored position %s: changes in "
                        "between were confirmed by a later checkpoint", self.source.slot_name, row[0],
                        lsn_text(position.lsn))

    def _create_slot_and_snapshot(self, infos: list[TableInfo]) -> CdcPosition:
        src = self.source
        conn = self._connect()
        conn.autocommit = True
        with conn.cursor() as cur:
            deadline = time.monotonic() + SLOT_RELEASE_S
            while True:
                cur.execute("SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s", (src.slot_name,))
                row = cur.fetchone()
                if row is None or row[0] is None:
                    break
                # a reader of an earlier attempt that just died holds it until the server notices
                if time.monotonic() > deadline:
                    raise PostgresConfigError(f"PostgresCdcSource: replication slot {src.slot_name!r} is in use by "
                                              f"process {row[0]}: another job reads it")
                self._stopping.wait(0.2)
            if row is not None:
                cur.execute("SELECT pg_drop_replication_slot(%s)", (src.slot_name,))
        self._close(conn)
        repl = self._connect(replication=True)
        with repl.cursor() as rcur:
            rcur.execute(f'CREATE_REPLICATION_SLOT "{src.slot_name}" LOGICAL pgoutput EXPORT_SNAPSHOT')
            _, consistent_point, snapshot_name, _ = rcur.fetchone()
        start = parse_lsn(consistent_point)
        log.info("postgres cdc: created slot %s at %s", src.slot_name, consistent_point)
        position = CdcPosition(Regions(((0, None, start),)), (0, None) if src.snapshot else None, start, 0)
        self._put([(_NO_RECORD, position)])  # from here on a checkpoint has a position: the slot's start
        self._queued_position = position
        if src.snapshot:
            position = self._read_snapshot(infos, position, snapshot_name)
        self._close(repl)  # ends the exported snapshot; the slot stays
        return position

    def _resume_snapshot(self, infos: list[TableInfo], position: CdcPosition) -> CdcPosition:
        """The rest of the snapshot as of a new exported snapshot, from a temporary slot (see the docstring)."""
        assert position.snapshot is not None
        src = self.source
        repl = self._connect(replication=True)
        with repl.cursor() as rcur:
            rcur.execute(f'CREATE_REPLICATION_SLOT "{src.slot_name}_resume_{int(time.time() * 1000)}" TEMPORARY '
                         "LOGICAL pgoutput EXPORT_SNAPSHOT")
            _, consistent_point, snapshot_name, _ = rcur.fetchone()
        table, key = position.snapshot
        resumed = CdcPosition(position.regions.resumed(table, key, parse_lsn(consistent_point)), position.snapshot,
                              position.lsn, position.skip)
        log.info("postgres cdc: resuming the snapshot at table %d after %s as of %s", table, key, consistent_point)
        resumed = self._read_snapshot(infos, resumed, snapshot_name)
        self._close(repl)
        return resumed

    def _read_snapshot(self, infos: list[TableInfo], position: CdcPosition, snapshot_name: str) -> CdcPosition:
        pg = pgc.psycopg2()
        sql = pg.sql
        src = self.source
        conn = self._connect()
        conn.set_session(isolation_level="REPEATABLE READ", readonly=True)
        assert position.snapshot is not None
        table_index, last_key = position.snapshot
        with conn.cursor() as cur:
            cur.execute("SET TRANSACTION SNAPSHOT %s", (snapshot_name,))
            while table_index < len(infos):
                info = infos[table_index]
                schema, name = pgc.split_table(info.table)
                lsn = position.regions.lsn_of(table_index, last_key)
                key_at = [info.columns.index(k) for k in info.key]
                # values as text, converted as the stream's are; the key qualified, since ORDER BY would
                # otherwise take the text output column of that name
                select = sql.SQL("SELECT {} FROM {}.{} AS t").format(
                    sql.SQL(", ").join(sql.SQL("t.{}::text").format(sql.Identifier(c)) for c in info.columns),
                    sql.Identifier(schema), sql.Identifier(name))
                keys = sql.SQL(", ").join(sql.SQL("t.{}").format(sql.Identifier(k)) for k in info.key)
                order = sql.SQL(" ORDER BY {} LIMIT %s").format(keys)
                conditions = []
                if src.parallelism > 1:  # this subtask's share of the keys
                    quoted = [sql.SQL("t.{}").format(sql.Identifier(k)).as_string(conn) for k in info.key]
                    conditions.append(sql.SQL(partition_sql(quoted, src.parallelism, src.subtask_index)))
                if last_key is not None:
                    conditions.append(sql.SQL("({}) > ({})").format(keys, sql.SQL(", ").join(
                        sql.Placeholder() * len(info.key))))
                where = sql.SQL(" WHERE ") + sql.SQL(" AND ").join(conditions) if conditions else sql.SQL("")
                cur.execute(sql.Composed([select, where, order]),
                            (*(last_key or ()), src.chunk_rows))
                rows = cur.fetchall()
                entries: list[tuple[Any, CdcPosition]] = []
                for row in rows:
                    after = {c: convert(t, v) for c, t, v in zip(info.columns, info.type_oids, row, strict=True)}
                    last_key = tuple(after[info.columns[i]] for i in key_at)
                    position = CdcPosition(position.regions, (table_index, last_key), position.lsn, 0)
                    entries.append(({"op": "r", "table": info.table, "before": None, "after": after, "lsn": lsn,
                                     "ts_ms": None}, position))
                if len(rows) < src.chunk_rows:
                    table_index, last_key = table_index + 1, None
                    done = table_index >= len(infos)
                    position = CdcPosition(position.regions, None if done else (table_index, None), position.lsn, 0)
                    entries.append((_NO_RECORD, position))
                if entries:
                    self._put(entries)
                    self._queued_position = position
        conn.rollback()
        self._close(conn)
        return position

    def _owns(self, change: dict[str, Any], key_columns: Sequence[str]) -> bool:
        if change["op"] == "t":
            return self.source.subtask_index == 0  # a truncate once, from the first subtask
        key = change_key(change, key_columns)
        return key is None or key_partition(key, self.source.parallelism) == self.source.subtask_index

    def _stream(self, infos: list[TableInfo], position: CdcPosition) -> CdcPosition:
        src = self.source
        by_table = {info.table: (i, info.key) for i, info in enumerate(infos)}
        parallel = src.parallelism > 1
        repl = self._connect(replication=True)
        decoder = ChangeDecoder()
        skip = position.skip
        lsn = position.lsn
        with repl.cursor() as rcur:
            rcur.start_replication(slot_name=src.slot_name, decode=False, start_lsn=lsn,
                                   options={"proto_version": "1", "publication_names": src.publication},
                                   status_interval=max(1, int(src.status_interval_s)))
            last_feedback = 0.0
            while not self._stopping.is_set():
                now = time.monotonic()
                if now - last_feedback >= src.status_interval_s:
                    # the confirmed LSN only ever moves to a completed checkpoint's position
                    confirm = self._confirm_to
                    rcur.send_feedback(write_lsn=confirm, flush_lsn=confirm, reply=False)
                    self.confirmed = max(self.confirmed, confirm)
                    last_feedback = now
                message = rcur.read_message()
                if message is None:
                    self.wal_end = max(self.wal_end, int(rcur.wal_end or 0))
                    if not decoder.in_transaction:  # else the rest of one is still to come
                        self.decoded_to = self.wal_end
                    select.select([repl], [], [], min(0.2, src.status_interval_s))
                    continue
                self.wal_end = max(self.wal_end, int(message.wal_end or 0))
                txn = decoder.feed(bytes(message.payload))
                if txn is None or txn.end_lsn <= lsn:
                    continue  # within a transaction, or one handed out before
                emitted = []
                for change in txn.changes:
                    table_index, key_columns = by_table.get(change["table"], (None, ()))
                    if table_index is None:
                        continue  # a table of the publication this source does not read
                    if parallel and not self._owns(change, key_columns):
                        continue  # another subtask's key (every subtask reads the whole stream)
                    if position.regions.emits(table_index, change_key(change, key_columns), txn.commit_lsn):
                        emitted.append(change)
                entries: list[tuple[Any, CdcPosition]] = []
                for i, change in enumerate(emitted):
                    last = i == len(emitted) - 1
                    entries.append((change, CdcPosition(position.regions, None, txn.end_lsn if last else lsn,
                                                        0 if last else i + 1)))
                entries = entries[skip:]
                skip = 0
                lsn = txn.end_lsn
                position = CdcPosition(position.regions, None, lsn, 0)
                if not entries:
                    entries = [(_NO_RECORD, position)]
                self._put(entries)
                self._queued_position = position
        return position


class _Stopped(Exception):
    pass
