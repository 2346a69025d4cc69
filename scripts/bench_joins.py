#!/usr/bin/env python
"""Join benchmark: interval-join throughput and unaligned checkpoint durations under backpressure, Sluice and
Apache Flink 2.3 (PyFlink) side by side in one run.

Job (`bench_joins:build`, imported by the cluster's processes through the submission's sys_path; the Flink twin
is scripts/flink_interval_join_job.py): two sources of (key, seq, event_time_ms) records, parallelism 2 each,
the key a fixed hash of seq over --keys keys (different hashes on the two sides), event time
1_700_000_000_000 + seq, watermarks with no delay; `left.key_by(key).interval_join(right.key_by(key))
.between(--lower, --upper)` at parallelism 2, each pair costing a busy-wait of --cost-us, into a discarding
sink. Both engines run on this machine with the same records: Sluice on a local cluster (a coordinator and 2
workers with 2 slots each), Flink on its local mini cluster.

- throughput: --records per side, bounded, no checkpoints: both sides' records over the job's run time.
  Sluice: from the submit call to the job's end (status polled every 0.1 s; deployment included). Flink: the
  job's net run time (JobExecutionResult; its deployment and Python workers' start included). Median and
  slowest of --repeat runs.
- checkpoints: unbounded sources, a per-pair cost that backpressures them (--checkpoint-cost-us), unaligned
  checkpoints every 1 s; after --warmup s, the durations (trigger to last acknowledgement) of the checkpoints
  triggered in the next --seconds s. Median and slowest over all of them, from --repeat runs.

    .venv/bin/python scripts/bench_joins.py --flink-python PATH/TO/flink-venv/bin/python
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

SCRIPTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(SCRIPTS)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from runtime.api import BoundedOutOfOrderness, DiscardSink, Job, Source  # noqa: E402

T0 = 1_700_000_000_000
ENV = "SLUICE_BENCH_JOINS"  # JSON settings for the job, set before the cluster starts (its processes inherit it)


class SeqSource(Source):
    """seq 0..count-1 (None: unbounded) as (key, seq, event time), the key a fixed hash of seq: the records of
    Flink's NumberSequenceSource mapped by the same function. Subtask i of p takes seq i, i + p, ..."""

    rescalable = False

    def __init__(self, count: int | None, keys: int, multiplier: int, offset: int) -> None:
        self.count, self.keys, self.multiplier, self.offset = count, keys, multiplier, offset
        self.bounded = count is not None

    def open(self, subtask_index: int, parallelism: int) -> None:
        super().open(subtask_index, parallelism)
        self._next = subtask_index
        self._step = parallelism

    def read_batch(self, max_records: int) -> list[Any] | None:
        start, step = self._next, self._step
        stop = start + max_records * step
        if self.count is not None:
            stop = min(stop, self.count)
            if start >= stop:
                return None
        keys, mul, off = self.keys, self.multiplier, self.offset
        batch = [(f"k{(s * mul + off) % keys:03d}", s, T0 + s) for s in range(start, stop, step)]
        self._next = start + len(batch) * step
        return batch

    def position(self) -> Any:
        return self._next

    def restore(self, position: Any) -> None:
        self._next = position


def settings() -> dict[str, Any]:
    return dict(json.loads(os.environ.get(ENV, "{}")))


def build(job: Job) -> None:
    s = settings()
    count, keys, cost_s = s.get("records"), s.get("keys", 100), s.get("cost_us", 0.0) / 1e6
    timed = BoundedOutOfOrderness(max_delay_ms=0, timestamp=lambda r: r[2])
    left = job.source(SeqSource(count, keys, 2654435761, 0), name="left", parallelism=2, watermarks=timed)
    right = job.source(SeqSource(count, keys, 40503, 17), name="right", parallelism=2, watermarks=timed)

    def pair(left: Any, right: Any, ctx: Any) -> None:
        end = time.perf_counter() + cost_s
        while time.perf_counter() < end:
            pass
        ctx.emit((left[0], left[1], right[1]))

    (left.key_by(lambda r: r[0]).interval_join(right.key_by(lambda r: r[0]))
        .between(s.get("lower", -5), s.get("upper", 5))
        .process(pair, parallelism=2)
        .sink(DiscardSink()))


# -- Sluice runs ------------------------------------------------------------------------------------------


def _sluice(job_settings: dict[str, Any], measure: Any) -> dict[str, Any]:
    from runtime.cli.local_cluster import LocalCluster

    os.environ[ENV] = json.dumps(job_settings)
    log_dir = tempfile.mkdtemp(prefix="sluice-bench-joins-")
    cluster = LocalCluster(workers=2, slots=2, log_dir=log_dir, state_dir=os.path.join(log_dir, "state"))
    try:
        cluster.start()
        return dict(asyncio.run(measure(cluster)))
    finally:
        cluster.stop()


async def _submit(cluster: Any, config: dict[str, Any]) -> tuple[str, float, float]:
    """Submit the job; returns its id, when it was submitted and when every task reported running."""
    await cluster.wait_workers()
    submitted = time.monotonic()
    job_id = (await cluster.call("submit", {"entry": "bench_joins:build", "name": "bench-joins", "config": config,
                                            "sys_path": SCRIPTS}))["job_id"]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        st = await cluster.call("status", {"job_id": job_id})
        if st["state"] in ("FAILED", "CANCELLED"):
            raise RuntimeError(f"job {job_id} {st['state']}: {st.get('error')}")
        if st["state"] in ("RUNNING", "FINISHED") and len(st["tasks"]) == st["tasks_total"]:
            return job_id, submitted, time.monotonic()
        await asyncio.sleep(0.05)
    raise RuntimeError(f"job {job_id} did not report its tasks within 60 s")


def sluice_throughput(records: int, keys: int, lower: int, upper: int) -> dict[str, Any]:
    async def measure(cluster: Any) -> dict[str, Any]:
        job_id, submitted, _ = await _submit(cluster, {})
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            st = await cluster.call("status", {"job_id": job_id})
            if st["state"] == "FINISHED":
                seconds = time.monotonic() - submitted
                return {"engine": "sluice", "records": 2 * records, "seconds": seconds,
                        "records_per_s": 2 * records / seconds}
            if st["state"] in ("FAILED", "CANCELLED"):
                raise RuntimeError(f"job {job_id} {st['state']}: {st.get('error')}")
            await asyncio.sleep(0.1)
        raise RuntimeError("the throughput run did not finish within 600 s")

    return _sluice({"records": records, "keys": keys, "lower": lower, "upper": upper}, measure)


def sluice_checkpoints(keys: int, lower: int, upper: int, cost_us: float, warmup: float,
                       seconds: float) -> dict[str, Any]:
    async def measure(cluster: Any) -> dict[str, Any]:
        config = {"checkpoint": {"interval_s": 1.0, "mode": "unaligned", "timeout_s": 10.0,
                                 "tolerable_failures": 1000, "min_pause_s": 0}}
        job_id, _, running = await _submit(cluster, config)
        await asyncio.sleep(warmup)
        t0 = time.monotonic()
        await asyncio.sleep(seconds)
        t1 = time.monotonic()
        st = await cluster.call("status", {"job_id": job_id})
        backpressured = sum(t["backpressured_s"] for t in st["tasks"] if t["name"].startswith(("left", "right")))
        wait_until = time.monotonic() + 12
        while True:
            history = (await cluster.call("checkpoints", {"job_id": job_id}))["history"]
            window = [h for h in history if t0 <= h["started_at"] < t1]
            if all(h["status"] != "IN_PROGRESS" for h in window) or time.monotonic() > wait_until:
                break
            await asyncio.sleep(0.25)
        await cluster.call("cancel", {"job_id": job_id})
        done = [h for h in window if h["status"] == "COMPLETED"]
        return {"engine": "sluice", "completed": len(done), "failed": len(window) - len(done),
                "durations_s": sorted(h["duration_s"] for h in done),
                "inflight_bytes": [h["inflight_bytes"] for h in done],
                "sources_backpressured_s": backpressured, "since_running_s": time.monotonic() - running}

    return _sluice({"records": None, "keys": keys, "lower": lower, "upper": upper, "cost_us": cost_us}, measure)


# -- Flink runs -------------------------------------------------------------------------------------------


def flink(python: str, *args: str) -> list[dict[str, Any]]:
    """The Flink job's figures as a one-item list; empty (and the reason on stderr) when it failed."""
    proc = subprocess.run([python, os.path.join(SCRIPTS, "flink_interval_join_job.py"), *args],
                          capture_output=True, text=True, timeout=900)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        print(f"the Flink job failed ({proc.returncode}): {proc.stderr[-3000:]}", file=sys.stderr)
        return []
    return [dict(json.loads(lines[-1]))]


# -- report -----------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--flink-python", help="the Python of a venv with apache-flink (no Flink runs without it)")
    parser.add_argument("--records", type=int, default=200_000, help="per side, throughput runs (default 200000)")
    parser.add_argument("--keys", type=int, default=100)
    parser.add_argument("--lower", type=int, default=-5)
    parser.add_argument("--upper", type=int, default=5)
    parser.add_argument("--checkpoint-cost-us", type=float, default=500.0, help="busy-wait per pair (default 500)")
    parser.add_argument("--warmup", type=float, default=8.0)
    parser.add_argument("--seconds", type=float, default=12.0)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", help="also write every run's figures to this file")
    args = parser.parse_args(argv)

    runs: dict[str, list[dict[str, Any]]] = {"sluice throughput": [], "flink throughput": [],
                                             "sluice checkpoints": [], "flink checkpoints": []}
    shape = ["--keys", str(args.keys), "--lower", str(args.lower), "--upper", str(args.upper)]
    for i in range(args.repeat):
        runs["sluice throughput"].append(sluice_throughput(args.records, args.keys, args.lower, args.upper))
        if args.flink_python:
            runs["flink throughput"] += flink(args.flink_python, "--mode", "throughput", "--records",
                                              str(args.records), *shape)
        runs["sluice checkpoints"].append(sluice_checkpoints(args.keys, args.lower, args.upper,
                                                             args.checkpoint_cost_us, args.warmup, args.seconds))
        if args.flink_python:
            runs["flink checkpoints"] += flink(
                args.flink_python, "--mode", "checkpoint", "--cost-us", str(args.checkpoint_cost_us), "--warmup",
                str(args.warmup), "--seconds", str(args.seconds), *shape)
        print(f"round {i + 1}/{args.repeat} done", file=sys.stderr)

    print(f"interval join, {args.records:,} records per side, {args.keys} keys, bounds [{args.lower}, {args.upper}] "
          f"ms, parallelism 2; {args.repeat} runs each")
    for engine in ("sluice", "flink"):
        tp = [r["records_per_s"] for r in runs[f"{engine} throughput"]]
        cps = [d for r in runs[f"{engine} checkpoints"] for d in r["durations_s"]]
        failed = sum(r["failed"] for r in runs[f"{engine} checkpoints"])
        if tp:
            print(f"{engine:<7} throughput: median {statistics.median(tp):,.0f} records/s, slowest run "
                  f"{min(tp):,.0f} records/s ({', '.join(f'{x:,.0f}' for x in tp)})")
        if cps:
            print(f"{engine:<7} unaligned checkpoints under backpressure ({args.checkpoint_cost_us:.0f} µs per "
                  f"pair): median {statistics.median(cps):.3f} s, slowest {max(cps):.3f} s, {len(cps)} completed, "
                  f"{failed} failed")
    if runs["flink throughput"] and runs["sluice throughput"]:
        ratio = statistics.median(r["records_per_s"] for r in runs["sluice throughput"]) / \
            statistics.median(r["records_per_s"] for r in runs["flink throughput"])
        print(f"throughput ratio sluice / flink: {ratio:.2f}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(runs, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
