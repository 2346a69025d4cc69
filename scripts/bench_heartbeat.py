#!/usr/bin/env python
"""Heartbeat cost per task report, whole reports against changes only (issue 32), in one process.

A worker of --tasks tasks sends --beats heartbeats, one a second of its clock; between two, every task's clock
and time counters move (measured_at, busy_s, idle_s: they move whenever the task lives) and --moving of the
tasks also move records (records_in/out, bytes_in/out). Both ways are timed on the same reports:

- whole: the worker's reports as they are (what every heartbeat carried before);
- changes: runtime/worker/heartbeat_reports.py ReportDeltas (whole reports once, then the changed fields).

Worker side: building the entries and msgpack-encoding the Heartbeat. Coordinator side: msgpack-decoding it,
Heartbeat.from_wire (the checks), ReportMirror.apply (changes only: whole reports were used as they came) and
task_sample for every task (the rates the REST API shows), as coordinator/server.py rpc_heartbeat does. CPU
time (time.process_time), the median of --repeat runs, per task report; the bytes per heartbeat too. It also
checks that both ways leave the coordinator with the same task samples.

    .venv/bin/python scripts/bench_heartbeat.py --tasks 10 --beats 200 --repeat 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from dataclasses import asdict
from typing import Any

import msgpack

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from coordinator.heartbeat_reports import ReportMirror  # noqa: E402
from coordinator.rest_views import task_sample  # noqa: E402
from runtime.execution.task import TaskStatistics  # noqa: E402
from runtime.graph import protocol as p  # noqa: E402
from runtime.worker.heartbeat_reports import ReportDeltas  # noqa: E402


def reports_at(beat: int, tasks: int, moving: int) -> list[dict[str, Any]]:
    """The worker's task reports at heartbeat `beat` (runtime/worker/worker.py task_report's shape)."""
    out = []
    for t in range(tasks):
        records = beat * 20 if t < moving else 0
        stats = TaskStatistics(records_in=records, records_out=records, busy_s=beat * 0.01, idle_s=beat * 0.99,
                               backpressured_s=0.0, watermarks_in=0, measured_at=1000.0 + beat + t * 1e-5,
                               input_queue=0, output_queue=0, output_buffers_limit=2, output_pool_usage=0.0,
                               bytes_in=records * 40, bytes_out=records * 40, last_alignment_s=0.004,
                               last_start_delay_s=0.001, last_inflight_bytes=0, inflight_bytes_total=0)
        out.append({**asdict(stats), "job": "0123456789abcdef", "task": f"0123456789abcdef/{t % 2}:{t}",
                    "name": "Source: generator -> map" if t % 2 == 0 else "count -> sink: discard",
                    "state": "RUNNING", "attempt": 0, "connectors": []})
    return out


def run(tasks: int, beats: int, moving: int, changes_only: bool) -> tuple[float, float, float, dict[str, Any]]:
    """(worker CPU s, coordinator CPU s, bytes) over `beats` heartbeats, and the coordinator's last samples."""
    all_reports = [reports_at(b, tasks, moving) for b in range(beats)]
    deltas, mirror = ReportDeltas(), ReportMirror()
    stats: dict[str, Any] = {}
    worker_s = coordinator_s = 0.0
    nbytes = 0
    for b, reports in enumerate(all_reports):
        t0 = time.process_time()
        if changes_only:
            entries = deltas.entries(reports)
            beat = p.Heartbeat("w-1", entries.whole, changes=entries.changes)
        else:
            beat = p.Heartbeat("w-1", reports)
        wire = msgpack.packb(["heartbeat", beat.to_wire()])
        t1 = time.process_time()
        _, args = msgpack.unpackb(wire, raw=False, strict_map_key=False)
        got = p.Heartbeat.from_wire(args)
        # before: the reports as they came; now: rebuilt from the changes (coordinator/server.py rpc_heartbeat)
        whole = mirror.apply(got.tasks, got.changes).reports if changes_only else got.tasks
        for st in whole:
            stats[st["task"]] = task_sample(stats.get(st["task"]), {**st, "worker": "w-1"}, float(b))
        t2 = time.process_time()
        if changes_only:
            deltas.confirmed()
        worker_s += t1 - t0
        coordinator_s += t2 - t1
        nbytes += len(wire)
    return worker_s, coordinator_s, nbytes / beats, stats


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", type=int, default=10, help="tasks on the worker")
    ap.add_argument("--moving", type=int, default=None, help="tasks whose records move (default: all)")
    ap.add_argument("--beats", type=int, default=200)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    moving = args.tasks if args.moving is None else args.moving
    results: dict[str, list[tuple[float, float, float]]] = {"whole": [], "changes": []}
    last: dict[str, dict[str, Any]] = {}
    for _ in range(args.repeat):  # alternating, so both see the same machine
        for way in ("whole", "changes"):
            w, c, nbytes, stats = run(args.tasks, args.beats, moving, way == "changes")
            results[way].append((w, c, nbytes))
            last[way] = stats
    if last["whole"] != last["changes"]:
        print("MISMATCH: the coordinator's samples differ between the two ways", file=sys.stderr)
        return 1
    reports = args.tasks * args.beats
    print(f"{args.tasks} tasks ({moving} moving records), {args.beats} heartbeats, {args.repeat} runs each "
          f"(median, slowest), CPU per task report:")
    for way, rows in results.items():
        worker = sorted(r[0] / reports * 1e6 for r in rows)
        coordinator = sorted(r[1] / reports * 1e6 for r in rows)
        print(f"  {way:8} worker {statistics.median(worker):6.2f} us ({worker[-1]:6.2f})   coordinator "
              f"{statistics.median(coordinator):6.2f} us ({coordinator[-1]:6.2f})   "
              f"{rows[0][2]:8.0f} bytes per heartbeat")
    return 0


if __name__ == "__main__":
    sys.exit(main())
