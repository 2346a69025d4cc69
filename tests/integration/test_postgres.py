"""The PostgreSQL connectors against a real PostgreSQL 15 server (one per module, a database per test).

The change-capture source: its snapshot and stream meet exactly, also when it is restored mid-snapshot and
mid-transaction (a strict replica fails on a missed or repeated change), and the slot's confirmed LSN moves
only when a checkpoint completes. The sink: rows invisible while prepared, published on commit, prepared
transactions resolved by id on restore, also at another parallelism. A parallel source deals keys to its
subtasks. Bad configuration is one line. And a job CDC (2 subtasks) -> keyed totals -> PostgresSink (upsert
and append, exactly once) with unaligned checkpoints whose source worker is killed with SIGKILL mid-run,
whose PostgreSQL server is killed and restarted mid-run, and which is rescaled from 2 to 3 subtasks (source,
aggregation, sinks) mid-run: the tables end exact.
"""

from __future__ import annotations

import asyncio
import copy
import os
import signal
import time
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.cluster import Cluster, logs, poll, write_module
from tests.support.postgres_server import PostgresServer, postgres_bin_dir
from tests.support.scrape import scrape

psycopg2 = pytest.importorskip("psycopg2", reason="psycopg2 is not installed (the `postgres` extra)")

from netstack.errors import RpcError  # noqa: E402
from runtime.checkpointing.rescaling import rescale_sinks  # noqa: E402
from runtime.connectors.pgoutput import parse_lsn  # noqa: E402
from runtime.connectors.postgres_cdc import PostgresCdcSource, SlotGone  # noqa: E402
from runtime.connectors.postgres_sink import PostgresSink  # noqa: E402
from tests.support.postgres_tables import (  # noqa: E402
    OrdersWriter,
    Replica,
    execute,
    make_orders,
    new_database,
    table_rows,
    wait_until,
)

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def pg() -> Iterator[PostgresServer]:
    if postgres_bin_dir() is None:
        pytest.skip("PostgreSQL 15 is not installed (scripts/bootstrap.sh installs it as root: apt-get install "
                    "postgresql)")
    server = PostgresServer()
    try:
        yield server
    finally:
        server.remove()
        assert server.proc is not None and server.proc.poll() is not None, "postgres survived the tests"


def read(source: PostgresCdcSource, replica: Replica, *, limit: int | None = None, until: Any = None,
         timeout_s: float = 60.0) -> None:
    """Read as the task does (never waiting inside read_batch) into `replica`: `limit` records, or until
    `until()` holds."""
    read_n = 0

    def more() -> bool:
        nonlocal read_n
        while True:  # on until nothing is ready (a snapshot row is a batch of its own)
            batch = source.read_batch(100 if limit is None else min(100, limit - read_n))
            assert batch is not None
            for change in batch:
                replica.apply(change)
            read_n += len(batch)
            if limit is not None and read_n >= limit:
                return True
            if not batch:
                return until is not None and until()

    wait_until(more, timeout_s, f"the source to read {limit if limit is not None else 'up to the table'}")


def slot_confirmed(dsn: str, slot: str) -> str:
    return execute(dsn, "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s",
                   params=(slot,))[0][0]


# -- the source ---------------------------------------------------------------------------------------------------


def test_snapshot_and_stream_meet_exactly_across_restores(pg: PostgresServer) -> None:
    dsn = new_database(pg, "cdc_restore")
    make_orders(dsn, 2000, customers=10)

    def source() -> PostgresCdcSource:
        return PostgresCdcSource(dsn, ["orders"], slot="restore_slot", chunk_rows=300)

    # 700 rows of the snapshot, then a "crash": only what the checkpoint at that position holds survives
    first = source()
    first.open(0, 1)
    replica = Replica()
    read(first, replica, limit=700)
    at_700 = first.position()
    assert at_700["snapshot"] == [0, [700]] and len(at_700["regions"]) == 1
    start_lsn = slot_confirmed(dsn, "restore_slot")
    # changes on both sides of the snapshot's position, while it is down: the rows after it are read anew
    # (as of a later snapshot) and must not come again from the stream; those before it come from the stream
    execute(dsn, "UPDATE orders SET amount = amount + 1000 WHERE id IN (5, 1500)",
            "DELETE FROM orders WHERE id IN (6, 1600)", "INSERT INTO orders VALUES (5000, 'c01', 7)")
    execute(dsn, "UPDATE orders SET amount = 1 WHERE id = 5")
    first.close()

    second = source()
    second.open(0, 1)
    second.restore(at_700)
    read(second, replica, until=lambda: replica.rows == table_rows(dsn))
    assert len(second.position()["regions"]) == 2  # keys after 700 read as of the resumed snapshot
    # one transaction of five changes, read up to its second change: the restore resumes inside it
    execute(dsn, "INSERT INTO orders VALUES (6000, 'c02', 1), (6001, 'c02', 2)",
            "UPDATE orders SET amount = 3 WHERE id IN (6000, 7)", "DELETE FROM orders WHERE id = 8")
    read(second, replica, limit=2)
    mid_transaction = second.position()
    checkpointed_rows = copy.deepcopy(replica.rows)
    assert mid_transaction["skip"] == 2
    assert slot_confirmed(dsn, "restore_slot") == start_lsn  # no checkpoint completed yet
    second.checkpoint_complete(1, mid_transaction)
    wait_until(lambda: slot_confirmed(dsn, "restore_slot") == mid_transaction["lsn"], 10,
               "the slot to confirm the completed checkpoint's position")
    execute(dsn, "UPDATE orders SET amount = 4 WHERE id = 6001")
    read(second, replica, limit=2)  # read on past it, then "crash" again
    second.close()

    third = source()
    third.open(0, 1)
    third.restore(mid_transaction)
    replica.rows = checkpointed_rows  # downstream state as of that checkpoint
    read(third, replica, until=lambda: replica.rows == table_rows(dsn))
    assert replica.rows[6000]["amount"] == 3 and 8 not in replica.rows and replica.rows[6001]["amount"] == 4
    third.close()


def test_a_parallel_source_splits_snapshot_and_stream_by_key(pg: PostgresServer) -> None:
    """Two subtasks, a slot each: every key's snapshot row and changes come from exactly one of them (a key
    read by both, or by neither, fails the strict replica)."""
    dsn = new_database(pg, "cdc_parallel")
    make_orders(dsn, 1000, customers=5)
    sources = [PostgresCdcSource(dsn, ["orders"], slot="par", chunk_rows=200) for _ in range(2)]
    for subtask, source in enumerate(sources):
        source.open(subtask, 2)
    try:
        read_in_parallel(dsn, sources)
    finally:
        for source in sources:
            source.close()


def read_in_parallel(dsn: str, sources: list[PostgresCdcSource]) -> None:
    replica = Replica()
    snapshot_rows = []
    for source in sources:
        before = replica.applied
        read(source, replica, until=lambda s=source: s.position() is not None and s.position()["snapshot"] is None)
        snapshot_rows.append(replica.applied - before)
    assert sum(snapshot_rows) == 1000 and min(snapshot_rows) > 400, snapshot_rows  # md5 halves the keys
    assert sorted(r[0] for r in execute(
        dsn, "SELECT slot_name FROM pg_replication_slots WHERE database = current_database()")) == ["par_0", "par_1"]
    execute(dsn, "UPDATE orders SET amount = amount + 1 WHERE id % 7 = 0", "DELETE FROM orders WHERE id % 11 = 0",
            "INSERT INTO orders SELECT g, 'c09', 1 FROM generate_series(2000, 2100) g")

    def caught_up() -> bool:
        for source in sources:
            for change in source.read_batch(500) or []:
                replica.apply(change)
        return replica.rows == table_rows(dsn)

    wait_until(caught_up, 60, "both subtasks to bring the replica up to the table")


def test_a_column_added_mid_stream_then_a_dropped_slot_and_a_missing_publication(pg: PostgresServer) -> None:
    dsn = new_database(pg, "cdc_errors")
    make_orders(dsn, 10, customers=2)
    source = PostgresCdcSource(dsn, ["orders"], slot="gone_slot")
    source.open(0, 1)
    replica = Replica()
    read(source, replica, limit=10)
    execute(dsn, "ALTER TABLE orders ADD COLUMN note text", "INSERT INTO orders VALUES (11, 'c00', 5, 'new')")
    execute(dsn, "UPDATE orders SET note = 'old' WHERE id = 1")
    read(source, replica, limit=2)
    assert replica.rows[11] == {"id": 11, "customer": "c00", "amount": 5, "note": "new"}
    assert replica.rows[1]["note"] == "old" and set(replica.rows[1]) == {"id", "customer", "amount", "note"}
    # the lag figures against the server's: one change of a transaction of three handed on
    committed_after = time.time()
    execute(dsn, "INSERT INTO orders VALUES (12, 'c01', 1, ''), (13, 'c01', 2, ''), (14, 'c01', 3, '')")
    read(source, replica, limit=1)
    lag = source.statistics()
    server_wal = parse_lsn(execute(dsn, "SELECT pg_current_wal_lsn()::text")[0][0])
    assert 0 < lag["replication_lag_bytes"] <= server_wal - parse_lsn(source.position()["lsn"]), (lag, server_wal)
    assert 0 <= lag["replication_lag_seconds"] <= time.time() - committed_after + 0.01, lag
    read(source, replica, limit=2)
    # caught up, while the server goes on with a table the source does not read: no lag (that WAL is no change
    # of its tables, and has no position to move to)
    handed = parse_lsn(source.position()["lsn"])
    execute(dsn, "CREATE TABLE unread (a int)", "INSERT INTO unread SELECT generate_series(1, 1000)")

    def caught_up() -> bool:
        assert source.read_batch(100) == []
        assert source._reader is not None
        lag = source.statistics()
        return source._reader.wal_end > handed and lag["replication_lag_bytes"] == lag["replication_lag_seconds"] == 0

    wait_until(caught_up, 20, "the source to report no lag once the server sent WAL past its position")
    position = source.position()
    source.close()
    wait_until(lambda: execute(dsn, "SELECT active FROM pg_replication_slots")[0][0] is False, 10,
               "the slot to be released")
    execute(dsn, "SELECT pg_drop_replication_slot('gone_slot')")
    assert source.check_submission(restore=True) == (
        "PostgresCdcSource: replication slot 'gone_slot' is gone: the restored position cannot be read")
    restored = PostgresCdcSource(dsn, ["orders"], slot="gone_slot")
    restored.open(0, 1)
    restored.restore(position)
    with pytest.raises(SlotGone, match="replication slot 'gone_slot' is gone"):
        read(restored, replica, limit=1, timeout_s=30)
    restored.close()
    assert PostgresCdcSource(dsn, ["orders"], publication="nope").check_submission(restore=False) == (
        "PostgresCdcSource: publication 'nope' does not exist: CREATE PUBLICATION nope FOR TABLE public.orders")
    execute(dsn, "CREATE TABLE plain (a int)", "CREATE TABLE other (a int PRIMARY KEY)")
    assert PostgresCdcSource(dsn, ["plain"]).check_submission(restore=False) == (
        "PostgresCdcSource: table public.plain has no primary key (the snapshot is read in its order)")
    assert PostgresCdcSource(dsn, ["other"]).check_submission(restore=False) == (
        "PostgresCdcSource: publication 'sluice' does not hold public.other: ALTER PUBLICATION sluice ADD TABLE "
        "public.other")


# -- the sink -----------------------------------------------------------------------------------------------------


def test_sink_prepares_at_the_snapshot_commits_on_completion_and_resolves_by_id(pg: PostgresServer) -> None:
    dsn = new_database(pg, "sink_2pc")
    execute(dsn, "CREATE TABLE events (k text, n int)", "CREATE TABLE totals (k text PRIMARY KEY, n int)")

    def rows(table: str) -> list[tuple[Any, ...]]:
        return sorted(execute(dsn, f"SELECT * FROM {table}"))  # noqa: S608 - the test's tables

    def prepared() -> list[str]:
        """The prepared transactions' ids without the token each opened sink draws."""
        return sorted(r[0].rsplit(":", 1)[0] for r in execute(dsn, "SELECT gid FROM pg_prepared_xacts"))

    def untokened(state: dict[str, Any]) -> list[list[Any]]:
        return [[cp, gid.rsplit(":", 1)[0], rows] for cp, gid, rows in state["pending"]]

    def settles(what: Any, expected: Any) -> None:
        """The sink's committer thread works after the call returned: wait for the database to show it."""
        wait_until(lambda: what() == expected, 20, f"{expected}")

    def events_sink(attempt: int) -> PostgresSink:
        sink = PostgresSink(dsn, "events", mode="append")
        sink.bind_job("jobA")
        sink.open(0, 1, attempt)
        return sink

    a0, a1, a2, b9 = ("a", 0), ("a", 1), ("a", 2), ("b", 9)
    sink = events_sink(0)
    for row in (a0, a1, a2):
        sink.write(row)
    sink.snapshot_state(1)
    settles(prepared, ["sluice:jobA:public.events:0:1"])
    assert rows("events") == []  # durable, invisible
    assert sink.statistics() == {"open_prepared_transactions": 1, "rows_written": 3}
    sink.write({"k": "b", "n": 9})
    state2 = sink.snapshot_state(2)
    # checkpoint 1 is still prepared (its completion notice not here yet): checkpoint 2's rows wait, since
    # checkpoint 1's row locks could block them; they are in the state until committed, as 1's are
    assert untokened(state2) == [[1, "sluice:jobA:public.events:0:1", [a0, a1, a2]],
                                 [2, "sluice:jobA:public.events:0:2", [b9]]]
    assert prepared() == ["sluice:jobA:public.events:0:1"]
    assert sink.statistics()["open_prepared_transactions"] == len(state2["pending"]) == 2  # one prepared, one waiting
    sink.close()  # a crash: checkpoint 2 had completed, but no commit ran. The restore commits 1 and writes 2
    restored = events_sink(1)
    restored.restore_state(state2)
    settles(lambda: rows("events"), [a0, a1, a2, b9])
    assert prepared() == []
    settles(lambda: restored.statistics()["open_prepared_transactions"], 0)
    restored.close()
    restored = events_sink(2)  # and a crash right after that restore: the marker rows say both are committed
    restored.restore_state(state2)
    restored.write(("c", 1))
    restored.snapshot_state(3)
    settles(prepared, ["sluice:jobA:public.events:0:3"])
    assert rows("events") == [a0, a1, a2, b9]
    restored.write(("c", 2))
    restored.snapshot_state(4)
    restored.commit(3)  # 3 committed, then 4 prepared
    settles(prepared, ["sluice:jobA:public.events:0:4"])
    assert rows("events") == [a0, a1, a2, b9, ("c", 1)]
    restored.close()  # a crash before checkpoint 4 completed: restored from 3, 4's transaction is rolled back
    again = events_sink(3)
    again.restore_state({"pending": [], "checkpoint": 3})
    settles(prepared, [])
    assert rows("events") == [a0, a1, a2, b9, ("c", 1)]
    again.close()

    # at least once: written at the snapshot, nothing prepared
    loose = PostgresSink(dsn, "events", mode="append", delivery="at-least-once")
    loose.open(0, 1, 0)
    loose.write(("d", 1))
    loose.snapshot_state(5)
    settles(lambda: ("d", 1) in rows("events"), True)
    assert prepared() == []
    loose.close()

    # upsert, two subtasks prepared checkpoint 3, restored at parallelism 1: one subtask commits both
    states = []
    for subtask in (0, 1):
        upsert = PostgresSink(dsn, "totals", key=["k"])
        upsert.bind_job("jobA")
        upsert.open(subtask, 2, 0)
        for n in range(1, 4):
            upsert.write((f"k{subtask}", n))  # one row per key, the last wins
        states.append([upsert.snapshot_state(3)])
        settles(lambda: len(prepared()), subtask + 1)
        upsert.close()
    assert prepared() == ["sluice:jobA:public.totals:0:3", "sluice:jobA:public.totals:1:3"]
    merged = PostgresSink(dsn, "totals", key=["k"])
    merged.bind_job("jobA")
    merged.open(0, 1, 1)
    merged.restore_state(rescale_sinks(states, 1, 0, 3)[0])
    settles(lambda: rows("totals"), [("k0", 3), ("k1", 3)])
    assert prepared() == []
    # deletes by key (an updating SQL query's -D rows), in the checkpoint's transaction with the upserts; a
    # restore of a state holding them deletes them again
    merged.write(("k2", 1))
    merged.delete(("k0", None))
    merged.delete({"k": "k2"})
    merged.write(("k3", 7))
    state5 = merged.snapshot_state(5)
    assert [e[2:] for e in state5["pending"]] == [[[("k3", 7)], [("k2",), ("k0",)]]]  # keys in first-seen order
    merged.commit(5)
    settles(lambda: rows("totals"), [("k1", 3), ("k3", 7)])
    merged.close()
    execute(dsn, "INSERT INTO totals VALUES ('k0', 1)")
    replay = PostgresSink(dsn, "totals", key=["k"], delivery="at-least-once")
    replay.bind_job("jobA")
    replay.open(0, 1, 2)
    replay.restore_state({"pending": [[5, None, [], [["k0"]]]], "checkpoint": 5})  # at least once: written again
    settles(lambda: rows("totals"), [("k1", 3), ("k3", 7)])
    replay.close()
    merged.close()


def test_bad_configuration_is_one_clear_line(pg: PostgresServer) -> None:
    dsn = new_database(pg, "sink_config")
    execute(dsn, "CREATE TABLE totals (k text PRIMARY KEY, n int)", "DROP ROLE IF EXISTS reader",
            "CREATE ROLE reader LOGIN", "GRANT SELECT ON totals TO reader")
    assert PostgresSink(dsn, "totals", key=["k"]).check_submission(restore=False) is None
    closed = f"host=127.0.0.1 port={pg.port + 1 if pg.port < 65535 else 1} user=sluice dbname=x connect_timeout=2"
    problem = PostgresSink(closed, "totals", key=["k"]).check_submission(restore=False)
    assert problem is not None and problem.startswith("cannot connect to PostgreSQL at") and "\n" not in problem
    assert PostgresSink(dsn, "missing", key=["k"]).check_submission(restore=False) == (
        "PostgresSink public.missing: no such table")
    assert PostgresSink(dsn, "totals", key=["n"]).check_submission(restore=False) == (
        "PostgresSink public.totals: key ['n'] is not the table's primary key or a unique index (ON CONFLICT "
        "needs one)")
    reader = dsn.replace("user=sluice", "user=reader")
    assert PostgresSink(reader, "totals", key=["k"]).check_submission(restore=False) == (
        "PostgresSink public.totals: user reader has no INSERT privilege on the table")
    assert PostgresCdcSource(reader, ["totals"]).check_submission(restore=False) == (
        "PostgresCdcSource: the user has no REPLICATION privilege (ALTER ROLE ... WITH REPLICATION)")
    execute(dsn, "ALTER ROLE reader WITH REPLICATION", "REVOKE SELECT ON totals FROM reader")
    assert PostgresCdcSource(reader, ["totals"]).check_submission(restore=False) == (
        "PostgresCdcSource: no SELECT privilege on public.totals")
    assert PostgresCdcSource(closed, ["totals"]).check_submission(restore=False) == problem
    # a new job while an earlier run's prepared transactions of this sink are left
    left = PostgresSink(dsn, "totals", key=["k"])
    left.open(0, 1, 0)
    left.write(("a", 1))
    left.snapshot_state(7)
    wait_until(lambda: execute(dsn, "SELECT count(*) FROM pg_prepared_xacts")[0][0] == 1, 20, "the prepare")
    left.close()
    (gid,) = [r[0] for r in execute(dsn, "SELECT gid FROM pg_prepared_xacts")]
    assert PostgresSink(dsn, "totals", key=["k"]).check_submission(restore=False) == (
        f"PostgresSink public.totals: 1 prepared transactions of this sink are left from an earlier run ({gid}): "
        f"restore that job from its checkpoint, or roll them back (ROLLBACK PREPARED '{gid}')")
    assert PostgresSink(dsn, "totals", key=["k"]).check_submission(restore=True) is None
    execute(dsn, f"ROLLBACK PREPARED '{gid}'", autocommit=True)


# -- a job that survives kill -9 of a worker and a restart of the server ------------------------------------------

CUSTOMERS = 30
INITIAL_ORDERS = 3000

JOB = '''
from runtime.api import Job, KeyedProcessFunction, PostgresCdcSource, PostgresSink

DSN = {dsn!r}
SQL = {sql!r}


class Totals(KeyedProcessFunction):
    """Per customer, from the change records of its orders: the sum of the amounts, the number of orders and
    how many changes made them (the version)."""

    def open(self, ctx):
        self.totals = ctx.value_state("totals", default=(0, 0, 0))

    def process(self, change, ctx):
        total, orders, version = self.totals.value()
        if change["before"] is not None:
            total, orders = total - change["before"]["amount"], orders - 1
        if change["after"] is not None:
            total, orders = total + change["after"]["amount"], orders + 1
        self.totals.update((total, orders, version + 1))
        customer = (change["after"] or change["before"])["customer"]
        ctx.emit({{"customer": customer, "total": total, "orders": orders, "version": version + 1}})


def build(job: Job) -> None:
    totals = (job.source(PostgresCdcSource(DSN, ["orders"], slot="job_slot", chunk_rows=500), parallelism=2)
              .key_by(lambda change: (change["after"] or change["before"])["customer"])
              .process(Totals(), parallelism=2))
    # an upsert sink's input keyed by its key: a customer's rows reach one sink subtask, also after a rescale
    # (two subtasks upserting one key in the same checkpoint would race)
    totals.key_by(lambda row: row["customer"]).sink(PostgresSink(DSN, "totals", key=["customer"]), name="totals")
    totals.sink(PostgresSink(DSN, "history", mode="append", columns=["customer", "version", "total"]),
                name="history")
    job.sql(SQL)  # the same totals through a postgres-cdc table, GROUP BY and a jdbc upsert table


def bad_dsn(job: Job) -> None:
    job.source(PostgresCdcSource(DSN, ["orders"], slot="bad_slot")).sink(PostgresSink(DSN, "nosuchtable",
                                                                                      key=["k"]))
'''

# the SQL way, in the same job (so through the same kill, server restart and rescale): an update is -U and +U,
# which a batch or a checkpoint may split, and a restore must resume between them
SQL = """
CREATE TABLE order_changes (id BIGINT, customer STRING, amount BIGINT)
  WITH ('connector' = 'postgres-cdc', 'hostname' = '127.0.0.1', 'port' = '{port}', 'username' = 'sluice',
        'database-name' = 'cdc_job', 'table-name' = 'orders', 'slot.name' = 'sql_slot',
        'debezium.publication.name' = 'sluice');
CREATE TABLE sql_totals (customer STRING, total BIGINT, orders BIGINT, PRIMARY KEY (customer) NOT ENFORCED)
  WITH ('connector' = 'jdbc', 'url' = 'jdbc:postgresql://127.0.0.1:{port}/cdc_job', 'table-name' = 'sql_totals',
        'username' = 'sluice');
INSERT INTO sql_totals SELECT customer, SUM(amount), COUNT(*) FROM order_changes GROUP BY customer;
"""
SQL_SOURCE = "Source: order_changes"

WORKER_ARGS = ("--heartbeat-interval", "0.25s")


def scrape_workers(cluster: Cluster) -> dict[str, float]:
    metrics: dict[str, float] = {}
    for w in cluster.workers:
        if w.proc.poll() is None:
            metrics.update(scrape(w.fields["metrics"]))
    return metrics


def expected_totals(dsn: str) -> dict[str, tuple[int, int]]:
    return {c: (int(t), int(n)) for c, t, n in execute(
        dsn, "SELECT customer, sum(amount), count(*) FROM orders GROUP BY customer")}


def job_totals(dsn: str, table: str = "totals") -> dict[str, tuple[int, int]]:
    return {row[0]: (int(row[1]), int(row[2])) for row in execute(dsn, f"SELECT * FROM {table}")  # noqa: S608
            if row[2] > 0}


@pytest.mark.slow
def test_cdc_to_totals_survives_kill_9_and_a_server_restart_exactly(pg: PostgresServer, cluster: Cluster) -> None:
    dsn = new_database(pg, "cdc_job")
    make_orders(dsn, INITIAL_ORDERS, customers=CUSTOMERS)
    execute(dsn, "CREATE TABLE totals (customer text PRIMARY KEY, total bigint, orders int, version int)",
            "CREATE TABLE history (customer text, version int, total bigint)",
            "CREATE TABLE sql_totals (customer text PRIMARY KEY, total bigint, orders bigint)")
    write_module(cluster.tmp_path, "pgjobs", JOB.format(dsn=dsn, sql=SQL.format(port=pg.port)))
    cluster.start(3, worker_args=WORKER_ARGS, worker_ids=True)
    refused = "job pgjobs:bad_dsn: PostgresSink public.nosuchtable: no such table"
    with pytest.raises(RpcError, match=refused):
        cluster.submit("pgjobs:bad_dsn")

    writer = OrdersWriter(dsn, first_id=INITIAL_ORDERS + 1, customers=CUSTOMERS)
    job_id = cluster.submit("pgjobs:build", {
        "buffer_bytes": 32 * 1024, "buffers_per_channel": 4,
        "checkpoint": {"interval_s": 0.5, "mode": "unaligned", "timeout_s": 20, "tolerable_failures": 10},
        "restart": {"kind": "fixed", "max_attempts": 3, "delay_s": 0.5, "slot_wait_s": 60}})
    writer.start()
    try:
        found: dict[str, Any] = {}

        def last_checkpoint() -> int:
            return int((found.get("last_checkpoint") or {}).get("checkpoint_id", 0))

        def checkpointed(after: int = 0) -> bool:
            st = cluster.call("status", {"job_id": job_id})
            assert st["state"] in ("CREATED", "DEPLOYING", "RUNNING"), f"{st['state']}\n{logs(cluster)}"
            found.update(st)
            return last_checkpoint() > after and all(t["state"].upper() == "RUNNING" for t in st["tasks"])

        try:
            poll(checkpointed, 60, "a completed checkpoint")
        except AssertionError as exc:
            raise AssertionError(f"{exc}: {found.get('state')}\n{logs(cluster)}") from None
        wait_until(lambda: writer.transactions >= 200, 60, "the writer's first transactions")
        # SIGKILL the worker that runs the change stream's reader, mid-run
        victim_id = next(t["worker"] for t in found["tasks"] if "PostgresCdcSource" in t["name"])
        victim = next(w for w in cluster.workers if w.fields["id"] == victim_id)
        os.kill(victim.pid, signal.SIGKILL)
        victim.proc.wait(10)
        cluster.start_worker(*WORKER_ARGS, worker_id=str(victim_id))
        poll(lambda: cluster.call("status", {"job_id": job_id})["restarts"] == 1, 30, "the restart")
        restored_from = last_checkpoint()
        poll(lambda: checkpointed(restored_from), 90, "a checkpoint after the restart")

        # the server is killed and restarted under the running job: it rides it out
        before_crash = writer.transactions
        pg.kill()
        pg.start()
        wait_until(lambda: writer.transactions >= before_crash + 200, 60, "the writer to go on after the restart")
        crashed_at = last_checkpoint()
        poll(lambda: checkpointed(crashed_at), 90, "a checkpoint after the server restart")

        # the source, the aggregation and both sinks rescaled from 2 to 3 subtasks while changes flow: each
        # source subtask's slot and position moves whole to a new subtask, the sinks' batches are dealt to the
        # new subtasks and resolved there; the SQL table's source goes from 1 to 2 (its one reader moves whole)
        lag = [k for k in scrape_workers(cluster) if k.startswith("sluice_postgres_replication_lag_seconds{")]
        assert sorted(k.split(',task="')[1].split('"')[0] for k in lag) == sorted(
            ["PostgresCdcSource"] * 2 + [SQL_SOURCE]), lag  # one per subtask
        tasks_before = len(found["tasks"])
        before_rescale = writer.transactions
        cluster.call("rescale", {"job_id": job_id, "parallelism": {"PostgresCdcSource": 3, "Totals": 3, "totals": 3,
                                                                   "history": 3, SQL_SOURCE: 2}})
        wait_until(lambda: writer.transactions >= before_rescale + 200, 60, "the writer to go on after the rescale")
        rescaled_at = last_checkpoint()
        poll(lambda: checkpointed(rescaled_at) and len(found["tasks"]) == tasks_before + 5, 90,
             "a checkpoint at parallelism 3")
    finally:
        writer.stop()

    expected = expected_totals(dsn)
    assert len(expected) == CUSTOMERS
    try:
        poll(lambda: job_totals(dsn) == expected, 200, "the totals table to match the orders")
    except AssertionError as exc:
        got = job_totals(dsn)
        wrong = {c: (expected.get(c), got.get(c)) for c in set(expected) | set(got) if expected.get(c) != got.get(c)}
        raise AssertionError(f"{exc}: (expected, got) {wrong}\n{logs(cluster)}") from None
    poll(lambda: job_totals(dsn, "sql_totals") == expected, 60, "the SQL job's totals table to match the orders")
    # caught up: the sources report no replication lag, though the sinks' tables keep writing WAL
    poll(lambda: {v for k, v in scrape_workers(cluster).items()
                  if k.startswith("sluice_postgres_replication_lag_")} == {0.0}, 30, "no replication lag")
    totals = {c: (int(t), int(v)) for c, t, _, v in execute(dsn, "SELECT * FROM totals")}
    history: dict[str, list[tuple[int, int]]] = defaultdict(list)

    def history_complete() -> bool:
        history.clear()
        for customer, version, total in execute(dsn, "SELECT * FROM history"):
            history[customer].append((int(version), int(total)))
        return sum(len(h) for h in history.values()) >= sum(v for _, v in totals.values())

    poll(history_complete, 60, "the history to hold every version")
    for customer, (total, version) in totals.items():
        versions = sorted(history[customer])
        assert [v for v, _ in versions] == list(range(1, version + 1)), f"{customer}: versions not 1..{version} once"
        assert versions[-1][1] == total
    st = cluster.call("status", {"job_id": job_id})
    assert st["state"] == "RUNNING" and st["restarts"] == 1, f"{st}\n{logs(cluster)}"
    metrics = scrape_workers(cluster)
    prepared = {k: v for k, v in metrics.items() if k.startswith("sluice_postgres_open_prepared_transactions{")}
    # 2 sinks x 3 subtasks, and the SQL job's sink
    assert len(prepared) == 7 and all(0 <= v <= 3 for v in prepared.values()), prepared
    assert sum(v for k, v in metrics.items() if k.startswith("sluice_postgres_rows_written_total{")) > 0
    cluster.call("cancel", {"job_id": job_id})
    cluster.wait_job(job_id, 60)
    assert execute(dsn, "SELECT count(*) FROM pg_prepared_xacts")[0][0] <= 3  # at most the last checkpoint's



# -- Sluice SQL over PostgreSQL: a lookup join, an upsert through jdbc, and a postgres-cdc table ----------------

SQL_ROWS, SQL_RATE, SQL_CUSTOMERS = 9_000, 3_000, 25  # customers 20..24 are not in the dimension table

SQL_SCRIPT = """
SET 'parallelism.default' = '2';
CREATE TABLE orders (id BIGINT, customer BIGINT, amount BIGINT, proc_time AS PROCTIME())
  WITH ('connector' = 'datagen', 'number-of-rows' = '{rows}', 'rows-per-second' = '{rate}',
        'fields.id.kind' = 'sequence', 'fields.customer.min' = '0', 'fields.customer.max' = '{top}',
        'fields.amount.min' = '1', 'fields.amount.max' = '100');
CREATE TABLE customers (id BIGINT, region STRING, PRIMARY KEY (id) NOT ENFORCED)
  WITH ('connector' = 'jdbc', 'url' = '{url}', 'table-name' = 'customers', 'username' = 'sluice',
        'lookup.cache' = 'PARTIAL', 'lookup.partial-cache.max-rows' = '100',
        'lookup.partial-cache.expire-after-write' = '1 min', 'lookup.max-retries' = '3');
CREATE TABLE region_totals (region STRING, orders BIGINT, total BIGINT, PRIMARY KEY (region) NOT ENFORCED)
  WITH ('connector' = 'jdbc', 'url' = '{url}', 'table-name' = 'region_totals', 'username' = 'sluice');
CREATE TABLE big_orders (id BIGINT, region STRING, amount BIGINT)
  WITH ('connector' = 'jdbc', 'url' = '{url}', 'table-name' = 'big_orders', 'username' = 'sluice');
EXECUTE STATEMENT SET BEGIN
INSERT INTO region_totals
SELECT COALESCE(c.region, 'unknown'), COUNT(*), SUM(o.amount)
FROM orders AS o LEFT JOIN customers FOR SYSTEM_TIME AS OF o.proc_time AS c ON o.customer = c.id
GROUP BY COALESCE(c.region, 'unknown');
INSERT INTO big_orders
SELECT o.id, c.region, o.amount
FROM orders AS o JOIN customers FOR SYSTEM_TIME AS OF o.proc_time AS c ON o.customer = c.id
WHERE o.amount > 95;
END;
"""


def test_sql_lookup_join_into_a_jdbc_upsert_table_survives_kill_9_and_cdc_tables_read_changes(
        pg: PostgresServer, cluster: Cluster) -> None:
    from runtime.api import Job
    from runtime.sql.connectors import TableSource
    from runtime.sql.entry import entry_for
    from runtime.sql.postgres_tables import CdcTableSource
    from tests.support.event_time_kill import run_killed

    dsn = new_database(pg, "sql_lookup")
    regions = {c: ("north", "south", "east", "west")[c % 4] for c in range(20)}
    execute(dsn, "CREATE TABLE customers (id bigint PRIMARY KEY, region text)",
            "CREATE TABLE region_totals (region text PRIMARY KEY, orders bigint, total bigint)",
            "CREATE TABLE big_orders (id bigint, region text, amount bigint)",
            "INSERT INTO customers VALUES " + ", ".join(f"({c}, '{r}')" for c, r in regions.items()))
    url = f"jdbc:postgresql://127.0.0.1:{pg.port}/sql_lookup"
    script = SQL_SCRIPT.format(rows=SQL_ROWS, rate=SQL_RATE, top=SQL_CUSTOMERS - 1, url=url)
    # the model: every row datagen makes (deterministic), joined with the dimension table as the test wrote it
    scratch = Job("model")
    scratch.sql(script)
    source = next(n.payload for n in scratch.nodes if n.kind == "source")
    assert isinstance(source, TableSource)
    totals: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    big: list[tuple[int, str, int]] = []
    for subtask in range(2):
        source.inner.open(subtask, 2)
        source.inner.rate = None
        while (batch := source.inner.read_batch(4096)) is not None:
            for order_id, customer, amount in batch:
                region = regions.get(customer)
                totals[region or "unknown"][0] += 1
                totals[region or "unknown"][1] += amount
                if region is not None and amount > 95:
                    big.append((order_id, region, amount))
    assert len(totals) == 5 and sum(n for n, _ in totals.values()) == SQL_ROWS

    def checkpointed_and_joining(job_id: str, status: dict[str, Any]) -> bool:
        history = cluster.call("checkpoints", {"job_id": job_id})["history"]
        joins = [t for t in status["tasks"] if "LookupJoin" in t["name"]]
        return any(h["status"] == "COMPLETED" for h in history) and any(t["records_in"] > 0 for t in joins)

    run_killed(cluster, entry_for(script), 8 * 1024, checkpointed_and_joining, "LookupJoin",
               what="a completed checkpoint with the lookup join under way", timeout_s=120)
    expected = {r: (n, s) for r, (n, s) in totals.items()}
    got = {r: (int(n), int(s)) for r, n, s in execute(dsn, "SELECT * FROM region_totals")}
    assert got == expected
    assert sorted((int(i), r, int(a)) for i, r, a in execute(dsn, "SELECT * FROM big_orders")) == sorted(big)
    assert execute(dsn, "SELECT count(*) FROM pg_prepared_xacts")[0][0] == 0
    # a lookup table that is not there is one line at submit, nothing started
    missing = script.replace("'table-name' = 'customers'", "'table-name' = 'no_customers'")
    with pytest.raises(RpcError, match=r": lookup table no_customers: no such table$"):
        cluster.submit(entry_for(missing))

    # a postgres-cdc table: the snapshot as +I, then an update (-U, +U: REPLICA IDENTITY FULL) and a delete (-D)
    execute(dsn, "ALTER TABLE customers REPLICA IDENTITY FULL",
            "CREATE PUBLICATION dbz_publication FOR TABLE customers")
    cdc = Job("cdc")
    cdc.sql(f"""
CREATE TABLE customer_changes (id BIGINT, region STRING, loud AS UPPER(region))
  WITH ('connector' = 'postgres-cdc', 'hostname' = '127.0.0.1', 'port' = '{pg.port}', 'username' = 'sluice',
        'database-name' = 'sql_lookup', 'schema-name' = 'public', 'table-name' = 'customers',
        'slot.name' = 'sql_cdc');
CREATE TABLE per_region (region STRING, n BIGINT) WITH ('connector' = 'print');
INSERT INTO per_region SELECT loud, COUNT(*) FROM customer_changes GROUP BY loud;
""")
    table_source = next(n.payload for n in cdc.nodes if n.kind == "source")
    assert isinstance(table_source, CdcTableSource)
    table_source.open(0, 1)
    try:
        changes: list[tuple[str, Any]] = []

        def read_changes(count: int) -> Any:
            def more() -> bool:
                changes.extend(table_source.read_batch(100) or [])
                return len(changes) >= count
            return more

        wait_until(read_changes(20), 30, "the snapshot's 20 rows")
        assert sorted(changes) == sorted(("+I", (c, r, r.upper())) for c, r in regions.items())
        execute(dsn, "UPDATE customers SET region = 'central' WHERE id = 3", "DELETE FROM customers WHERE id = 4")
        # a batch of one record ends inside the update: the position says so, and a restore resumes there
        wait_until(lambda: bool(changes.extend(table_source.read_batch(1) or []) or len(changes) == 21), 30,
                   "the update's first record")
        inside_update = table_source.position()
        assert changes[20:] == [("-U", (3, "west", "WEST"))] and inside_update["rows"] == 1, inside_update
        table_source.close()
        table_source.open(0, 1)
        table_source.restore(inside_update)
        wait_until(read_changes(23), 30, "the rest of the update and a delete")
        assert changes[20:] == [("-U", (3, "west", "WEST")), ("+U", (3, "central", "CENTRAL")),
                                ("-D", (4, "north", "NORTH"))]
    finally:
        table_source.close()
        execute(dsn, "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                     "WHERE slot_name LIKE 'sql_cdc%'", autocommit=True)

    # the same table read as a bounded jdbc scan, in 3 id ranges over 2 subtasks; a restore mid-split resumes
    # after what was emitted
    scan = Job("scan")
    scan.sql(f"""
CREATE TABLE customer_rows (id BIGINT, region STRING) WITH ('connector' = 'jdbc', 'url' = '{url}',
  'table-name' = 'customers', 'username' = 'sluice', 'scan.partition.column' = 'id', 'scan.partition.num' = '3',
  'scan.partition.lower-bound' = '0', 'scan.partition.upper-bound' = '19', 'scan.fetch-size' = '4');
CREATE TABLE scanned (id BIGINT, region STRING) WITH ('connector' = 'print');
INSERT INTO scanned SELECT id, region FROM customer_rows;
""")
    scan_source = next(n.payload for n in scan.nodes if n.kind == "source")
    scan_source.check_at_submit(None)
    now = {**regions, 3: "central"}
    del now[4]
    read_rows: list[tuple[int, str]] = []
    for subtask in range(2):
        scan_source.open(subtask, 2)
        first = scan_source.read_batch(3) or []  # ids 0-2 of split 0 (0-6) for subtask 0, 7-9 of split 1
        position = scan_source.position()
        scan_source.close()
        scan_source.open(subtask, 2)
        scan_source.restore(position)
        read_rows += first
        while (batch := scan_source.read_batch(5)) is not None:
            read_rows += batch
        scan_source.close()
        assert position == [0, 3] and [r[0] for r in first] == [[0, 1, 2], [7, 8, 9]][subtask]
    assert sorted(read_rows) == sorted(now.items())

    # the lookup join's FULL cache: the whole table loaded once, answers from memory until the interval passed
    full = Job("full")
    assert "'lookup.partial-cache.expire-after-write' = '1 min'" in script
    full.sql(script.replace("'lookup.cache' = 'PARTIAL', 'lookup.partial-cache.max-rows' = '100',\n        "
                            "'lookup.partial-cache.expire-after-write' = '1 min'",
                            "'lookup.cache' = 'FULL', 'lookup.full-cache.periodic-reload.interval' = '1 min'"))
    lookup = next(n.payload for n in full.nodes if n.kind == "async_map").fn
    assert lookup.settings.full_reload_ms == 60_000
    clock = [100.0]
    lookup._clock = lambda: clock[0]

    async def looked_up() -> list[Any]:
        answers = [await lookup((1, 3, 10, 0))]
        execute(dsn, "UPDATE customers SET region = 'south' WHERE id = 3")
        answers.append(await lookup((2, 3, 10, 0)))  # the cache, loaded at 100 s: still central
        clock[0] = 160.5
        answers += [await lookup((3, 3, 10, 0)), await lookup((4, 4, 1, 0))]  # reloaded; 4 was deleted
        return answers

    try:
        answers = asyncio.run(looked_up())
    finally:
        lookup.close()
    assert answers == [[(1, 3, 10, 0, 3, "central")], [(2, 3, 10, 0, 3, "central")],
                       [(3, 3, 10, 0, 3, "south")], [(4, 4, 1, 0, None, None)]]
    assert lookup.lookups == 2  # two loads of the table, no query per key
