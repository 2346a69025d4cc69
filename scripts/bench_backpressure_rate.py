#!/usr/bin/env python
"""How steady a backpressured source's rate is: records/s per second over --seconds, source against sink.

An unbounded GeneratorSource (parallelism 1, 50 keys) -> key_by -> the keyed count -> a discard sink slowed
to --sink-delay-us per record (the throttle sleeps), on a fresh local cluster of a coordinator and 2 workers
(2 slots each). After --warmup s (default 10) the workers' Prometheus counters are read every second: the source's
`records_out` and the sink's, and the source's backpressured seconds. A source throttled only by its
sink should move at the sink's pace every second; the figures are the per-second rates' median, min, max and
coefficient of variation (stdev / mean), for each side, and how far the source ran ahead of the sink.

    .venv/bin/python scripts/bench_backpressure_rate.py --seconds 30
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from runtime.cli.local_cluster import LocalCluster  # noqa: E402
from tests.support.scrape import scrape  # noqa: E402

JOB = '''
import os
from runtime.api import DiscardSink, GeneratorSource, Job
from runtime.examples.wordcount import Count


def build(job: Job) -> None:
    delay = float(os.environ["SLUICE_BENCH_SINK_DELAY_S"])
    (job.source(GeneratorSource(count=None, keys=50, seed=3), parallelism=1, name="source")
        .key_by(lambda r: r[0])
        .process(Count(), parallelism=1)
        .sink(DiscardSink(delay_per_record_s=delay)))
'''


def counters(cluster: LocalCluster) -> dict[str, float]:
    metrics: dict[str, float] = {}
    for w in cluster.worker_procs:
        metrics.update(scrape(w.fields["metrics"]))

    def total(name: str, task: str) -> float:
        return sum(v for k, v in metrics.items() if k.startswith(name + "{") and f'task="{task}' in k)

    return {"at": time.monotonic(),
            "source": total("sluice_task_records_out_total", "source"),
            "sink": total("sluice_task_records_out_total", "Count"),
            "source_bp": total("sluice_task_backpressured_seconds_total", "source")}


def summary(rates: list[float]) -> dict[str, float]:
    mean = statistics.fmean(rates)
    return {"median": statistics.median(rates), "min": min(rates), "max": max(rates),
            "cv": statistics.pstdev(rates) / mean if mean else 0.0}


async def measure(cluster: LocalCluster, workdir: str, config: dict[str, Any], warmup_s: float,
                  seconds: int) -> dict[str, Any]:
    await cluster.wait_workers()
    submitted = await cluster.call("submit", {"entry": "ratejob:build", "name": "bench-rate", "config": config,
                                              "sys_path": workdir})
    job_id = submitted["job_id"]
    deadline = time.monotonic() + 60
    while counters(cluster)["sink"] == 0:
        if time.monotonic() > deadline:
            raise RuntimeError("the job produced nothing within 60 s")
        await asyncio.sleep(0.2)
    await asyncio.sleep(warmup_s)
    samples = [counters(cluster)]
    while len(samples) <= seconds:
        await asyncio.sleep(max(0.0, samples[0]["at"] + len(samples) - time.monotonic()))
        samples.append(counters(cluster))
    await cluster.call("cancel", {"job_id": job_id})
    per_s: dict[str, list[float]] = {"source": [], "sink": [], "source_bp": []}
    for a, b in zip(samples, samples[1:], strict=False):
        dt = b["at"] - a["at"]
        for name in per_s:
            per_s[name].append((b[name] - a[name]) / dt)
    ahead = [s["source"] - s["sink"] for s in samples]
    return {"per_second": per_s, "source": summary(per_s["source"]), "sink": summary(per_s["sink"]),
            "source_backpressured": statistics.fmean(per_s["source_bp"]),
            "source_ahead_records": {"min": min(ahead), "max": max(ahead)}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=int, default=30)
    parser.add_argument("--warmup", type=float, default=10.0, help="s before measuring (default 10)")
    parser.add_argument("--sink-delay-us", type=float, default=200.0, help="sink time per record (default 200)")
    parser.add_argument("--config", default="{}", help="job config as JSON (e.g. buffer_bytes)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    workdir = tempfile.mkdtemp(prefix="sluice-bench-rate-")
    with open(os.path.join(workdir, "ratejob.py"), "w", encoding="utf-8") as f:
        f.write(JOB)
    os.environ["SLUICE_BENCH_SINK_DELAY_S"] = str(args.sink_delay_us / 1e6)
    cluster = LocalCluster(workers=2, slots=2, log_dir=os.path.join(workdir, "logs"), workdir=workdir)
    try:
        cluster.start()
        result = asyncio.run(measure(cluster, workdir, json.loads(args.config), args.warmup, args.seconds))
    finally:
        cluster.stop()
    shutil.rmtree(workdir, ignore_errors=True)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print("per second, source:", " ".join(f"{r:.0f}" for r in result["per_second"]["source"]))
    print("per second, sink:  ", " ".join(f"{r:.0f}" for r in result["per_second"]["sink"]))
    for side in ("source", "sink"):
        s = result[side]
        print(f"{side:>6}: median {s['median']:,.0f}/s, min {s['min']:,.0f}, max {s['max']:,.0f}, cv {s['cv']:.2f}")
    print(f"source backpressured {result['source_backpressured']:.2f} s/s; source ahead of the sink by "
          f"{result['source_ahead_records']['min']:,.0f} to {result['source_ahead_records']['max']:,.0f} records")
    return 0


if __name__ == "__main__":
    sys.exit(main())
