#!/usr/bin/env python
"""Timer-storm benchmark: checkpoint duration while 100,000 event-time timers fire at once, against idle.

Job (defined here, `bench_timers:build`, imported by the cluster's processes through the submission's
sys_path): GeneratorSource (parallelism 1, throttled to --rate records/s, timestamps = its event_time,
BoundedOutOfOrderness(max_delay_ms=0, granularity_ms=100)) -> key_by(seq) -> Storm (parallelism 1): each of
the first --timers records (each its own key) registers an event-time timer at the same timestamp, which the
watermark passes about 1000 records later: all --timers timers are due at once. `on_timer` busy-waits
--cost-us (default 0) and emits one record to a chained DiscardSink. After the storm the source goes on for
--after-s seconds, so that checkpoints keep being triggered.

The storm's start and end (first and last timer fired, on the system-wide monotonic clock the coordinator's
history uses) are written by the job into the directory named by SLUICE_BENCH_TIMERS_DIR (set before the
cluster starts, inherited by its processes).
Checkpoints every --interval s, in each mode of --modes, on a fresh local cluster (a coordinator and 2
workers with 2 slots each). From the coordinator's history: durations (trigger -> last acknowledgement) of
the checkpoints triggered during the storm, and of those triggered before it (the same job, idle timers).
With unaligned checkpoints the barrier overtakes the storm (the task serves its mailbox between chunks of
64 timers); an aligned barrier queues behind the watermark that started the storm, so it waits for the
storm to end: the difference is what chunking buys.

    .venv/bin/python scripts/bench_timers.py --timers 100000
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

from runtime.api import (  # noqa: E402
    BoundedOutOfOrderness,
    DiscardSink,
    GeneratorSource,
    Job,
    KeyedProcessFunction,
)
from runtime.connectors.generator import EVENT_TIME_START_MS  # noqa: E402

ENTRY = "bench_timers:build"
DIR_ENV = "SLUICE_BENCH_TIMERS_DIR"
PARAMS_ENV = "SLUICE_BENCH_TIMERS"  # json: timers, rate, after_s, cost_us


# -- the job (runs in the cluster's processes) ---------------------------------------------


def _params() -> dict[str, Any]:
    return dict(json.loads(os.environ.get(PARAMS_ENV, "{}")))


class Storm(KeyedProcessFunction):
    def open(self, ctx: Any) -> None:
        p = _params()
        self.timers = int(p.get("timers", 100_000))
        self.fire_at = EVENT_TIME_START_MS + self.timers + 1000
        self.cost_s = float(p.get("cost_us", 0.0)) / 1e6
        self.fired = 0
        self.out = os.environ.get(DIR_ENV, "")

    def process(self, record: Any, ctx: Any) -> None:
        if record[1] < self.timers:
            ctx.timers.register_event_time(self.fire_at)

    def on_timer(self, timestamp: int, ctx: Any) -> None:
        self.fired += 1
        if self.fired == 1 or self.fired == self.timers:
            self._mark("first" if self.fired == 1 else "last")
        if self.cost_s:
            end = time.perf_counter() + self.cost_s
            while time.perf_counter() < end:
                pass
        ctx.emit(ctx.current_key)

    def _mark(self, name: str) -> None:
        if self.out:
            with open(os.path.join(self.out, name), "w") as f:
                f.write(repr(time.monotonic()))  # the coordinator's history uses the (system-wide) monotonic clock


def build(job: Job) -> None:
    p = _params()
    timers, rate, after_s = int(p.get("timers", 100_000)), float(p.get("rate", 50_000)), float(p.get("after_s", 4))
    watermarks = BoundedOutOfOrderness(max_delay_ms=0, timestamp=lambda r: r[2], granularity_ms=100)
    source = GeneratorSource(count=timers + 1000 + int(rate * after_s), keys=10, seed=1, records_per_second=rate)
    (job.source(source, parallelism=1, watermarks=watermarks)
        .key_by(lambda r: r[1])
        .process(Storm(), parallelism=1)
        .sink(DiscardSink()))


# -- measurement ------------------------------------------------------------------------------


async def _run_job(cluster: Any, mode: str, interval_s: float, marks: str) -> dict[str, Any]:
    await cluster.wait_workers()
    config = {"checkpoint": {"interval_s": interval_s, "mode": mode, "timeout_s": 120}}
    job_id = (await cluster.call("submit", {"entry": ENTRY, "name": f"bench-timers-{mode}", "config": config,
                                            "sys_path": SCRIPTS}))["job_id"]
    deadline = time.monotonic() + 600
    seen: dict[int, dict[str, Any]] = {}  # the coordinator keeps a bounded history: collect it as it goes
    while True:
        st = await cluster.call("status", {"job_id": job_id})
        for h in (await cluster.call("checkpoints", {"job_id": job_id}))["history"]:
            seen[h["checkpoint_id"]] = h
        if st["state"] in ("FINISHED", "FAILED", "CANCELLED"):
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"job {job_id} did not finish within 600 s")
        await asyncio.sleep(0.25)
    if st["state"] != "FINISHED":
        raise RuntimeError(f"job {job_id} ended {st['state']}: {st.get('error', '')}")
    history = [seen[i] for i in sorted(seen)]
    return {"storm_start": _read_mark(marks, "first"), "storm_end": _read_mark(marks, "last"), "history": history}


def _read_mark(marks: str, name: str) -> float:
    with open(os.path.join(marks, name)) as f:
        return float(f.read())


def summarise(run: dict[str, Any]) -> dict[str, Any]:
    start, end = run["storm_start"], run["storm_end"]
    done = [h for h in run["history"] if h["status"] == "COMPLETED"]
    # triggered while the storm was firing (or just before it, and still running when it began)
    during = [h["duration_s"] for h in done if h["started_at"] <= end and h["started_at"] + h["duration_s"] >= start]
    before = [h["duration_s"] for h in done if h["started_at"] + h["duration_s"] < start]
    return {"storm_s": end - start, "during": during, "before": before,
            "timeline": [(round(h["started_at"] - start, 3), h["duration_s"] and round(h["duration_s"], 3), h["status"])
                         for h in run["history"]],
            "during_median_s": statistics.median(during) if during else None,
            "during_max_s": max(during) if during else None,
            "before_median_s": statistics.median(before) if before else None,
            "failed": sum(1 for h in run["history"] if h["status"] == "FAILED")}


def run_one(mode: str, interval_s: float, params: dict[str, Any]) -> dict[str, Any]:
    from bench_throughput import logs_kept_on_failure  # here, not at the top: the cluster's processes import us

    from runtime.cli.local_cluster import LocalCluster

    log_dir = tempfile.mkdtemp(prefix="sluice-bench-timers-")
    marks = os.path.join(log_dir, "marks")
    os.mkdir(marks)
    os.environ[DIR_ENV] = marks
    os.environ[PARAMS_ENV] = json.dumps(params)
    cluster = LocalCluster(workers=2, slots=2, log_dir=log_dir, state_dir=os.path.join(log_dir, "state"))
    with logs_kept_on_failure(cluster, log_dir):
        cluster.start()
        result = summarise(asyncio.run(_run_job(cluster, mode, interval_s, marks)))
    return result


def fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--timers", type=int, default=100_000, help="timers due at once (default 100,000)")
    parser.add_argument("--rate", type=float, default=50_000, help="source records/s (default 50,000)")
    parser.add_argument("--after-s", type=float, default=4.0, help="source time after the storm (default 4 s)")
    parser.add_argument("--cost-us", type=float, default=0.0, help="busy-wait per timer (default 0)")
    parser.add_argument("--interval", type=float, default=0.25, help="checkpoint interval (default 0.25 s)")
    parser.add_argument("--modes", default="unaligned,aligned", help="checkpoint modes (default unaligned,aligned)")
    parser.add_argument("--repeat", type=int, default=1, help="runs per mode (default 1)")
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of text")
    args = parser.parse_args(argv)
    params = {"timers": args.timers, "rate": args.rate, "after_s": args.after_s, "cost_us": args.cost_us}
    results: dict[str, list[dict[str, Any]]] = {}
    for _ in range(args.repeat):
        for mode in args.modes.split(","):
            r = run_one(mode, args.interval, params)
            results.setdefault(mode, []).append(r)
            if not args.json:
                print(f"{mode:>10}: storm of {args.timers:,} timers {r['storm_s']:.2f} s; checkpoints during it "
                      f"{len(r['during'])}, median {fmt(r['during_median_s'])} s, max {fmt(r['during_max_s'])} s; "
                      f"before it {len(r['before'])}, median {fmt(r['before_median_s'])} s; failed {r['failed']}",
                      flush=True)
    if args.json:
        print(json.dumps({"benchmark": "timers", "params": params, "interval_s": args.interval,
                          "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
