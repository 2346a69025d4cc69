#!/usr/bin/env python
"""Async I/O benchmark: an enrichment job calling an HTTP service with 20 ms latency, async vs synchronous.

Starts the lookup service (runtime/examples/lookup_service.py, --latency-ms per lookup) and, for each mode, a
fresh local cluster of one worker running runtime/examples/enrich.py at parallelism 1
(GeneratorSource -> lookup -> DiscardSink):
- sync: `map(lookup_blocking)`, a synchronous HTTP client (http.client, one keep-alive connection);
- async: `async_map(lookup, capacity=C)` for each --capacity, the runtime's asyncio client.
Records/s = records over the coordinator's submit -> FINISHED time (deployment included, so the record
counts are chosen to run several seconds each). Medians of --repeats runs; the ratio is async over sync.

`--isolation-ab`: instead, the async job alone with its function's coroutines on the worker's loop
(SLUICE_TASK_ISOLATION=inline, as before issue 31) and on the task's own loop (the default,
runtime/execution/user_loop.py), one run of each per round, the order swapped every round; prints each run
with the load average, the medians, the slowest runs and the ratio.

    .venv/bin/python scripts/bench_async_io.py
    .venv/bin/python scripts/bench_async_io.py --isolation-ab --repeats 5
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import bench_state  # noqa: E402 - its cluster_run, from this directory

from tests.support.lookup_service import lookup_service  # noqa: E402


def cluster_run(entry: str, records: int, capacity: int) -> float:
    """Records/s of one job on a fresh local cluster of one worker (submit -> FINISHED)."""
    os.environ["SLUICE_BENCH_CAPACITY"] = str(capacity)  # inherited by the cluster's processes
    return bench_state.cluster_run(entry, records, {}, workers=1, name="bench-async-io")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--latency-ms", type=float, default=20.0)
    parser.add_argument("--sync-records", type=int, default=300)
    parser.add_argument("--async-records", type=int, default=30_000)
    parser.add_argument("--capacity", type=int, nargs="+", default=[100])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--isolation-ab", action="store_true",
                        help="the async job with its coroutines on the worker's loop vs the task's own, alternating")
    args = parser.parse_args()
    if args.isolation_ab:
        isolation_ab(args)
        return
    rows: list[dict[str, Any]] = []
    with lookup_service(latency_ms=args.latency_ms) as port:
        os.environ["SLUICE_LOOKUP_PORT"] = str(port)
        runs = [("sync", "runtime.examples.enrich:build_bench_sync", args.sync_records, 1)]
        runs += [("async", "runtime.examples.enrich:build_bench_async", args.async_records, c) for c in args.capacity]
        for mode, entry, records, capacity in runs:
            rates = [cluster_run(entry, records, capacity) for _ in range(args.repeats)]
            rows.append({"mode": mode, "capacity": capacity if mode == "async" else None, "records": records,
                         "records_per_s": statistics.median(rates), "runs": rates})
            print(json.dumps(rows[-1]), file=sys.stderr)
    sync = rows[0]["records_per_s"]
    print(f"machine: {platform.platform()}, {os.cpu_count()} CPUs, Python {platform.python_version()}")
    print(f"service latency {args.latency_ms:g} ms, medians of {args.repeats} runs")
    print("| mode | capacity | records | records/s | vs sync |")
    print("|---|---|---|---|---|")
    for row in rows:
        cap = row["capacity"] if row["capacity"] is not None else "-"
        print(f"| {row['mode']} | {cap} | {row['records']:,} | {row['records_per_s']:,.0f} | "
              f"{row['records_per_s'] / sync:.1f}x |")


def isolation_ab(args: argparse.Namespace) -> None:
    variants = {"worker loop (inline)": "inline", "task's own loop (thread)": "thread"}
    rates: dict[str, list[float]] = {name: [] for name in variants}
    capacity = args.capacity[0]
    with lookup_service(latency_ms=args.latency_ms) as port:
        os.environ["SLUICE_LOOKUP_PORT"] = str(port)
        for round_ in range(args.repeats):
            order = list(variants) if round_ % 2 == 0 else list(reversed(variants))
            for name in order:
                os.environ["SLUICE_TASK_ISOLATION"] = variants[name]  # inherited by the cluster's worker
                rate = cluster_run("runtime.examples.enrich:build_bench_async", args.async_records, capacity)
                rates[name].append(rate)
                print(json.dumps({"round": round_ + 1, "variant": name, "records_per_s": round(rate),
                                  "load_average": os.getloadavg()}), file=sys.stderr)
    os.environ.pop("SLUICE_TASK_ISOLATION", None)
    print(f"machine: {platform.platform()}, {os.cpu_count()} CPUs, Python {platform.python_version()}")
    print(f"service latency {args.latency_ms:g} ms, capacity {capacity}, {args.async_records:,} records, "
          f"{args.repeats} rounds")
    print("| coroutines on | records/s, median | slowest |")
    print("|---|---|---|")
    for name, values in rates.items():
        print(f"| {name} | {statistics.median(values):,.0f} | {min(values):,.0f} |")
    before, after = (statistics.median(rates[name]) for name in variants)
    print(f"own loop / worker loop: {after / before:.2f}")


if __name__ == "__main__":
    main()
