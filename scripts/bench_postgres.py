#!/usr/bin/env python
"""PostgreSQL connector benchmark: CDC changes/s and sink rows/s per mode, each beside psycopg2's own loop.

Starts a PostgreSQL 15 server of its own (tests/support/postgres_server.py: initdb in a temporary directory,
fsync off) and measures, on the connectors alone (no cluster, so the figures are the connectors' and the
server's, not the runtime's):

- CDC: --changes inserts (in transactions of --txn-rows) are made after the slot was created, then timed
  while read: `PostgresCdcSource.read_batch` until all change records arrived (pgoutput decoded into
  Debezium-shaped dicts), beside psycopg2's replication cursor reading the same stream raw
  (`read_message`, counting Insert messages, nothing decoded): the limit of the protocol and the driver.
- Sink: --rows rows written in checkpoints of --checkpoint-rows (write each row, `snapshot_state`, `commit`,
  until its committer thread has committed the last batch), for upsert and append, exactly-once and
  at-least-once, beside psycopg2's `execute_values` of the same rows with the same statement, one plain
  transaction per checkpoint: the limit.

Medians of --repeats runs; the ratios are the connector over psycopg2, measured in the same run.

    .venv/bin/python scripts/bench_postgres.py
"""

from __future__ import annotations

import argparse
import os
import platform
import select
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import psycopg2  # noqa: E402
import psycopg2.extras  # noqa: E402

from runtime.connectors.postgres_cdc import PostgresCdcSource  # noqa: E402
from runtime.connectors.postgres_sink import PostgresSink  # noqa: E402
from tests.support.postgres_server import PostgresServer  # noqa: E402


def run_sql(dsn: str, *statements: str) -> None:
    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    with conn.cursor() as cur:
        for sql in statements:
            cur.execute(sql)
    conn.close()


def make_changes(dsn: str, changes: int, txn_rows: int, first: int) -> None:
    conn = psycopg2.connect(dsn)
    with conn.cursor() as cur:
        for start in range(first, first + changes, txn_rows):
            cur.execute("INSERT INTO events SELECT g, 'customer-' || (g %% 100), g %% 1000 "
                        "FROM generate_series(%s, %s) g", (start, min(start + txn_rows, first + changes) - 1))
            conn.commit()
    conn.close()


def cdc_connector(dsn: str, changes: int, txn_rows: int, first: int) -> float:
    source = PostgresCdcSource(dsn, ["events"], slot="bench_cdc", publication="bench", snapshot=False,
                               max_buffered=50_000)
    source.open(0, 1)
    deadline = time.monotonic() + 60
    while source.position() is None:  # the reader creates the slot: changes after it are streamed
        assert time.monotonic() < deadline, "the source did not start"
        source.read_batch(100)
        time.sleep(0.01)
    make_changes(dsn, changes, txn_rows, first)
    got = 0
    t0 = time.perf_counter()
    while got < changes:
        batch = source.read_batch(1000)
        assert batch is not None
        got += len(batch)
        if not batch:
            time.sleep(source.idle_wait_s())
        assert time.monotonic() < deadline + 600, f"read {got} of {changes}"
    elapsed = time.perf_counter() - t0
    source.close()
    run_sql(dsn, "SELECT pg_drop_replication_slot('bench_cdc')")
    return changes / elapsed


def cdc_psycopg2(dsn: str, changes: int, txn_rows: int, first: int) -> float:
    conn = psycopg2.connect(dsn, connection_factory=psycopg2.extras.LogicalReplicationConnection)
    cur = conn.cursor()
    cur.create_replication_slot("bench_raw", output_plugin="pgoutput")
    make_changes(dsn, changes, txn_rows, first)
    cur.start_replication(slot_name="bench_raw", decode=False,
                          options={"proto_version": "1", "publication_names": "bench"})
    got = 0
    t0 = time.perf_counter()
    while got < changes:
        message = cur.read_message()
        if message is None:
            select.select([conn], [], [], 0.1)
            continue
        if message.payload[:1] == b"I":
            got += 1
    elapsed = time.perf_counter() - t0
    conn.close()
    run_sql(dsn, "SELECT pg_drop_replication_slot('bench_raw')")
    return changes / elapsed


def sink_connector(dsn: str, mode: str, delivery: str, rows: list[tuple[Any, ...]], per_checkpoint: int) -> float:
    sink = PostgresSink(dsn, "sink_bench", key=["k"] if mode == "upsert" else (), mode=mode, delivery=delivery)
    sink.bind_job(f"bench-{time.monotonic_ns()}")
    sink.open(0, 1, 0)
    t0 = time.perf_counter()
    for checkpoint, start in enumerate(range(0, len(rows), per_checkpoint), 1):
        for row in rows[start:start + per_checkpoint]:
            sink.write(row)
        sink.snapshot_state(checkpoint)
        sink.commit(checkpoint)
    deadline = time.monotonic() + 600
    while sink.statistics()["open_prepared_transactions"] > 0:  # its committer thread writes after the calls
        assert time.monotonic() < deadline, "the sink did not commit"
        time.sleep(0.001)
    elapsed = time.perf_counter() - t0
    sink.close()
    return len(rows) / elapsed


def sink_psycopg2(dsn: str, mode: str, rows: list[tuple[Any, ...]], per_checkpoint: int) -> float:
    statement = "INSERT INTO sink_bench (k, v) VALUES %s"
    if mode == "upsert":
        statement += " ON CONFLICT (k) DO UPDATE SET v = EXCLUDED.v"
    conn = psycopg2.connect(dsn)
    t0 = time.perf_counter()
    with conn.cursor() as cur:
        for start in range(0, len(rows), per_checkpoint):
            psycopg2.extras.execute_values(cur, statement, rows[start:start + per_checkpoint], page_size=1000)
            conn.commit()
    elapsed = time.perf_counter() - t0
    conn.close()
    return len(rows) / elapsed


def median_of(repeats: int, reset: Callable[[], None], measure: Callable[[], float]) -> tuple[float, float]:
    """(median, slowest) of `repeats` runs, `reset` before each."""
    rates = []
    for _ in range(repeats):
        reset()
        rates.append(measure())
    return statistics.median(rates), min(rates)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--changes", type=int, default=50_000)
    parser.add_argument("--txn-rows", type=int, default=100)
    parser.add_argument("--rows", type=int, default=50_000)
    parser.add_argument("--checkpoint-rows", type=int, default=5_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    server = PostgresServer()
    try:
        dsn = server.dsn
        run_sql(dsn, "CREATE TABLE events (id int PRIMARY KEY, customer text, amount int)",
                "CREATE PUBLICATION bench FOR TABLE events", "CREATE TABLE sink_bench (k int PRIMARY KEY, v text)")
        counter = iter(range(10**9))

        def reset_events() -> None:
            run_sql(dsn, "TRUNCATE events")

        results: list[tuple[str, tuple[float, float], tuple[float, float]]] = []
        cdc = median_of(args.repeats, reset_events,
                        lambda: cdc_connector(dsn, args.changes, args.txn_rows, next(counter) * args.changes))
        raw = median_of(args.repeats, reset_events,
                        lambda: cdc_psycopg2(dsn, args.changes, args.txn_rows, next(counter) * args.changes))
        results.append((f"CDC changes/s ({args.txn_rows} rows a transaction)", cdc, raw))

        # upsert rows: keys repeat across checkpoints (every key written twice over the run)
        keys = args.rows // 2
        rows = [(i % keys, f"value-{i}") for i in range(args.rows)]
        append_rows = [(i, f"value-{i}") for i in range(args.rows)]

        def reset_sink() -> None:
            run_sql(dsn, "TRUNCATE sink_bench")

        for mode in ("upsert", "append"):
            data = rows if mode == "upsert" else append_rows
            limit = median_of(args.repeats, reset_sink,
                              lambda mode=mode, data=data: sink_psycopg2(dsn, mode, data, args.checkpoint_rows))
            for delivery in ("exactly-once", "at-least-once"):
                figure = median_of(args.repeats, reset_sink,
                                   lambda mode=mode, data=data, delivery=delivery: sink_connector(
                                       dsn, mode, delivery, data, args.checkpoint_rows))
                results.append((f"sink rows/s, {mode}, {delivery} ({args.checkpoint_rows} rows a checkpoint)",
                                figure, limit))
    finally:
        server.remove()
    print(f"machine: {platform.platform()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
          f"psycopg2 {psycopg2.__version__.split()[0]}")
    print(f"medians (slowest) of {args.repeats} runs")
    print("| what | connector | psycopg2 loop | ratio |")
    print("|---|---|---|---|")
    for what, (median, slowest), (limit, limit_slowest) in results:
        print(f"| {what} | {median:,.0f} ({slowest:,.0f}) | {limit:,.0f} ({limit_slowest:,.0f}) | "
              f"{median / limit:.2f} |")


if __name__ == "__main__":
    main()
