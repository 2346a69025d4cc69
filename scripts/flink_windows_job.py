#!/usr/bin/env python
"""The window benchmark's tumbling job on Apache Flink (PyFlink 2.x), for a side-by-side figure.

Run with the Python of a venv that has `apache-flink` installed (never Sluice's): scripts/bench_windows.py
starts it as a subprocess with `--flink-python`. The same shape as Sluice's `tumbling` job: a generator of
`--records` rows (parallelism 2) with `seq` 0..N-1, a key drawn uniformly from 1000 (`k000`..`k999`) and the
event time `1_700_000_000_000 + seq` ms, watermarks with no delay; a tumbling 10 s event-time count per key
(parallelism 2) into a discarding sink. Flink SQL runs it inside the JVM (a Python UDF would cost more than the
window); by default the aggregation is one phase (records are shuffled by key, then counted, as Sluice's job
does), `--two-phase` lets the planner pre-aggregate before the shuffle (its default).

Prints one JSON line: records, the job's net run time (JobExecutionResult.getNetRuntime: from the job's start
to its end, inside the already running mini cluster) and records per second over it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=2_000_000)
    parser.add_argument("--parallelism", type=int, default=2)
    parser.add_argument("--two-phase", action="store_true", help="let the planner pre-aggregate per source")
    parser.add_argument("--watermark-interval-ms", type=int, default=None,
                        help="pipeline.auto-watermark-interval (Flink's default: 200 ms of wall-clock time)")
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
            k AS CONCAT('k', LPAD(CAST(r AS STRING), 3, '0')),
            ts AS TO_TIMESTAMP_LTZ(1700000000000 + seq, 3),
            WATERMARK FOR ts AS ts
        ) WITH (
            'connector' = 'datagen',
            'rows-per-second' = '1000000000',
            'fields.seq.kind' = 'sequence', 'fields.seq.start' = '0', 'fields.seq.end' = '{last}',
            'fields.r.kind' = 'random', 'fields.r.min' = '0', 'fields.r.max' = '999'
        )""")
    env.execute_sql("""
        CREATE TABLE sink_rows (k STRING, window_start TIMESTAMP(3), window_end TIMESTAMP(3), c BIGINT)
        WITH ('connector' = 'blackhole')""")
    t0 = time.monotonic()
    result = env.execute_sql("""
        INSERT INTO sink_rows
        SELECT k, window_start, window_end, COUNT(*) AS c
        FROM TABLE(TUMBLE(TABLE gen, DESCRIPTOR(ts), INTERVAL '10' SECOND))
        GROUP BY k, window_start, window_end""")
    client = result.get_job_client()
    assert client is not None
    net_ms = client.get_job_execution_result().result().get_net_runtime()
    wall_s = time.monotonic() - t0
    print(json.dumps({"records": args.records, "net_runtime_s": net_ms / 1000.0, "submit_to_end_s": wall_s,
                      "records_per_s": args.records / (net_ms / 1000.0), "two_phase": args.two_phase,
                      "watermark_interval_ms": args.watermark_interval_ms}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
