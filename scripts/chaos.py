"""The full chaos run: 2 M rows, 3 workers, kill -9 three times, Spark verifies; repeated.

    .venv/bin/python scripts/chaos.py [--runs 5] [--rows 2000000] [--mode unaligned|aligned_timeout]
    .venv/bin/python scripts/chaos.py --kills 0 --link-cuts 2 [--link-timeout 2]   # as root: cut links
    .venv/bin/python scripts/chaos.py --kills 0 --coordinator-kills 2   # kill -9 the coordinator: a new one recovers
    .venv/bin/python scripts/chaos.py --rescales 3   # rescale to a random parallelism (seeded) between the kills
    .venv/bin/python scripts/chaos.py --wipes 1 --partition 30   # wipe the checkpoint store before a kill; cut a
        # worker off from the others for 30 s (network namespaces: root), meeting the default restart strategy
    .venv/bin/python scripts/chaos.py --window-ms 500 --jitter-ms 400 --max-delay-ms 150 --allowed-lateness-ms 100
        # the windowed count over out-of-order input (one source subtask); Spark verifies windows and late records

Prints each run's figures and a summary (medians of checkpoint and restart times); exits 1 if any run's
output was not exact.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from typing import Any

from runtime.cli.chaos import ChaosSettings, run_chaos


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def print_link_cuts(cuts: list[dict[str, Any]], detections: list[float]) -> None:
    for cut in cuts:
        detected = cut.get("detected_s")
        if detected is not None:
            detections.append(detected)
        print(f"    link cut {'<->'.join(cut['workers'])} at {cut['at_s']:.1f}s: "
              + (f"detected after {detected:.2f}s" if detected is not None else "NOT detected")
              + f", healed after {cut['cut_for_s']:.2f}s", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--keys", type=int, default=1000)
    parser.add_argument("--kills", type=int, default=3)
    parser.add_argument("--mode", choices=["unaligned", "aligned_timeout"], default="unaligned")
    parser.add_argument("--sink-delay", type=float, default=0.00002, help="seconds per record in the sink")
    parser.add_argument("--workdir", default=None, help="keeps the generated input between invocations")
    parser.add_argument("--link-cuts", type=int, default=0,
                        help="cut this many worker-to-worker links per run (workers in network namespaces; root)")
    parser.add_argument("--link-timeout", type=float, default=2.0, help="the workers' --link-timeout in seconds")
    parser.add_argument("--coordinator-kills", type=int, default=0,
                        help="SIGKILL the coordinator this many times per run; a new one recovers the job")
    parser.add_argument("--rescales", type=int, default=0,
                        help="rescale the running job this many times per run, between the kills, to a random "
                             "parallelism (1 to 4, seeded by the run)")
    parser.add_argument("--wipes", type=int, default=0,
                        help="delete the job's checkpoint directory this many times per run, each before a kill")
    parser.add_argument("--partition", type=float, default=0.0, metavar="SECONDS",
                        help="> 0: once per run, cut a worker hosting the job off from every other worker this "
                             "long (network namespaces; root); the job uses the default restart strategy")
    parser.add_argument("--window-ms", type=int, default=0,
                        help="> 0: run the tumbling windowed count (runtime/examples/windowcount.py) instead")
    parser.add_argument("--jitter-ms", type=int, default=0, help="input event times out of order by up to this")
    parser.add_argument("--max-delay-ms", type=int, default=0, help="the source's bounded out-of-orderness")
    parser.add_argument("--allowed-lateness-ms", type=int, default=0, help="the windows' allowed lateness")
    args = parser.parse_args()
    workdir = args.workdir or tempfile.mkdtemp(prefix="sluice-chaos-")
    failures = 0
    all_checkpoints: list[float] = []
    all_restarts: list[float] = []
    all_detections: list[float] = []
    all_rescales: list[float] = []
    for run in range(1, args.runs + 1):
        settings = ChaosSettings(workdir=workdir, rows=args.rows, keys=args.keys, mode=args.mode, kills=args.kills,
                                 sink_delay_s=args.sink_delay, link_cuts=args.link_cuts,
                                 link_timeout_s=args.link_timeout, coordinator_kills=args.coordinator_kills,
                                 rescales=args.rescales, wipes=args.wipes, partition_s=args.partition,
                                 window_ms=args.window_ms, jitter_ms=args.jitter_ms,
                                 max_delay_ms=args.max_delay_ms, allowed_lateness_ms=args.allowed_lateness_ms)
        print(f"run {run}/{args.runs}: {args.rows:,} rows, {args.mode}, {args.kills} kills, "
              f"{args.link_cuts} link cuts, {args.coordinator_kills} coordinator kills, {args.rescales} rescales",
              flush=True)
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
        print_link_cuts(result.link_cuts, all_detections)
        for w in result.wipes:
            print(f"    wiped the checkpoint store at {w['at_s']:.1f}s ({len(w['deleted'])} entries)", flush=True)
        for cut in result.partitions:
            print(f"    partition of {cut['worker']} at {cut['at_s']:.1f}s for {cut['duration_s']:g}s: "
                  f"{cut['restarts_during']} restarts meanwhile", flush=True)
        all_rescales += [r["downtime_s"] for r in result.rescales]
        if args.rescales:
            shapes = " ".join(f"{r['from']}->{r['to']} ({r['downtime_s']:.2f}s down)" for r in result.rescales)
            print(f"    rescales {shapes}; {result.rescales_refused} refused and tried again", flush=True)
    print(f"summary: {args.runs - failures}/{args.runs} runs exact; checkpoint median "
          f"{median(all_checkpoints) * 1000:.0f} ms over {len(all_checkpoints)}; restart median "
          f"{median(all_restarts):.2f}s, max {max(all_restarts or [0]):.2f}s over {len(all_restarts)}")
    if args.rescales:
        print(f"rescales: {len(all_rescales)} done, downtime median {median(all_rescales):.2f}s, "
              f"max {max(all_rescales or [0]):.2f}s")
    if args.link_cuts:
        print(f"link cuts: {len(all_detections)} detected, detection median {median(all_detections):.2f}s, "
              f"max {max(all_detections or [0]):.2f}s (link timeout {args.link_timeout}s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
