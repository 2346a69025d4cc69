#!/usr/bin/env python
"""A/B of CPU per record between two source trees, in alternating rounds, with paired ratios.

Each round runs one benchmark job on a fresh local cluster from tree A and from tree B (the order reversed every
other round, so a drift of the machine's load hits both alike), each run from its tree's directory with the tree
first on PYTHONPATH: the cluster's processes start as `python -m runtime.cli`, so the directory they start in
comes first on their path (before this fix every run's cluster ran the code of the directory bench_ab was started
from, whichever tree was named). A tree is a checkout or an export (`git archive REV | tar -x -C DIR`) sharing
this interpreter. Per run it reads the workers' (keyed: all processes') CPU per record and the rows out; per
round the ratio B/A of CPU per record (the runs of a round saw the most similar machine). It prints the medians,
the slowest runs and the median of the paired ratios, and fails if the two trees' outputs differ.

    .venv/bin/python scripts/bench_ab.py --a BEFORE_DIR --b . --job keyed --records 2000000 --rounds 6
    .venv/bin/python scripts/bench_ab.py --a BEFORE_DIR --b . --job tumbling --records 2000000 --rounds 6

`keyed` is scripts/bench_throughput.py's keyed count (CPU of the coordinator, the workers and the driver, and the
one-process loop beside it each run); `tumbling`, `sliding` and `session` are scripts/bench_windows.py's window
jobs (the workers' CPU), at Flink's watermark cadence by default (`--grain-ms p200`) or at another grain
(`--grain-ms 10`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def command(tree: str, job: str, records: int, grain: str = "p200") -> list[str]:
    if job == "keyed":
        return [sys.executable, os.path.join(tree, "scripts", "bench_throughput.py"), "--records", str(records),
                "--repeat", "1", "--json"]
    return [sys.executable, os.path.join(tree, "scripts", "bench_windows.py"), "--jobs", job,
            "--grain-ms", grain, "--records", str(records), "--repeat", "1", "--json"]


def measure(tree: str, job: str, records: int, timeout_s: float, grain: str = "p200") -> dict[str, Any]:
    """One run of `job` from `tree`: CPU µs per record, records/s, rows out (and the loop's CPU for keyed)."""
    env = dict(os.environ, PYTHONPATH=os.path.abspath(tree))
    # run from the tree: the cluster's processes start as `python -m runtime.cli` from this directory, which goes
    # first on their path (and on the PYTHONPATH the local cluster gives them), ahead of the tree's
    done = subprocess.run(command(tree, job, records, grain), capture_output=True, text=True, env=env,
                          timeout=timeout_s, check=False, cwd=os.path.abspath(tree))
    if done.returncode != 0:
        raise RuntimeError(f"{tree}: exit {done.returncode}: {done.stderr[-2000:]}")
    doc = json.loads(done.stdout)
    if job == "keyed":
        run = doc["runtime_runs"][0]
        return {"cpu_us_per_record": run["cpu_us_per_record"], "records_per_s": run["records_per_s"],
                "rows_out": records, "loop_cpu_us_per_record": doc["baseline_runs"][0]["cpu_us_per_record"],
                "loop_records_per_s": doc["baseline_runs"][0]["records_per_s"]}
    run = doc["runs"][job][0]
    return {"cpu_us_per_record": run["cpu_us_per_record"], "records_per_s": run["records_per_s"],
            "rows_out": run["rows_out"]}


def measure_retrying(tree: str, job: str, records: int, timeout_s: float, grain: str, retries: int
                     ) -> dict[str, Any]:
    """`measure`, again after a failed run, up to `retries` times: on a loaded machine a run can fail for reasons
    of its own (a starved coordinator losing its lease); the failure is printed, never hidden."""
    for attempt in range(retries + 1):
        try:
            return measure(tree, job, records, timeout_s, grain)
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            if attempt == retries:
                raise
            print(f"{tree}: run failed, retrying: {str(exc).strip().splitlines()[-1]}", file=sys.stderr, flush=True)
    raise AssertionError("unreachable")


def paired_summary(a_runs: list[dict[str, Any]], b_runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians, slowest runs and the median of the rounds' B/A ratios of CPU per record (pure: unit-tested)."""
    def side(runs: list[dict[str, Any]]) -> dict[str, float]:
        cpu = [r["cpu_us_per_record"] for r in runs]
        rate = [r["records_per_s"] for r in runs]
        return {"cpu_us_per_record_median": statistics.median(cpu), "cpu_us_per_record_slowest": max(cpu),
                "records_per_s_median": statistics.median(rate), "records_per_s_slowest": min(rate)}

    ratios = [b["cpu_us_per_record"] / a["cpu_us_per_record"] for a, b in zip(a_runs, b_runs, strict=True)]
    return {"a": side(a_runs), "b": side(b_runs), "cpu_ratios_b_over_a": ratios,
            "cpu_ratio_b_over_a_median": statistics.median(ratios),
            "rounds_b_cheaper": sum(1 for r in ratios if r < 1.0)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--a", required=True, help="tree A (before)")
    parser.add_argument("--b", default=ROOT, help="tree B (after; default this checkout)")
    parser.add_argument("--job", choices=("keyed", "tumbling", "sliding", "session"), default="keyed")
    parser.add_argument("--grain-ms", default="p200",
                        help="a window job's watermark grain, as bench_windows.py takes it (default p200)")
    parser.add_argument("--records", type=int, default=2_000_000)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--timeout", type=float, default=900.0, help="give up on one run after this many s")
    parser.add_argument("--retries", type=int, default=1, help="runs again after a failed run (default 1)")
    parser.add_argument("--json", action="store_true", help="print one JSON document at the end")
    args = parser.parse_args(argv)
    runs: dict[str, list[dict[str, Any]]] = {"a": [], "b": []}
    for i in range(args.rounds):
        for name in ("a", "b") if i % 2 == 0 else ("b", "a"):
            load = os.getloadavg()[0]
            r = measure_retrying(getattr(args, name), args.job, args.records, args.timeout, args.grain_ms,
                                 args.retries)
            r["load_average_1m"] = load
            runs[name].append(r)
            loop = (f", loop {r['loop_cpu_us_per_record']:.2f} µs" if "loop_cpu_us_per_record" in r else "")
            print(f"round {i + 1} {name.upper()}: {r['cpu_us_per_record']:.3f} CPU µs/record, "
                  f"{r['records_per_s']:,.0f} records/s, {r['rows_out']:,} rows out{loop}; load {load:.1f}",
                  flush=True)
    outs = {r["rows_out"] for rs in runs.values() for r in rs}
    if len(outs) != 1:
        raise SystemExit(f"the trees' outputs differ: rows out {sorted(outs)}")
    summary = paired_summary(runs["a"], runs["b"])
    if args.json:
        print(json.dumps({"job": args.job, "grain_ms": args.grain_ms, "records": args.records, "summary": summary,
                          "runs": runs}, indent=2))
        return 0
    for name in ("a", "b"):
        s = summary[name]
        print(f"{name.upper()}: CPU µs/record median {s['cpu_us_per_record_median']:.3f} "
              f"(slowest {s['cpu_us_per_record_slowest']:.3f}); records/s median {s['records_per_s_median']:,.0f} "
              f"(slowest {s['records_per_s_slowest']:,.0f})")
    print(f"B/A CPU per record, median of the rounds' ratios: {summary['cpu_ratio_b_over_a_median']:.3f} "
          f"(B cheaper in {summary['rounds_b_cheaper']} of {args.rounds} rounds)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
