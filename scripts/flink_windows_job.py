#!/usr/bin/env python
"""The window benchmark's window jobs on Apache Flink (PyFlink 2.x), for a side-by-side figure.

Run with the Python of a venv that has `apache-flink` installed (never Sluice's): scripts/bench_windows.py
starts it as a subprocess with `--flink-python`. The same shape as Sluice's jobs (runtime/examples/windowcount.py):
a generator of `--records` rows (parallelism 2) with `seq` 0..N-1, a key of 1000 (`k000`..`k999`) and the event
time `1_700_000_000_000 + seq` ms, watermarks with no delay; an event-time count per key and window (parallelism
2) into a discarding sink, the window by `--window`:
- tumbling: TUMBLE 10 s;
- sliding: HOP, slide 10 s, size 60 s (every record in six windows);
- session: SESSION with a gap of `--session-gap-ms` (1 s, Sluice's SESSION_GAP_MS), partitioned by key.
The key by `--keys`: `bursts` (the default) computes it from seq by the rule of Sluice's generator with keys in
bursts (runtime/connectors/generator.py, burst_key_index), so both engines count the very same records and must
emit the same rows; `uniform` draws it at random (Flink's own random numbers: the same distribution as Sluice's
uniform keys, not the same records). Flink SQL runs it inside the JVM (Window TVFs; a Python UDF would cost more
than the window); by default the aggregation is one phase (records are shuffled by key, then counted, as Sluice's
job does), `--two-phase` lets the planner pre-aggregate before the shuffle (its default).

Prints one JSON line: records, the job's net run time (JobExecutionResult.getNetRuntime: from the job's start
to its end, inside the already running mini cluster) and records per second over it. `--count-rows` runs the job
into CSV files in a temporary directory instead of the discarding sink and adds the rows it wrote (`rows_out`):
for checking the row count, not for timing.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import sys
import tempfile
import time

BURST_GROUPS = 10  # runtime/connectors/generator.py: BURST_GROUPS, BURST_RECORDS (this file runs without Sluice)
BURST_RECORDS = 1000
KEYS = 1000


def key_expression(keys: str) -> str:
    """The key column's SQL: from seq by burst_key_index (bursts), or from the random column r (uniform)."""
    if keys == "uniform":
        index = "r"
    else:  # seq // BURST_RECORDS % BURST_GROUPS * per_group + seq % per_group, in exact integer arithmetic
        per_group = KEYS // BURST_GROUPS
        cycle = BURST_RECORDS * BURST_GROUPS
        index = (f"CAST((MOD(seq, {cycle}) - MOD(seq, {BURST_RECORDS})) / {BURST_RECORDS} * {per_group}"
                 f" + MOD(seq, {per_group}) AS INT)")
    return f"CONCAT('k', LPAD(CAST({index} AS STRING), 3, '0'))"


def count_lines(path: str) -> int:
    with open(path) as f:
        return sum(1 for line in f if line.strip())


def window_table(window: str, session_gap_ms: int) -> str:
    """The Window TVF of `--window` over the generator's table."""
    if window == "tumbling":
        return "TUMBLE(TABLE gen, DESCRIPTOR(ts), INTERVAL '10' SECOND)"
    if window == "sliding":
        return "HOP(TABLE gen, DESCRIPTOR(ts), INTERVAL '10' SECOND, INTERVAL '60' SECOND)"
    return f"SESSION(TABLE gen PARTITION BY k, DESCRIPTOR(ts), INTERVAL '{session_gap_ms / 1000}' SECOND)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=2_000_000)
    parser.add_argument("--parallelism", type=int, default=2)
    parser.add_argument("--two-phase", action="store_true", help="let the planner pre-aggregate per source")
    parser.add_argument("--watermark-interval-ms", type=int, default=None,
                        help="pipeline.auto-watermark-interval (Flink's default: 200 ms of wall-clock time)")
    parser.add_argument("--window", choices=("tumbling", "sliding", "session"), default="tumbling")
    parser.add_argument("--keys", choices=("bursts", "uniform"), default="bursts")
    parser.add_argument("--session-gap-ms", type=int, default=1000)
    parser.add_argument("--count-rows", action="store_true",
                        help="write the rows to CSV files and count them (a check, not a timing)")
    args = parser.parse_args(argv)

    from pyflink.table import EnvironmentSettings, TableEnvironment  # only in the Flink venv

    env = TableEnvironment.create(EnvironmentSettings.in_streaming_mode())
    conf = env.get_config()
    conf.set("parallelism.default", str(args.parallelism))
    conf.set("table.optimizer.agg-phase-strategy", "TWO_PHASE" if args.two_phase else "ONE_PHASE")
    conf.set("pipeline.object-reuse", "true")
    if args.watermark_interval_ms is not None:
        conf.set("pipeline.auto-watermark-interval", f"{args.watermark_interval_ms} ms")
    last = args.records - 1
    env.execute_sql(f"""
        CREATE TABLE gen (
            seq BIGINT,
            r INT,
            k AS {key_expression(args.keys)},
            ts AS TO_TIMESTAMP_LTZ(1700000000000 + seq, 3),
            WATERMARK FOR ts AS ts
        ) WITH (
            'connector' = 'datagen',
            'rows-per-second' = '1000000000',
            'fields.seq.kind' = 'sequence', 'fields.seq.start' = '0', 'fields.seq.end' = '{last}',
            'fields.r.kind' = 'random', 'fields.r.min' = '0', 'fields.r.max' = '999'
        )""")
    out_dir = tempfile.mkdtemp(prefix="flink-windows-rows-") if args.count_rows else None
    sink = ("'connector' = 'blackhole'" if out_dir is None
            else f"'connector' = 'filesystem', 'path' = 'file://{out_dir}', 'format' = 'csv'")
    env.execute_sql(f"""
        CREATE TABLE sink_rows (k STRING, window_start TIMESTAMP(3), window_end TIMESTAMP(3), c BIGINT)
        WITH ({sink})""")
    t0 = time.monotonic()
    result = env.execute_sql(f"""
        INSERT INTO sink_rows
        SELECT k, window_start, window_end, COUNT(*) AS c
        FROM TABLE({window_table(args.window, args.session_gap_ms)})
        GROUP BY k, window_start, window_end""")
    client = result.get_job_client()
    assert client is not None
    net_ms = client.get_job_execution_result().result().get_net_runtime()
    wall_s = time.monotonic() - t0
    doc = {"records": args.records, "window": args.window, "keys": args.keys,
           "net_runtime_s": net_ms / 1000.0, "submit_to_end_s": wall_s,
           "records_per_s": args.records / (net_ms / 1000.0), "two_phase": args.two_phase,
           "watermark_interval_ms": args.watermark_interval_ms}
    if out_dir is not None:  # every file the sink wrote, committed or still in progress (no checkpoints here)
        files = [f for f in glob.glob(os.path.join(out_dir, "**", "*"), recursive=True) if os.path.isfile(f)]
        files += [f for f in glob.glob(os.path.join(out_dir, "**", ".*"), recursive=True) if os.path.isfile(f)]
        doc["rows_out"] = sum(count_lines(f) for f in set(files))
        shutil.rmtree(out_dir, ignore_errors=True)
    print(json.dumps(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
