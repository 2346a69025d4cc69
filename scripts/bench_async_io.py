#!/usr/bin/env python
"""Async I/O benchmark: an enrichment job calling an HTTP service with 20 ms latency, async vs synchronous.

Starts the lookup service (runtime/examples/lookup_service.py, --latency-ms per lookup) and, for each mode, a
fresh local cluster of one worker running runtime/examples/enrich.py at parallelism 1
(GeneratorSource -> lookup -> DiscardSink):
- sync: `map(lookup_blocking)`, a synchronous HTTP client (http.client, one keep-alive connection);
- async: `async_map(lookup, capacity=C)` for each --capacity, the runtime's asyncio client.
Records/s = records over the coordinator's submit -> FINISHED time (deployment included, so the record
counts are chosen to run several seconds each). Medians of --repeats runs; the ratio is async over sync.
With --flink-python PYTHON (a Python with PyFlink 2.x), two more modes per capacity, alternating: `sleep` (Sluice,
`async_map` of an `async def` that awaits asyncio.sleep(latency) instead of the service) and `flink-sleep` (the
same on Apache Flink: scripts/flink_async_io_job.py, `AsyncDataStream.unordered_wait`; records / the job's net
run time, deployment included). The script's docstring says why a sleep and not the service.

`--isolation-ab`: instead, the async job alone with its function's coroutines on the worker's loop
(SLUICE_TASK_ISOLATION=inline, as before issue 31) and on the task's own loop (the default,
runtime/execution/user_loop.py), one run of each per round, the order swapped every round; prints each run
with the load average, the medians, the slowest runs and the ratio.

    .venv/bin/python scripts/bench_async_io.py
    .venv/bin/python scripts/bench_async_io.py --isolation-ab --repeats 5
    .venv/bin/python scripts/bench_async_io.py --flink-python FLINK_VENV/bin/python
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import bench_state  # noqa: E402 - its cluster_run, from this directory

from tests.support.lookup_service import lookup_service  # noqa: E402


def cluster_run(entry: str, records: int, capacity: int) -> float:
    """Records/s of one job on a fresh local cluster of one worker (submit -> FINISHED)."""
    os.environ["SLUICE_BENCH_CAPACITY"] = str(capacity)  # inherited by the cluster's processes
    return bench_state.cluster_run(entry, records, {}, workers=1, name="bench-async-io")


def flink_run(python: str, records: int, capacity: int, latency_ms: float) -> float:
    """Records/s of the sleep job on PyFlink (scripts/flink_async_io_job.py, its last line of output)."""
    job = os.path.join(os.path.dirname(os.path.abspath(__file__)), "flink_async_io_job.py")
    done = subprocess.run([python, job, "--records", str(records), "--capacity", str(capacity),
                           "--latency-ms", str(latency_ms)],
                          capture_output=True, text=True, timeout=900, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the Flink job failed ({done.returncode}): {done.stderr[-2000:]}")
    return float(json.loads(done.stdout.strip().splitlines()[-1])["records_per_s"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--latency-ms", type=float, default=20.0)
    parser.add_argument("--sync-records", type=int, default=300)
    parser.add_argument("--async-records", type=int, default=30_000)
    parser.add_argument("--capacity", type=int, nargs="+", default=[100])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--isolation-ab", action="store_true",
                        help="the async job with its coroutines on the worker's loop vs the task's own, alternating")
    parser.add_argument("--flink-python", default=None, help="a Python with PyFlink: adds the Flink job")
    args = parser.parse_args()
    if args.isolation_ab:
        isolation_ab(args)
        return
    rows: list[dict[str, Any]] = []
    with lookup_service(latency_ms=args.latency_ms) as port:
        os.environ["SLUICE_LOOKUP_PORT"] = str(port)
        runs = [("sync", "runtime.examples.enrich:build_bench_sync", args.sync_records, 1)]
        runs += [("async", "runtime.examples.enrich:build_bench_async", args.async_records, c) for c in args.capacity]
        os.environ["SLUICE_BENCH_LATENCY_MS"] = str(args.latency_ms)  # the sleep job's pause
        for mode, entry, records, capacity in runs:
            rates = [cluster_run(entry, records, capacity) for _ in range(args.repeats)]
            rows.append({"mode": mode, "capacity": capacity if mode != "sync" else None, "records": records,
                         "records_per_s": statistics.median(rates), "slowest": min(rates), "runs": rates})
            print(json.dumps(rows[-1]), file=sys.stderr)
        for capacity in args.capacity if args.flink_python else []:  # Sluice and Flink alternating, run by run
            rates_by: dict[str, list[float]] = {"sleep": [], "flink-sleep": []}
            for _ in range(args.repeats):
                rates_by["sleep"].append(cluster_run("runtime.examples.enrich:build_bench_async_sleep",
                                                     args.async_records, capacity))
                rates_by["flink-sleep"].append(flink_run(args.flink_python, args.async_records, capacity,
                                                         args.latency_ms))
            for mode, rates in rates_by.items():
                rows.append({"mode": mode, "capacity": capacity, "records": args.async_records,
                             "records_per_s": statistics.median(rates), "slowest": min(rates), "runs": rates})
                print(json.dumps(rows[-1]), file=sys.stderr)
    sync = rows[0]["records_per_s"]
    print(f"machine: {platform.platform()}, {os.cpu_count()} CPUs, Python {platform.python_version()}")
    print(f"service latency {args.latency_ms:g} ms, medians of {args.repeats} runs")
    print("| mode | capacity | records | records/s (median) | slowest | vs sync |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        cap = row["capacity"] if row["capacity"] is not None else "-"
        print(f"| {row['mode']} | {cap} | {row['records']:,} | {row['records_per_s']:,.0f} | {row['slowest']:,.0f} | "
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
