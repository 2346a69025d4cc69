#!/usr/bin/env python
"""Table sink benchmark: what one checkpoint costs DeltaSink and IcebergSink, beside the libraries' own loops.

In-process, no cluster: the sinks are driven the way a task drives them (write every record, then at each
"checkpoint" `snapshot_state` on every subtask and `commit` on every subtask), into a fresh table in a
temporary directory (or the test S3 server with --s3). Each round writes --rows rows per checkpoint, split
over --subtasks subtasks, for --checkpoints checkpoints.

- write: the records handed to `write` (buffering; rows become Arrow at the barrier);
- barrier: `snapshot_state` of every subtask: the Parquet files written and the staging manifests;
- commit: `commit` of every subtask until subtask 0's commit thread made the one table commit (reading the
  table's versions first); a task's event loop does not wait for it;
- rows/s: rows over write + barrier + commit of all checkpoints.

Beside it, the library's own append loop over the same rows as Arrow tables (the limit: no buffering, no
manifests, no exactly-once bookkeeping): deltalake's `write_deltalake(mode="append")` once per checkpoint, and
pyiceberg's `table.append` once per checkpoint. Medians over the checkpoints, and the slowest.

    .venv/bin/python scripts/bench_lake.py [--rows 50000] [--checkpoints 20] [--subtasks 2] [--s3]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from runtime.connectors.table_sink import TableSink  # noqa: E402


def records(checkpoint: int, rows: int) -> list[dict[str, Any]]:
    base = checkpoint * rows
    return [{"key": f"k{(base + i) % 1000:04d}", "n": base + i, "value": (base + i) * 0.5} for i in range(rows)]


def run_sink(make: Callable[[int], TableSink], *, subtasks: int, rows: int, checkpoints: int) -> dict[str, Any]:
    sinks = []
    for i in range(subtasks):
        sink = make(i)
        sink.bind("bench", "sink")
        sink.open(i, subtasks, 0)
        sinks.append(sink)
    write_s, barrier_s, commit_s = [], [], []
    for c in range(1, checkpoints + 1):
        batch = records(c, rows)
        t0 = time.perf_counter()
        for i, record in enumerate(batch):
            sinks[i % subtasks].write(record)
        t1 = time.perf_counter()
        for sink in sinks:
            sink.snapshot_state(c)
        t2 = time.perf_counter()
        for sink in sinks:
            sink.commit(c)
        for sink in sinks:
            sink.drain()  # the commit runs on subtask 0's commit thread: measured until it landed
        t3 = time.perf_counter()
        write_s.append(t1 - t0)
        barrier_s.append(t2 - t1)
        commit_s.append(t3 - t2)
    total = sum(write_s) + sum(barrier_s) + sum(commit_s)
    return {"write_ms": ms(write_s), "barrier_ms": ms(barrier_s), "commit_ms": ms(commit_s),
            "commits": sinks[0].statistics().commits, "rows_per_s": rows * checkpoints / total}


def run_loop(append: Callable[[Any], None], *, rows: int, checkpoints: int) -> dict[str, Any]:
    import pyarrow as pa

    times = []
    for c in range(1, checkpoints + 1):
        batch = records(c, rows)
        t0 = time.perf_counter()
        append(pa.Table.from_pylist(batch))  # the conversion counts: the sink's barrier does it too
        times.append(time.perf_counter() - t0)
    return {"append_ms": ms(times), "rows_per_s": rows * checkpoints / sum(times)}


def ms(values: list[float]) -> str:
    return f"median {statistics.median(values) * 1000:.1f} ms, slowest {max(values) * 1000:.1f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=50_000, help="rows per checkpoint (default 50000)")
    parser.add_argument("--checkpoints", type=int, default=20)
    parser.add_argument("--subtasks", type=int, default=2)
    parser.add_argument("--s3", action="store_true", help="the Delta table in the test S3 server (moto)")
    parser.add_argument("--parts", default="delta,iceberg")
    args = parser.parse_args()
    print(f"# {platform.node()} {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"Python {platform.python_version()}; load {os.getloadavg()[0]:.1f}")
    print(f"# {args.rows} rows per checkpoint, {args.checkpoints} checkpoints, {args.subtasks} subtasks")
    parts = args.parts.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        if "delta" in parts:
            bench_delta(args, tmp)
        if "iceberg" in parts:
            bench_iceberg(args, tmp)


def bench_delta(args: argparse.Namespace, tmp: str) -> None:
    from deltalake import write_deltalake

    from runtime.connectors.delta import DeltaSink, storage_options

    server = None
    if args.s3:
        from runtime.common import objectstore
        from tests.support.s3_server import S3Server

        server = S3Server.start()
        os.environ.update(server.env)
        objectstore.forget_clients()
        server.create_bucket("bench")
        root = "s3://bench"
    else:
        root = tmp
    try:
        sink = run_sink(lambda i: DeltaSink(f"{root}/sink"), subtasks=args.subtasks, rows=args.rows,
                        checkpoints=args.checkpoints)
        uri = f"{root}/loop"
        loop = run_loop(lambda t: write_deltalake(uri, t, mode="append", storage_options=storage_options(uri)),
                        rows=args.rows, checkpoints=args.checkpoints)
    finally:
        if server is not None:
            server.stop()
    where = "S3 (moto)" if args.s3 else "local directory"
    print(f"DeltaSink, {where}: write {sink['write_ms']}; barrier {sink['barrier_ms']}; commit {sink['commit_ms']}; "
          f"{sink['commits']} commits; {sink['rows_per_s']:,.0f} rows/s")
    print(f"write_deltalake loop, {where}: append {loop['append_ms']}; {loop['rows_per_s']:,.0f} rows/s; "
          f"sink/loop {sink['rows_per_s'] / loop['rows_per_s']:.2f}")


def bench_iceberg(args: argparse.Namespace, tmp: str) -> None:
    import pyarrow as pa

    from runtime.connectors.iceberg import IcebergSink, load_catalog

    catalog = {"name": "bench", "type": "sql", "uri": f"sqlite:///{tmp}/catalog.db", "warehouse": f"file://{tmp}/wh"}
    cat = load_catalog(catalog)
    cat.create_namespace("db")
    schema = pa.schema([("key", pa.string()), ("n", pa.int64()), ("value", pa.float64())])
    cat.create_table("db.sink", schema=schema)
    loop_table = cat.create_table("db.loop", schema=schema)
    sink = run_sink(lambda i: IcebergSink(catalog, "db.sink"), subtasks=args.subtasks, rows=args.rows,
                    checkpoints=args.checkpoints)
    loop = run_loop(lambda t: loop_table.append(t.cast(schema)), rows=args.rows, checkpoints=args.checkpoints)
    print(f"IcebergSink, SQLite catalog: write {sink['write_ms']}; barrier {sink['barrier_ms']}; "
          f"commit {sink['commit_ms']}; {sink['commits']} snapshots; {sink['rows_per_s']:,.0f} rows/s")
    print(f"table.append loop: append {loop['append_ms']}; {loop['rows_per_s']:,.0f} rows/s; "
          f"sink/loop {sink['rows_per_s'] / loop['rows_per_s']:.2f}")


if __name__ == "__main__":
    main()
