#!/usr/bin/env python
"""SQL against the hand-written DataStream job: a windowed count and sum, the same query both ways.

Jobs (runtime/examples/sqlcount.py, each on a fresh local cluster of a coordinator and 2 workers with 2 slots,
alternating, --repeat times each): GeneratorSource (parallelism 2, 1000 keys, event time 1 ms a record,
watermarks every 10 ms) -> key_by(word) -> 10 s tumbling window with COUNT(*) and SUM(seq) -> rows
(word, window_start, window_end, count, sum) -> a discarding sink, parallelism 2;
- datastream: the window's AggregateFunction and the row map written by hand;
- sql: `job.from_stream` + `job.sql(...)`: TABLE(TUMBLE(...)) GROUP BY word, window_start, window_end, planned by
  runtime/sql (compiled accumulator, the row built in the Calc's one map).

Records/s = records / job wall time (the longest task's busy + idle + backpressured time), as
scripts/bench_windows.py measures it; the ratio is sql / datastream medians of one invocation.

    .venv/bin/python scripts/bench_sql.py --records 2000000 --repeat 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "scripts"))

from bench_windows import run_one  # noqa: E402

JOBS = {"datastream": "runtime.examples.sqlcount:build_bench_datastream",
        "sql": "runtime.examples.sqlcount:build_bench_sql"}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=2_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=900.0)
    args = parser.parse_args()
    rates: dict[str, list[float]] = {name: [] for name in JOBS}
    for i in range(args.repeat):
        for name, entry in JOBS.items():
            r = run_one(entry, args.records, 0, args.timeout)
            rates[name].append(r["records_per_s"])
            print(f"run {i + 1} {name:<10} {r['records_per_s']:>12,.0f} records/s  wall {r['wall_s']:.2f}s",
                  flush=True)
    medians = {name: statistics.median(v) for name, v in rates.items()}
    for name, v in rates.items():
        print(f"{name:<10} median {medians[name]:>12,.0f} records/s  slowest {min(v):>12,.0f}")
    print(f"sql / datastream: {medians['sql'] / medians['datastream']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
