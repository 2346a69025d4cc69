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

--in-process measures what the SQL planner changes and nothing else, robustly on a busy machine: the keyed task's
operator chain of each job (window, row map, sink) built in this process and fed the generator's records in
batches of 1024 with a watermark after each batch (timers fired as the task fires them); records per CPU second
of this process (time.process_time), alternating, --repeat times each.

    .venv/bin/python scripts/bench_sql.py --records 2000000 --repeat 5
    .venv/bin/python scripts/bench_sql.py --in-process --records 1000000 --repeat 5
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


def run_in_process(entry: str, records: int) -> float:
    """Records per CPU second through the job's keyed chain (module docstring)."""
    import time

    from runtime.api import Job
    from runtime.connectors.generator import GeneratorSource
    from runtime.execution.operators import Chain
    from runtime.graph.plan import chain_graph, load_entry

    os.environ["SLUICE_BENCH_RECORDS"] = str(records)
    job = Job("bench")
    load_entry(entry)(job)
    for node in job.nodes:
        node.parallelism = 1
    vertices, _ = chain_graph(job)
    keyed = next(v for v in vertices if job.nodes[v.nodes[0]].kind == "keyed_process")
    chain = Chain(job, keyed.nodes, subtask_index=0, parallelism=1, attempt=0, outputs=[])
    chain.open()
    source = GeneratorSource(count=records, keys=1000, seed=7)
    source.open(0, 1)
    batches = []
    while (batch := source.read_batch(1024)) is not None:
        batches.append([(r[2], r) for r in batch])
    timers = chain.timers
    assert timers is not None
    started = time.process_time()
    for batch in batches:
        chain.process_batch(batch)
        wm = batch[-1][0] - 1
        timers.set_watermark(wm)
        while timers.fire_event(wm, 1024):
            pass
        chain.forward_watermark(wm)
    timers.set_watermark(2**62)
    while timers.fire_event(2**62, 1024):
        pass
    return records / (time.process_time() - started)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=2_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--in-process", action="store_true", help="the keyed chains in this process, CPU time")
    args = parser.parse_args()
    rates: dict[str, list[float]] = {name: [] for name in JOBS}
    for i in range(args.repeat):
        for name, entry in JOBS.items():
            if args.in_process:
                rate = run_in_process(entry, args.records)
                rates[name].append(rate)
                print(f"run {i + 1} {name:<10} {rate:>12,.0f} records per CPU second", flush=True)
                continue
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
