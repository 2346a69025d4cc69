#!/usr/bin/env python
"""Autoscaler cost benchmark (issue 32): what one tick of the load autoscaler costs the coordinator's event loop
for a large job, in process (no cluster: the tick is pure Python over the job record).

A job of --vertices task types (a GeneratorSource, maps, a DiscardSink joined by rebalances) at --parallelism
each is planned on enough 10-slot workers; every 0.5 s of simulated time each task reports counters as a
heartbeat would (through `rest_views.task_sample`, as the coordinator does), then `LoadScaler.tick` samples
the job and evaluates a window of --window seconds (no stabilisation), which is what the job manager does
every half second for a job whose config enables the autoscaler. Every vertex takes the 100 records/s per
subtask its source is asked for; with `--case idle` (the default) half of them are within the band (busy
60 %), the other half idle on average but busy for 6 s of every 30 (so each evaluation reads every sample of
the window for them, the costliest case, and decides nothing); with `--case band` every vertex is within the
band. Prints the median and slowest tick over the last --window seconds, and where the
time goes.

    .venv/bin/python scripts/bench_autoscaler.py --vertices 100 --parallelism 10 --window 30 [--case band]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from coordinator import load_policy  # noqa: E402
from coordinator.jobs import JobRecord  # noqa: E402
from coordinator.load_scaler import LoadScaler, load_graph, sample_of  # noqa: E402
from coordinator.rest_views import task_sample  # noqa: E402
from coordinator.scheduler import WorkerSlots, make_plan  # noqa: E402
from runtime.api import DiscardSink, GeneratorSource, Job  # noqa: E402
from runtime.graph.enums import JobState  # noqa: E402
from runtime.graph.job_config import AutoscalerConfig, JobConfig  # noqa: E402

STEP_S = 0.5


def build(vertices: int, parallelism: int) -> Job:
    job = Job("bench")
    stream = job.source(GeneratorSource(count=None, keys=10, seed=1, records_per_second=100.0 * parallelism),
                        parallelism=parallelism)
    for i in range(vertices - 2):
        stream = stream.rebalance().map(lambda r: r, parallelism=parallelism, name=f"m{i}")
    stream.rebalance().sink(DiscardSink(), parallelism=parallelism)
    return job


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vertices", type=int, default=100)
    parser.add_argument("--parallelism", type=int, default=10)
    parser.add_argument("--window", type=float, default=30.0)
    parser.add_argument("--case", choices=("idle", "band"), default="idle")
    args = parser.parse_args()
    built = build(args.vertices, args.parallelism)
    config = JobConfig(autoscaler=AutoscalerConfig(enabled=True, window_s=args.window, stabilization_s=0.0))
    workers = [WorkerSlots(f"w{i}", 10, "127.0.0.1", 1) for i in range(-(-args.parallelism // 10))]
    plan = make_plan(job_id="bench", attempt=1, entry="bench:build", name="bench", sys_path="", config=config,
                     job=built, workers=workers, channel_base=1)
    job = JobRecord("bench", "bench:build", "bench", "", config, state=JobState.RUNNING, attempt=1, plan=plan)
    now = [0.0]
    scaler = LoadScaler(graph_of=lambda j: load_graph(plan, built), slots=lambda: 10 * len(workers),
                        rescale=lambda j, requested: _never(), spawn=lambda aw, name: None, clock=lambda: now[0])
    tasks = [(v.id, f"bench/{v.id}:{i}") for v in plan.vertices for i in range(v.parallelism)]
    busy_s = {key: 0.0 for _, key in tasks}
    ticks = []
    steps = int(2 * args.window / STEP_S)
    for step in range(1, steps + 1):
        now[0] = step * STEP_S
        for vertex, key in tasks:
            if vertex % 2 or args.case == "band":
                busy_s[key] += STEP_S * 0.6
            else:
                busy_s[key] += STEP_S * (1.0 if now[0] % 30 < 6 else 0.05)
            report = {"task": key, "records_in": 100 * now[0], "records_out": 100 * now[0], "busy_s": busy_s[key],
                      "idle_s": now[0] - busy_s[key], "backpressured_s": 0.0, "measured_at": now[0]}
            job.task_stats[key] = task_sample(job.task_stats.get(key), report, now[0])
        started = time.perf_counter()
        scaler.tick(job)
        ticks.append(time.perf_counter() - started)
    state = job.load_scaling
    assert state is not None and state.evaluation is not None and not state.decisions, "a decision: see the docstring"
    steady = ticks[len(ticks) // 2:]
    graph = load_graph(plan, built)
    parts = {"sample (sample_of, measured)": lambda: load_policy.measured(graph, sample_of(job, now[0])),
             "load_graph": lambda: load_graph(plan, built),
             "evaluate": lambda: load_policy.evaluate(graph, state.samples, settings=config.autoscaler,
                                                      started_at=0.0, now=now[0], slots=10 * len(workers))}
    print(f"{args.case}: {len(plan.vertices)} vertices, {len(tasks)} tasks, window {args.window:g}s: "
          f"{len(state.samples)} samples, "
          f"{state.evaluation.status}, {len(state.decisions)} decisions")
    print(f"tick: median {statistics.median(steady) * 1e3:.1f} ms, slowest {max(steady) * 1e3:.1f} ms "
          f"(every {STEP_S} s: {statistics.median(steady) / STEP_S:.1%} of a core)")
    for name, part in parts.items():
        started = time.perf_counter()
        for _ in range(20):
            part()
        print(f"  {name}: {(time.perf_counter() - started) / 20 * 1e3:.1f} ms")
    return 0


async def _never() -> None:
    raise AssertionError("the benchmark's job is never rescaled: its window restarts at every decision")


if __name__ == "__main__":
    raise SystemExit(main())
