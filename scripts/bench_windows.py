#!/usr/bin/env python
"""Window benchmark: throughput of windowed counts against the keyed count, on the same event-time input.

Jobs (runtime/examples/windowcount.py, on a fresh local cluster of a coordinator and 2 workers with 2 slots
each, per run): GeneratorSource (parallelism 2, 1000 keys, in bursts by default (--keys; a function of seq,
runtime/connectors/generator.py: 100 keys at a time for 1 s of event time, each key every 100 ms) or drawn
uniformly, watermarks with max_delay = --jitter-ms, granularity 10 ms) -> key_by -> one of
- keyed: the event-time keyed count (a KeyedProcessFunction with one value state), the baseline;
- tumbling: TumblingEventTimeWindows(10 s).count() (event time advances 1 ms per record: with 1000 keys about
  ten records per window, so a tenth as many rows out as the keyed count);
- sliding: SlidingEventTimeWindows(60 s, 10 s).count(): every record is in six windows;
- session: EventTimeSessionWindows(1 s).count() (with keys in bursts every key's session closes once per 10 s,
  as many rows as the tumbling job);
each into a chained DiscardSink, parallelism 2. The jobs run alternating, --repeat times each.
With --flink-python PYTHON (a Python with PyFlink 2.x, or the env var SLUICE_FLINK_PYTHON), for each window job
the job `flink-<kind>` joins the rotation: the same window on Apache Flink (scripts/flink_windows_job.py, Flink
SQL inside the JVM, TUMBLE / HOP / SESSION; --flink-records larger than --records amortises its start), and
each Sluice window job's ratios are given against the medians of its Flink kind. Before the rounds each Flink
kind runs once into files at each input size to count its rows: with keys in bursts both engines count the very
same records, and a Sluice run whose rows out differ from Flink's stops the benchmark.

Time is accounted alike on both sides, three ways (records / seconds each):
- with start-up: from asking for the job until it ended, everything the system needs on the way. Sluice: the
  local cluster's start (its processes, until the workers registered) plus the coordinator's submit -> FINISHED
  (planning, deploying, running, the tasks' final reports). Flink: scripts/flink_windows_job.py's submit-to-end
  (the INSERT's execute_sql until its result: planning, the local mini cluster's start, deploying, running). Each
  side's interpreter or JVM is up before (Sluice's worker processes are counted: a little against Sluice);
- without start-up: the same time less the job's fixed cost, s0 in T = s0 + records / rate, fitted from the
  medians of the same measurement at two input sizes (--startup-records, a small run of each job every round,
  default 20,000; `startup_s`): the median of these rates is the marginal rate between the two sizes;
- as measured before (kept so the figures in docs/BENCHMARKS.md compare): Sluice's longest task's busy + idle +
  backpressured time (the tasks' lifetime, after deployment; scripts/bench_throughput.py measures it so) and
  Flink's net run time (JobExecutionResult: from the job's start, so with its tasks' deployment).
Ratios are windowed / keyed medians, and Sluice / Flink on the same measure.

    .venv/bin/python scripts/bench_windows.py --records 2000000 --repeat 3
    .venv/bin/python scripts/bench_windows.py --jobs tumbling,keyed --repeat 5 --flink-python FLINK_VENV/bin/python
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

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from runtime.cli.local_cluster import LocalCluster, run_job_on_cluster  # noqa: E402
from runtime.examples.windowcount import SESSION_GAP_MS  # noqa: E402

JOBS = {"keyed": "runtime.examples.windowcount:build_bench_keyed",
        "tumbling": "runtime.examples.windowcount:build_bench_tumbling",
        "sliding": "runtime.examples.windowcount:build_bench_sliding",
        "session": "runtime.examples.windowcount:build_bench_session"}
WINDOW_KINDS = ("tumbling", "sliding", "session")  # the jobs with a Flink counterpart, `flink-<kind>`


def workers_cpu_s(cluster: LocalCluster) -> float:
    """The worker processes' CPU time so far (user + system, from /proc): with the records, CPU per record,
    which a busy machine moves far less than records/s."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for w in cluster.worker_procs:
        with open(f"/proc/{w.pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
        total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime
    return total


def startup_s(records: int, seconds: list[float], small_records: int, small_seconds: list[float]) -> float | None:
    """A job's fixed cost: s0 in T = s0 + records / rate, through the medians of T at two input sizes (None
    when they do not give a positive rate: the small input as large, or its runs as slow as the large ones'). The
    figure is the fit's, not clamped: a negative s0 says the two sizes' runs saw different machines."""
    if records <= small_records or not seconds or not small_seconds:
        return None
    big, small = statistics.median(seconds), statistics.median(small_seconds)
    if big <= small:
        return None
    rate = (records - small_records) / (big - small)
    return small - small_records / rate


def rate_summary(rates: list[float]) -> dict[str, float] | None:
    return {"median": statistics.median(rates), "slowest": min(rates)} if rates else None


def accounting(records: int, with_startup_s: list[float], small_records: int,
               small_with_startup_s: list[float]) -> dict[str, Any]:
    """Records/s with start-up (records / each run's time) and without (records / (time - s0), s0 from
    `startup_s`), the median and the slowest of each (see the module docstring)."""
    s0 = startup_s(records, with_startup_s, small_records, small_with_startup_s)
    without = [] if s0 is None else [records / (t - s0) for t in with_startup_s if t > s0]
    return {"startup_s": s0, "with_startup": rate_summary([records / t for t in with_startup_s]),
            "without_startup": rate_summary(without)}


async def _run(cluster: LocalCluster, entry: str, timeout_s: float, started: float) -> dict[str, Any]:
    await cluster.wait_workers()
    cluster_start_s = time.monotonic() - started
    cpu0 = workers_cpu_s(cluster)
    summary = await run_job_on_cluster(cluster, entry, config={}, name="bench-windows", progress=None,
                                       timeout_s=timeout_s)
    if summary["state"] != "FINISHED":
        raise RuntimeError(f"{entry} ended {summary['state']}: {summary.get('error', '')}")
    submit_to_end_s = summary["ended_at"] - summary["submitted_at"]  # the coordinator's clock
    deadline = time.monotonic() + 10.0  # final task statistics arrive with the last heartbeats
    while not (len(summary["tasks"]) == summary["tasks_total"]
               and all(t["state"] == "finished" for t in summary["tasks"])):
        if time.monotonic() > deadline:
            raise RuntimeError("final task statistics did not arrive within 10 s")
        await asyncio.sleep(0.2)
        summary = await cluster.call("status", {"job_id": summary["job_id"]})
    wall_s = max(t["busy_s"] + t["idle_s"] + t["backpressured_s"] for t in summary["tasks"])
    if os.environ.get("SLUICE_BENCH_TASK_TIMES"):
        for t in summary["tasks"]:
            print(f"  {t['name'][:30]:>30} busy {t['busy_s']:.2f} idle {t['idle_s']:.2f} "
                  f"backpressured {t['backpressured_s']:.2f}", flush=True)
    out = sum(t["records_out"] for t in summary["tasks"] if "Discard" in t["name"])
    return {"wall_s": wall_s, "rows_out": out, "cpu_s": workers_cpu_s(cluster) - cpu0,
            "cluster_start_s": cluster_start_s, "submit_to_end_s": submit_to_end_s,
            "with_startup_s": cluster_start_s + submit_to_end_s}


def run_one(entry: str, records: int, jitter_ms: int, timeout_s: float, grain: str = "10",
            keys: str = "bursts") -> dict[str, Any]:
    """One run; `grain` is a granularity in ms (a watermark after each record that moves it) or `pN`
    (periodic watermarks every N ms of wall-clock time, granularity 1 ms); `keys` the generator's distribution."""
    os.environ["SLUICE_BENCH_RECORDS"] = str(records)  # inherited by the cluster's processes
    os.environ["SLUICE_BENCH_KEYS"] = keys
    os.environ["SLUICE_BENCH_JITTER_MS"] = str(jitter_ms)
    periodic = grain.startswith("p")
    os.environ["SLUICE_BENCH_GRAIN_MS"] = "1" if periodic else grain
    os.environ["SLUICE_BENCH_WATERMARK_INTERVAL_MS"] = grain[1:] if periodic else ""
    log_dir = tempfile.mkdtemp(prefix="sluice-bench-windows-")
    cluster = LocalCluster(workers=2, slots=2, log_dir=log_dir)
    from bench_throughput import logs_kept_on_failure  # same directory

    with logs_kept_on_failure(cluster, log_dir):
        started = time.monotonic()
        cluster.start()
        result = asyncio.run(_run(cluster, entry, timeout_s, started))
    result["records"] = records
    result["records_per_s"] = records / result["wall_s"]
    result["cpu_us_per_record"] = result["cpu_s"] / records * 1e6
    return result


def run_flink(python: str, records: int, timeout_s: float, interval_ms: int | None = None, *,
              window: str = "tumbling", keys: str = "bursts", count_rows: bool = False) -> dict[str, Any]:
    """The `window` job on Flink in a process of its own (its mini cluster starts and stops with it);
    `count_rows`: into files, with the rows counted (`rows_out`), for the check, not for timing."""
    script = os.path.join(ROOT, "scripts", "flink_windows_job.py")
    extra = [] if interval_ms is None else ["--watermark-interval-ms", str(interval_ms)]
    extra += ["--count-rows"] if count_rows else []
    done = subprocess.run([python, script, "--records", str(records), "--window", window, "--keys", keys,
                           "--session-gap-ms", str(SESSION_GAP_MS), *extra],
                          capture_output=True, text=True, timeout=timeout_s, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"the Flink job failed (exit {done.returncode}): {done.stderr[-2000:]}")
    doc = json.loads(lines[-1])
    return {"records": records, "wall_s": doc["net_runtime_s"], "rows_out": doc.get("rows_out"),
            "records_per_s": doc["records_per_s"], "with_startup_s": doc["submit_to_end_s"]}


def check_rows(name: str, run: dict[str, Any], expected: dict[int, int]) -> None:
    """Fail loudly when a Sluice window run's rows out differ from what Flink's job emitted on the same input."""
    want = expected.get(run["records"])
    if want is not None and run["rows_out"] != want:
        raise SystemExit(f"{name}: {run['rows_out']:,} rows out over {run['records']:,} records, Flink emitted "
                         f"{want:,} on the same input: the engines disagree")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=2_000_000, help="records per run (default 2,000,000)")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each job, alternating (default 3)")
    parser.add_argument("--jitter-ms", type=int, default=0, help="out-of-order event times (default 0)")
    parser.add_argument("--jobs", default=",".join(JOBS), help=f"which jobs (default {','.join(JOBS)})")
    parser.add_argument("--timeout", type=float, default=600.0, help="give up on a job after this many s")
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of text")
    parser.add_argument("--flink-python", default=os.environ.get("SLUICE_FLINK_PYTHON"),
                        help="a Python with PyFlink: adds the Flink job of each window job's kind to the rotation")
    parser.add_argument("--flink-records", type=int, default=None,
                        help="records of the Flink job (default --records; more amortise its job start-up)")
    parser.add_argument("--startup-records", type=int, default=20_000,
                        help="records of each job's small run every round, whose time gives the job's fixed cost "
                             "(the figures without start-up); 0: no small runs, no figures without start-up")
    parser.add_argument("--grain-ms", default="10",
                        help="event time between two watermarks of a source subtask (granularity_ms; default 10), "
                             "or pN: periodic watermarks every N ms of wall-clock time (p200 is Flink's default); "
                             "a comma-separated list runs each Sluice job once per grain, named job@grain")
    parser.add_argument("--keys", choices=("bursts", "uniform"), default="bursts",
                        help="the generator's keys: bursts (a function of seq, the same records on Flink's side; "
                             "the default) or uniform (drawn at random: each engine its own draw, no row check)")
    parser.add_argument("--flink-watermark-interval-ms", type=int, default=None,
                        help="Flink's periodic watermark interval (pipeline.auto-watermark-interval; its default "
                             "200 ms of wall-clock time)")
    args = parser.parse_args(argv)
    names = args.jobs.split(",")
    unknown = [n for n in names if n not in JOBS]
    if unknown:
        parser.error(f"unknown --jobs {unknown}; known: {', '.join(JOBS)}")
    grains = [g.strip() for g in args.grain_ms.split(",")]
    bad = [g for g in grains if not (g[1:] if g.startswith("p") else g).isdecimal()]
    if bad:
        parser.error(f"--grain-ms takes integers or pN, got {bad}")
    if args.startup_records < 0 or args.startup_records >= min(args.records, args.flink_records or args.records):
        parser.error("--startup-records must be >= 0 and below --records (and --flink-records)")
    flink_kinds = [k for k in WINDOW_KINDS if k in names] if args.flink_python else []
    if len(grains) > 1:
        names = [f"{n}@{g}" for n in names for g in grains]
    names += [f"flink-{k}" for k in flink_kinds]

    def run(name: str, records: int) -> dict[str, Any]:
        if name.startswith("flink-"):
            return run_flink(args.flink_python, records, args.timeout, args.flink_watermark_interval_ms,
                             window=name.removeprefix("flink-"), keys=args.keys)
        job, _, grain = name.partition("@")
        return run_one(JOBS[job], records, args.jitter_ms, args.timeout, grain or grains[0], args.keys)

    # Flink's rows at Sluice's input sizes, counted once per kind before the rounds (keys in bursts: the same
    # records on both sides, so the same rows; uniform keys are each engine's own draw, nothing to compare)
    flink_rows: dict[str, dict[int, int]] = {}
    if args.keys == "bursts" and args.jitter_ms == 0:
        for kind in flink_kinds:
            sizes = [args.records] + ([args.startup_records] if args.startup_records else [])
            flink_rows[kind] = {n: run_flink(args.flink_python, n, args.timeout, window=kind, keys=args.keys,
                                             count_rows=True)["rows_out"] for n in sizes}
            if not args.json:
                print(f"flink-{kind} rows out (counted into files): "
                      + ", ".join(f"{rows:,} of {n:,} records" for n, rows in flink_rows[kind].items()), flush=True)

    runs: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    small_runs: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    for _ in range(args.repeat):
        for name in names:
            flink = name.startswith("flink-")
            r = run(name, args.flink_records or args.records if flink else args.records)
            runs[name].append(r)
            if args.startup_records:  # right after the large run: the most similar machine
                small_runs[name].append(run(name, args.startup_records))
            if not flink:
                for checked in [r, *small_runs[name][-1:]]:
                    check_rows(name, checked, flink_rows.get(name.partition("@")[0], {}))
            if not args.json:
                rows = "" if r["rows_out"] is None else f", {r['rows_out']:,} rows out"
                if "cpu_us_per_record" in r:
                    rows += f", workers' CPU {r['cpu_us_per_record']:.2f} us per record"
                small = (f"; {args.startup_records:,} records: {small_runs[name][-1]['with_startup_s']:.2f} s"
                         if args.startup_records else "")
                rows += f", load {os.getloadavg()[0]:.1f}"
                print(f"{name:>14}: {r['records_per_s']:>10,.0f} records/s ({r['wall_s']:.2f} s{rows}); "
                      f"with start-up {r['with_startup_s']:.2f} s{small}", flush=True)
    medians = {n: statistics.median(r["records_per_s"] for r in rs) for n, rs in runs.items()}
    slowest = {n: min(r["records_per_s"] for r in rs) for n, rs in runs.items()}
    accounts = {n: accounting(rs[0]["records"], [r["with_startup_s"] for r in rs], args.startup_records,
                              [r["with_startup_s"] for r in small_runs[n]]) for n, rs in runs.items()}
    if args.json:
        print(json.dumps({"benchmark": "windows", "records": args.records, "jitter_ms": args.jitter_ms,
                          "startup_records": args.startup_records, "runs": runs, "small_runs": small_runs,
                          "median_records_per_s": medians, "slowest_records_per_s": slowest,
                          "accounting": accounts}, indent=2))
        return 0
    for name, m in medians.items():
        job, at, grain = name.partition("@")
        flink_name = f"flink-{job}"  # the Flink job of this window kind, when it ran
        base = medians.get(f"keyed{at}{grain}")  # the keyed count at the same grain
        ratio = f"  {m / base:.2f}x the keyed count" if base and job in WINDOW_KINDS else ""
        if flink_name in medians:
            ratio += f"  {m / medians[flink_name]:.2f}x Flink's net run time"
        measure = "net run time" if job.startswith("flink-") else "tasks' lifetime"
        print(f"median {name:>14}: {m:>10,.0f} records/s over its {measure} (slowest {slowest[name]:,.0f}){ratio}")
    for name, acc in accounts.items():
        flink = accounts.get(f"flink-{name.partition('@')[0]}")
        parts = []
        for key, label in (("with_startup", "with start-up"), ("without_startup", "without start-up")):
            figure = acc[key]
            if figure is None:
                parts.append(f"{label}: -")
                continue
            text = f"{label} {figure['median']:,.0f} records/s (slowest {figure['slowest']:,.0f})"
            theirs = flink[key] if flink else None
            if theirs:
                text += f" {figure['median'] / theirs['median']:.2f}x Flink"
            parts.append(text)
        s0 = "" if acc["startup_s"] is None else f"; start-up {acc['startup_s']:.2f} s"
        if not name.startswith("flink-"):  # the part a Flink run has before its clock starts (its JVM)
            s0 += f" (the cluster's start alone: {statistics.median(r['cluster_start_s'] for r in runs[name]):.2f} s)"
        print(f"{name:>14}: {'; '.join(parts)}{s0}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
