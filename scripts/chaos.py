"""The full chaos run: 2 M rows, 3 workers, kill -9 three times, Spark verifies; repeated.

    .venv/bin/python scripts/chaos.py [--runs 5] [--rows 2000000] [--mode unaligned|aligned_timeout]

Prints each run's figures and a summary (medians of checkpoint and restart times); exits 1 if any run's
output was not exact.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time

from runtime.cli.chaos import ChaosSettings, run_chaos


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--keys", type=int, default=1000)
    parser.add_argument("--kills", type=int, default=3)
    parser.add_argument("--mode", choices=["unaligned", "aligned_timeout"], default="unaligned")
    parser.add_argument("--sink-delay", type=float, default=0.00002, help="seconds per record in the sink")
    parser.add_argument("--workdir", default=None, help="keeps the generated input between invocations")
    args = parser.parse_args()
    workdir = args.workdir or tempfile.mkdtemp(prefix="sluice-chaos-")
    failures = 0
    all_checkpoints: list[float] = []
    all_restarts: list[float] = []
    for run in range(1, args.runs + 1):
        settings = ChaosSettings(workdir=workdir, rows=args.rows, keys=args.keys, mode=args.mode, kills=args.kills,
                                 sink_delay_s=args.sink_delay)
        print(f"run {run}/{args.runs}: {args.rows:,} rows, {args.mode}, {args.kills} kills", flush=True)
        t0 = time.monotonic()
        result = run_chaos(settings, log=lambda line: print(line, flush=True), seed=run)
        all_checkpoints += result.checkpoint_s
        all_restarts += result.restart_s
        ok = result.ok
        failures += not ok
        print(f"  {'OK' if ok else 'FAILED'} in {time.monotonic() - t0:.0f}s (job {result.job_s:.1f}s): "
              f"{result.restarts} restarts (median {median(result.restart_s):.2f}s), "
              f"{result.checkpoints_completed} checkpoints ok / {result.checkpoints_failed} failed, "
              f"median {median(result.checkpoint_s) * 1000:.0f} ms, "
              f"max {max(result.checkpoint_s or [0]) * 1000:.0f} ms; "
              f"{result.verify.get('summary') or result.error}", flush=True)
    print(f"summary: {args.runs - failures}/{args.runs} runs exact; checkpoint median "
          f"{median(all_checkpoints) * 1000:.0f} ms over {len(all_checkpoints)}; restart median "
          f"{median(all_restarts):.2f}s, max {max(all_restarts or [0]):.2f}s over {len(all_restarts)}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
