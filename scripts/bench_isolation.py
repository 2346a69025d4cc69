#!/usr/bin/env python
"""Isolation benchmark: a fast pipeline alone, and beside a blocking sink on the same worker.

A local cluster of real processes (a coordinator and one worker with 2 slots, on loopback; a fresh one for
every run) runs one of two jobs from this file:

- `alone`: a fast pipeline, generator -> map -> discard (one chained task, `--records` records);
- `together`: the same, beside a second pipeline whose sink calls `time.sleep(0.001)` per record without
  declaring it blocking (the `auto` isolation policy has to find it: runtime/execution/isolation.py).

The fast pipeline's records/s is its records over the time from its sink's `open` to its `finish` (the end of
its input: beside the unbounded sleeper the task then waits for a final checkpoint that never comes, so the
task's own run time would not do); the sink writes both down in a file. The oldest worker heartbeat the
coordinator saw during the run is noted too. Runs alternate alone / together; the figures are the medians,
the slowest, and the ratio of the medians measured in this one invocation. The integration test
(tests/integration/test_isolation.py) asserts only what isolation guarantees on a busy machine (progress,
heartbeats within the timeout, checkpoints); the speed is measured here.

    .venv/bin/python scripts/bench_isolation.py --records 4000000 --repeat 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any

SCRIPTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(SCRIPTS)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from runtime.api import DiscardSink, GeneratorSource, Job, Sink  # noqa: E402

RECORDS_ENV = "SLUICE_BENCH_RECORDS"  # set before the cluster starts: the workers build the job with it
TIMES_ENV = "SLUICE_BENCH_TIMES"  # the directory the fast sink writes its open and finish times to


class TimedSink(DiscardSink):
    """Discards, and at the end of its input writes when it opened and finished (wall clock) and its count."""

    def open(self, subtask_index: int, parallelism: int, attempt: int) -> None:
        super().open(subtask_index, parallelism, attempt)
        self.opened = time.time()

    def finish(self) -> None:
        with open(os.path.join(os.environ[TIMES_ENV], "fast.json"), "w") as f:
            json.dump({"opened": self.opened, "finished": time.time(), "records": self.records}, f)


class SleepingSink(Sink):
    """A blocking client: 1 ms a record, not declared blocking."""

    def write(self, record: Any) -> None:
        time.sleep(0.001)


def _fast(job: Job) -> None:
    records = int(os.environ.get(RECORDS_ENV, "4000000"))
    (job.source(GeneratorSource(count=records, keys=100, seed=1), parallelism=1, name="fast")
        .map(lambda r: (r[0], r[1] + 1), parallelism=1)
        .sink(TimedSink(), parallelism=1))


def alone(job: Job) -> None:
    _fast(job)


def together(job: Job) -> None:
    _fast(job)
    (job.source(GeneratorSource(count=None, keys=10, seed=2), parallelism=1, name="slow")
        .sink(SleepingSink(), parallelism=1))


def _read_times(path: str) -> dict[str, Any] | None:
    try:
        with open(path) as f:
            return dict(json.load(f))
    except FileNotFoundError:
        return None


async def _run(entry: str, records: int, timeout_s: float) -> dict[str, Any]:
    from bench_throughput import logs_kept_on_failure  # same directory

    from runtime.cli.local_cluster import LocalCluster

    os.environ[RECORDS_ENV] = str(records)
    log_dir = tempfile.mkdtemp(prefix="sluice-bench-isolation-")
    times = os.path.join(log_dir, "fast.json")
    os.environ[TIMES_ENV] = log_dir
    with logs_kept_on_failure(LocalCluster(workers=1, slots=2, log_dir=log_dir), log_dir) as cluster:
        cluster.start()
        await cluster.wait_workers()
        submitted = await cluster.call("submit", {"entry": f"bench_isolation:{entry}", "name": entry,
                                                  "config": {}, "sys_path": SCRIPTS})
        job_id = submitted["job_id"]
        oldest_heartbeat = 0.0
        deadline = time.monotonic() + timeout_s
        while True:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the fast pipeline of {entry} did not finish within {timeout_s}s")
            status = await cluster.call("status", {"job_id": job_id})
            if status["state"] in ("FAILED", "CANCELLED"):
                raise RuntimeError(f"{entry} ended {status['state']}: {status['error']}")
            overview = await cluster.call("status")
            oldest_heartbeat = max([oldest_heartbeat, *(w["last_heartbeat_s_ago"] for w in overview["workers"])])
            slow = [t for t in status["tasks"] if t["name"].startswith("slow")]
            run = await asyncio.to_thread(_read_times, times)
            if run is not None:
                break
            await asyncio.sleep(0.2)
        if status["state"] != "FINISHED":
            await cluster.call("cancel", {"job_id": job_id})
    run_s = run["finished"] - run["opened"]
    if run["records"] != records:
        raise RuntimeError(f"{entry}: the fast sink took {run['records']} records, not {records}")
    return {"entry": entry, "records_per_s": records / run_s, "run_s": run_s, "oldest_heartbeat_s": oldest_heartbeat,
            "slow_records": sum(t["records_in"] for t in slow)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=4_000_000, help="fast records per run (default 4,000,000)")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each job, alternating (default 3)")
    parser.add_argument("--timeout", type=float, default=300.0, help="give up on a run after this many s")
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of text")
    args = parser.parse_args(argv)
    if args.records < 1 or args.repeat < 1:
        parser.error("--records and --repeat must be >= 1")
    from bench_throughput import machine  # same directory

    info = machine()
    out = sys.stderr if args.json else sys.stdout
    print(f"bench_isolation: {args.records:,} fast records x {args.repeat} runs of each; {info['nproc']} cpus "
          f"({info['cpu_model']}), Python {info['python']}; revision {info['revision']}", file=out, flush=True)
    runs: dict[str, list[dict[str, Any]]] = {"alone": [], "together": []}
    for i in range(args.repeat):
        for entry in ("alone", "together"):
            r = asyncio.run(_run(entry, args.records, args.timeout))
            runs[entry].append(r)
            print(f"  run {i + 1}: {entry:<8} {r['records_per_s']:>12,.0f} rec/s ({r['run_s']:.2f} s; oldest "
                  f"heartbeat {r['oldest_heartbeat_s']:.1f} s; slow sink {r['slow_records']} records)", file=out,
                  flush=True)
    medians = {k: statistics.median(r["records_per_s"] for r in v) for k, v in runs.items()}
    slowest = {k: min(r["records_per_s"] for r in v) for k, v in runs.items()}
    ratio = medians["together"] / medians["alone"]
    heartbeat = max(r["oldest_heartbeat_s"] for v in runs.values() for r in v)
    result = {"benchmark": "isolation", "records": args.records, "repeat": args.repeat, "machine": info,
              "median_records_per_s": medians, "slowest_records_per_s": slowest,
              "ratio_together_over_alone": ratio, "oldest_heartbeat_s": heartbeat, "runs": runs}
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for k in ("alone", "together"):
            print(f"{k:<8}: median {medians[k]:>12,.0f} records/s, slowest {slowest[k]:>12,.0f}")
        print(f"median beside the blocking sink / median alone: {ratio:.2f}; oldest heartbeat {heartbeat:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
