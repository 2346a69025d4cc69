#!/usr/bin/env python
"""The interval and window join benchmarks on Apache Flink 2.3 SQL (PyFlink's TableEnvironment: the planner's Java
interval or window join, no Python in the job), for side-by-side figures with scripts/bench_interval_join.py and
scripts/bench_window_join.py.

Run with the Python of a venv that has `apache-flink` installed (never Sluice's); the benchmarks start it as a
subprocess. Two filesystem tables over the JSON-lines files that Sluice reads (`{"k", "seq", "ts"}`,
`ts` event time in epoch milliseconds, the rowtime `TO_TIMESTAMP_LTZ(ts, 3)` with a watermark at the rowtime:
no delay), the interval join

    SELECT l.k, l.seq, r.seq FROM l, r
    WHERE l.k = r.k AND r.rt BETWEEN l.rt + INTERVAL lower AND l.rt + INTERVAL upper

or with `--window-ms W` the window join of two tumbling window TVFs (Flink's WindowJoin operator)

    SELECT L.k, L.seq, R.seq FROM TABLE(TUMBLE(TABLE l, DESCRIPTOR(rt), INTERVAL W)) L
    JOIN TABLE(TUMBLE(TABLE r, DESCRIPTOR(rt), INTERVAL W)) R
    ON L.k = R.k AND L.window_start = R.window_start AND L.window_end = R.window_end

into a blackhole sink, every operator at `--parallelism`.

Prints one JSON line: the job's net run time (JobExecutionResult.getNetRuntime: from its submission to its end
inside the mini cluster, so scheduling and deploying the tasks are in it; the JVM's and mini cluster's start and
the planning of the query are not), the wall time from `execute_sql` to the end, and records (both sides) per
second of net run time. `--count` instead counts the joined rows (COUNT(*) over the join in mini-batches, collected),
to check that they equal the expected pairs.
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def interval(ms: int) -> str:
    """A Flink SQL interval literal of `ms` milliseconds (SECOND with a fraction: Flink has no MILLISECOND)."""
    sign = "-" if ms < 0 else "+"
    return f"{sign} INTERVAL '{abs(ms) / 1000:.3f}' SECOND"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--left", required=True, help="the left side's directory of JSON-lines files")
    parser.add_argument("--right", required=True, help="the right side's directory")
    parser.add_argument("--lower", type=int, default=0, help="ms (right time - left time >= lower)")
    parser.add_argument("--upper", type=int, default=0, help="ms (right time - left time <= upper)")
    parser.add_argument("--window-ms", type=int, default=0, help="> 0: the window join of tumbling windows this long")
    parser.add_argument("--records", type=int, required=True, help="records per side in the files (for the rate)")
    parser.add_argument("--parallelism", type=int, default=2)
    parser.add_argument("--count", action="store_true", help="count the joined rows instead of timing the join")
    args = parser.parse_args(argv)

    from pyflink.table import EnvironmentSettings, TableEnvironment  # only in the Flink venv

    env = TableEnvironment.create(EnvironmentSettings.in_streaming_mode())
    conf = env.get_config()
    conf.set("parallelism.default", str(args.parallelism))
    conf.set("pipeline.object-reuse", "true")
    for name, path in (("l", args.left), ("r", args.right)):
        env.execute_sql(f"""
            CREATE TABLE {name} (
                k STRING,
                seq BIGINT,
                ts BIGINT,
                rt AS TO_TIMESTAMP_LTZ(ts, 3),
                WATERMARK FOR rt AS rt
            ) WITH ('connector' = 'filesystem', 'path' = 'file://{path}', 'format' = 'json')""")
    if args.window_ms:
        size = interval(args.window_ms).lstrip("+ ")
        join = (f"SELECT L.k, L.seq AS lseq, R.seq AS rseq FROM TABLE(TUMBLE(TABLE l, DESCRIPTOR(rt), {size})) L "
                f"JOIN TABLE(TUMBLE(TABLE r, DESCRIPTOR(rt), {size})) R "
                "ON L.k = R.k AND L.window_start = R.window_start AND L.window_end = R.window_end")
    else:
        join = (f"SELECT l.k, l.seq AS lseq, r.seq AS rseq FROM l, r WHERE l.k = r.k "
                f"AND r.rt BETWEEN l.rt {interval(args.lower)} AND l.rt {interval(args.upper)}")
    if args.count:
        # mini-batches: the count's changelog has a row per batch, not per pair, for the client to read
        conf.set("table.exec.mini-batch.enabled", "true")
        conf.set("table.exec.mini-batch.allow-latency", "1 s")
        conf.set("table.exec.mini-batch.size", "100000")
        rows = 0
        with env.execute_sql(f"SELECT COUNT(*) FROM ({join})").collect() as results:
            for row in results:  # an updating count: the last value is the total
                rows = row[0]
        print(json.dumps({"engine": "flink-sql", "mode": "count", "pairs": rows}))
        return 0
    env.execute_sql("CREATE TABLE out_rows (k STRING, lseq BIGINT, rseq BIGINT) WITH ('connector' = 'blackhole')")
    t0 = time.monotonic()
    result = env.execute_sql(f"INSERT INTO out_rows {join}")
    client = result.get_job_client()
    assert client is not None
    net_s = client.get_job_execution_result().result().get_net_runtime() / 1000.0
    wall_s = time.monotonic() - t0
    print(json.dumps({"engine": "flink-sql", "mode": "throughput", "records": 2 * args.records,
                      "net_runtime_s": net_s, "submit_to_end_s": wall_s,
                      "records_per_s": 2 * args.records / net_s}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
