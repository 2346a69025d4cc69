#!/usr/bin/env python
"""Checkpoint benchmark: aligned, unaligned and aligned-with-timeout checkpoints under full backpressure.

Job (defined in this file, `bench_checkpoint:build`, imported by the cluster's processes through the
submission's sys_path): unbounded GeneratorSource (parallelism 2, 1000 keys, seed 7) -> key_by(word) ->
keyed count (parallelism 2) that burns a fixed CPU cost per record in a busy-wait on time.perf_counter ->
DiscardSink (chained with the count). The per-record cost (SLUICE_BENCH_COST_US, set before the cluster
starts and inherited by its processes) makes the count far slower than the sources, so every channel in
front of it is full and the sources spend most of their time backpressured.

For every buffers-per-channel setting (--buffers) the script runs, each on a fresh local cluster (a
coordinator and 2 workers with 2 slots each, one source and one count subtask per worker), a baseline
without checkpoints and then each checkpoint mode (--modes) with a 1 s interval.

- Warm-up: at least --warmup s from the moment all 4 tasks report, then until the sources emit what the
  keyed tasks consume (within 10 % over the last 2 s), at most --max-warmup s. At the start the sources
  fill every queue at full speed; with deep queues that excess takes many seconds to drain.
- Then --seconds are measured. Source throughput = records the two source tasks emitted in the window /
  the window; processed = records the two keyed tasks consumed. Both come from the tasks' own counters
  and run times (status RPC), so they do not depend on polling jitter.
- Checkpoint figures come from the coordinator's history (`checkpoints` RPC) for the checkpoints
  triggered in the window; the script waits for the last of them to end. Durations are trigger -> last
  acknowledgement. Failed checkpoints (e.g. by the 10 s checkpoint timeout) are counted separately, and a
  timed-out one enters the percentiles as a ">= timeout" lower bound.
- Other load: CPU used by processes not ours during the window (see bench_throughput.CpuMeter). Before each
  run the script waits (up to --quiet-wait s) for the machine to be quiet; a run with more than
  --max-other-load cores of other load is repeated up to --retries times, and the quietest run is kept.

Modes beyond Flink's (issue 20): `switch` is aligned with per-channel switching (`channel_timeout_s` 10 ms:
a barrier that has waited 10 ms behind data overtakes it on that channel only); `switch_cap` the same with
the in-flight cap (`max_inflight_bytes`, --cap-bytes, per task per checkpoint); `concurrent` is unaligned
with `max_concurrent` 2 and a savepoint requested every 3 s during the window, whose latency
(request -> COMPLETED, as the client sees it) is reported beside the periodic checkpoints' durations; with
--savepoint-every S, every mode's runs request one every S s. Each savepoint gets a line: its trigger delay
(queued at the coordinator), its own duration and alignment, the periodic checkpoints in flight at the request,
triggered while it aligned and of those the ones done (every ack in) before it, with their durations, and each
task's barrier timeline from its `_metadata`.

    .venv/bin/python scripts/bench_checkpoint.py
    .venv/bin/python scripts/bench_checkpoint.py --modes aligned,unaligned,switch,switch_cap,concurrent --buffers 4
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
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

from runtime.api import DiscardSink, GeneratorSource, Job, KeyedProcessFunction  # noqa: E402
from runtime.common.checkpoint_metadata import BadMetadata  # noqa: E402
from runtime.graph.checkpoint_metadata import read_checkpoint_metadata  # noqa: E402

ENTRY = "bench_checkpoint:build"
COST_ENV = "SLUICE_BENCH_COST_US"
DEFAULT_COST_US = 30.0
MODES = ("aligned", "unaligned", "aligned_timeout", "switch", "switch_cap", "concurrent")
DEFAULT_MODES = ("aligned", "unaligned", "aligned_timeout")
CHANNEL_TIMEOUT_S = 0.01  # seed 000: "barrier overtakes buffers if not flushed within 10 ms"
CAP_BYTES = 256 * 1024  # --cap-bytes
SAVEPOINT_EVERY_S = 3.0  # --savepoint-every
SAVEPOINT_MODES = {"concurrent"}  # the modes whose runs request savepoints (--savepoint-every given: every mode)
INTERVAL_S = 1.0
ALIGNED_TIMEOUT_S = 0.1
CHECKPOINT_TIMEOUT_S = 10.0
# targets from the issue
TARGET_UNALIGNED_P95_S = 1.0
TARGET_UNALIGNED_SPREAD = 2.0  # p95 at the largest buffer setting / p95 at the smallest
TARGET_THROUGHPUT_COST = 0.10  # unaligned vs no checkpoints
# issue 8 item 10: Flink 2.3's aligned checkpoint median on this shape (2 workers, same per-record cost, full
# backpressure); with the in-flight bound ours must be at most that at every buffer setting
TARGET_ALIGNED_MEDIAN_S = 3.2


# -- the job (runs in the cluster's processes) ---------------------------------------------


class SlowCount(KeyedProcessFunction):
    """The word count's keyed Count, plus a fixed busy-wait per record."""

    def open(self, ctx: Any) -> None:
        self.count = ctx.value_state("count", default=0)
        self.cost_s = float(os.environ.get(COST_ENV, str(DEFAULT_COST_US))) / 1e6

    def process(self, record: Any, ctx: Any) -> None:
        end = time.perf_counter() + self.cost_s
        n = self.count.value() + 1
        self.count.update(n)
        while time.perf_counter() < end:
            pass
        ctx.emit((record[0], n))


def build(job: Job) -> None:
    (job.source(GeneratorSource(count=None, keys=1000, seed=7), parallelism=2)
        .key_by(lambda r: r[0])
        .process(SlowCount(), parallelism=2)
        .sink(DiscardSink()))


# -- measurement ------------------------------------------------------------------------------


def job_config(mode: str, buffers: int, inflight_target_s: float | None = None) -> dict[str, Any]:
    config: dict[str, Any] = {"buffers_per_channel": buffers}
    if inflight_target_s is not None:
        config["inflight_target_s"] = inflight_target_s
    if mode != "none":
        # every checkpoint is retained, so that the barrier timeline of each can be read from its _metadata
        real = {"switch": "aligned", "switch_cap": "aligned", "concurrent": "unaligned"}.get(mode, mode)
        cp: dict[str, Any] = {"interval_s": INTERVAL_S, "mode": real, "timeout_s": CHECKPOINT_TIMEOUT_S,
                              "tolerable_failures": 1000, "retain": 1000}
        if mode == "aligned_timeout":
            cp["aligned_timeout_s"] = ALIGNED_TIMEOUT_S
        if mode in ("switch", "switch_cap"):
            cp["channel_timeout_s"] = CHANNEL_TIMEOUT_S
        if mode == "switch_cap":
            cp["max_inflight_bytes"] = CAP_BYTES
        if mode == "concurrent":
            cp["max_concurrent"] = 2
        config["checkpoint"] = cp
    return config


def _snapshot(summary: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per task: counters and run time (busy + idle + backpressured = time since the task started)."""
    source_name = summary["vertices"][0]["name"]
    return {t["task"]: {"source": t["name"].rsplit(" (", 1)[0] == source_name,
                        "records_out": t["records_out"], "records_in": t["records_in"],
                        "run_s": t["busy_s"] + t["idle_s"] + t["backpressured_s"],
                        "backpressured_s": t["backpressured_s"], "busy_s": t["busy_s"], "idle_s": t["idle_s"]}
            for t in summary["tasks"]}


def _window_rates(first: dict[str, Any], last: dict[str, Any]) -> dict[str, Any]:
    """Records/s between two snapshots: emitted by the sources, consumed by the keyed tasks; per-task shares.

    Each task's rate is its counter difference over its own run-time difference (both taken together when the
    task reported), so the 1 s heartbeat and the polling do not blur it.
    """
    source = processed = 0.0
    per_task: dict[str, Any] = {}
    for task, b in last.items():
        a = first.get(task)
        dt = b["run_s"] - a["run_s"] if a is not None else 0.0
        if a is None or dt <= 0:
            continue
        key = "records_out" if b["source"] else "records_in"
        rate = (b[key] - a[key]) / dt
        per_task[task] = {"source": b["source"], "records_per_s": rate, "window_s": dt,
                          "busy": (b["busy_s"] - a["busy_s"]) / dt, "idle": (b["idle_s"] - a["idle_s"]) / dt,
                          "backpressured": (b["backpressured_s"] - a["backpressured_s"]) / dt}
        if b["source"]:
            source += rate
        else:
            processed += rate
    return {"source_records_per_s": source, "processed_records_per_s": processed, "tasks": per_task}


async def _status(cluster: Any, job_id: str) -> dict[str, Any]:
    summary = await cluster.call("status", {"job_id": job_id})
    if summary["state"] != "RUNNING":
        raise RuntimeError(f"job {job_id} is {summary['state']}: {summary.get('error', '')}")
    return summary


def barrier_timeline(state_dir: str, job_id: str, checkpoint_ids: list[int]) -> dict[str, Any]:
    """From each checkpoint's _metadata: when (s after the trigger) the sources took their trigger and the
    keyed tasks saw their first and last barrier. Medians over the checkpoints; older revisions that do not
    record the timeline give an empty result."""
    per_cp: list[dict[str, float]] = []
    for cid in checkpoint_ids:
        try:  # the runtime's one reader of `_metadata`
            acks = read_checkpoint_metadata(os.path.join(state_dir, "checkpoints", job_id, f"chk-{cid}")).acks
        except BadMetadata:
            continue
        sources = [a["figures"] for t, a in acks.items() if t.startswith("0:") and "first_barrier_s" in a["figures"]]
        keyed = [a["figures"] for t, a in acks.items() if not t.startswith("0:") and "first_barrier_s" in a["figures"]]
        if not sources or not keyed:
            continue
        per_cp.append({"source_trigger_max_s": max(f["first_barrier_s"] for f in sources),
                       "source_skew_s": max(f["first_barrier_s"] for f in sources)
                       - min(f["first_barrier_s"] for f in sources),
                       "keyed_first_barrier_s": min(f["first_barrier_s"] for f in keyed),
                       "keyed_last_barrier_s": max(f["last_barrier_s"] for f in keyed)})
    if not per_cp:
        return {}
    return {k: statistics.median(c[k] for c in per_cp) for k in per_cp[0]} | {"checkpoints": len(per_cp)}


async def _measure(cluster: Any, mode: str, buffers: int, seconds: float, warmup: float,
                   max_warmup: float, inflight_target_s: float | None = None) -> dict[str, Any]:
    from bench_throughput import CpuMeter  # same directory

    await cluster.wait_workers()
    submitted = await cluster.call("submit", {"entry": ENTRY, "name": f"bench-checkpoint-{mode}-{buffers}",
                                              "config": job_config(mode, buffers, inflight_target_s),
                                              "sys_path": SCRIPTS})
    job_id = submitted["job_id"]
    try:
        deadline = time.monotonic() + 60.0
        while True:  # until every task has reported statistics
            summary = await cluster.call("status", {"job_id": job_id})
            if summary["state"] in ("FAILED", "CANCELLED", "FINISHED"):
                raise RuntimeError(f"job {job_id} ended {summary['state']}: {summary.get('error', '')}")
            if summary["state"] == "RUNNING" and len(summary["tasks"]) == summary["tasks_total"]:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"job {job_id} did not report all its tasks within 60 s")
            await asyncio.sleep(0.1)
        running_at = time.monotonic()
        # Warm-up: at least `warmup` s, then until the sources emit what the keyed tasks consume (within 10 %
        # over the last 2 s): at the start the sources fill every queue at full speed, and with deep queues
        # the excess takes many seconds to drain. Give up waiting after `max_warmup` s.
        snaps: list[tuple[float, dict[str, Any]]] = [(running_at, _snapshot(summary))]
        steady = False
        while True:
            await asyncio.sleep(1.0)
            now = time.monotonic()
            snaps.append((now, _snapshot(await _status(cluster, job_id))))
            if now - running_at < warmup:
                continue
            past = [sn for t, sn in snaps if t <= now - 2.0]
            if past:
                w = _window_rates(past[-1], snaps[-1][1])
                if w["processed_records_per_s"] > 0 and \
                        abs(w["source_records_per_s"] / w["processed_records_per_s"] - 1) <= 0.10:
                    steady = True
                    break
            if now - running_at >= max_warmup:
                break
        first = snaps[-1][1]
        measure_from = time.monotonic()
        warmup_s = measure_from - running_at
        pids = [w.pid for w in cluster.worker_procs] + ([cluster.coordinator.pid] if cluster.coordinator else [])
        meter = CpuMeter(pids)
        savepoints: list[dict[str, Any]] = []
        if mode in SAVEPOINT_MODES:
            await _savepoints_during(cluster, job_id, seconds, savepoints)
        else:
            await asyncio.sleep(seconds)
        last = _snapshot(await _status(cluster, job_id))
        measure_to = time.monotonic()
        cpu = meter.stop()
        # Let a checkpoint triggered in the window finish (or time out), so that every one has its outcome.
        wait_until = time.monotonic() + CHECKPOINT_TIMEOUT_S + 2.0
        while True:
            history = (await cluster.call("checkpoints", {"job_id": job_id}))["history"]
            pending = [h for h in history if h["status"] == "IN_PROGRESS" and h["started_at"] <= measure_to]
            if not pending or time.monotonic() > wait_until:
                break
            await asyncio.sleep(0.25)
    finally:
        try:
            await cluster.call("cancel", {"job_id": job_id})
        except Exception:  # noqa: BLE001 - the cluster is stopped next anyway
            pass
    window = measure_to - measure_from
    result = _window_rates(first, last)
    result.update({"job_id": job_id, "mode": mode, "running_at": running_at, "buffers_per_channel": buffers,
                   "warmup_s": warmup_s,
                   "inflight_target_s": inflight_target_s, "measure_from": measure_from, "measure_to": measure_to,
                   "steady": steady, "window_s": window, "other_cores": cpu["other_cores"],
                   "cpu_cores": cpu["cpu_s"] / window if cpu["cpu_s"] is not None else None,
                   "checkpoints": summarise_checkpoints(history, measure_from, measure_to)
                   if mode != "none" else None,
                   "savepoints": savepoints,
                   "history": history})
    return result


async def _savepoints_during(cluster: Any, job_id: str, seconds: float, out: list[dict[str, Any]]) -> None:
    """Request a savepoint every SAVEPOINT_EVERY_S for `seconds`, one at a time, while the periodic checkpoints
    run; each one's latency is what its client waits (request -> COMPLETED or ABORTED)."""
    directory = os.path.join(cluster.state_dir, "savepoints")  # the local cluster's savepoint root
    end = time.monotonic() + seconds
    while time.monotonic() + SAVEPOINT_EVERY_S <= end:
        await asyncio.sleep(SAVEPOINT_EVERY_S / 2)
        t0 = time.monotonic()
        result = await cluster.call("checkpoint", {"job_id": job_id, "savepoint": True, "directory": directory})
        out.append({"latency_s": time.monotonic() - t0, "status": result["status"], "requested_at": t0,
                    "checkpoint_id": result["checkpoint_id"], "path": result.get("path") or ""})
        await asyncio.sleep(max(0.0, t0 + SAVEPOINT_EVERY_S - time.monotonic()))
    await asyncio.sleep(max(0.0, end - time.monotonic()))


def _nearest_rank(values: list[tuple[float, bool]], q: float) -> tuple[float, bool] | None:
    """values: (duration, is_lower_bound), sorted; nearest-rank percentile q in (0, 1]."""
    if not values:
        return None
    return values[max(0, math.ceil(q * len(values)) - 1)]


def summarise_checkpoints(history: list[dict[str, Any]], t0: float, t1: float) -> dict[str, Any]:
    """Checkpoints triggered in [t0, t1] (coordinator monotonic clock = ours: same machine)."""
    window = [h for h in history if not h["savepoint"] and t0 <= h["started_at"] <= t1]
    completed = [h for h in window if h["status"] == "COMPLETED"]
    failed = [h for h in window if h["status"] == "FAILED"]
    in_progress = [h for h in window if h["status"] == "IN_PROGRESS"]
    timed_out = [h for h in failed if h["failure_reason"].startswith("timeout")]
    # durations; a timed-out checkpoint took at least the timeout (the measurement waits for the checkpoints
    # triggered in the window to end, so none should still be in progress)
    values = sorted([(h["duration_s"], False) for h in completed]
                    + [(h["duration_s"] or CHECKPOINT_TIMEOUT_S, True) for h in timed_out])
    switched = [h for h in completed if h["inflight_bytes"] > 0]

    def pct(q: float) -> dict[str, Any] | None:
        v = _nearest_rank(values, q)
        return None if v is None else {"s": v[0], "lower_bound": v[1]}

    durations = [h["duration_s"] for h in completed]
    return {
        "triggered": len(window), "completed": len(completed), "failed": len(failed), "timed_out": len(timed_out),
        "in_progress_at_end": len(in_progress),
        "failure_reasons": sorted({h["failure_reason"] for h in failed}),
        "duration_median": pct(0.5), "duration_p95": pct(0.95), "duration_max": pct(1.0),
        "completed_duration_median_s": statistics.median(durations) if durations else None,
        "inflight_bytes_median": statistics.median(h["inflight_bytes"] for h in completed) if completed else None,
        "inflight_bytes_max": max((h["inflight_bytes"] for h in completed), default=None),
        "state_bytes_median": statistics.median(h["state_bytes"] for h in completed) if completed else None,
        "alignment_s_median": statistics.median(h["alignment_s"] for h in completed) if completed else None,
        "start_delay_s_median": statistics.median(h["start_delay_s"] for h in completed) if completed else None,
        "with_inflight_data": len(switched),
    }


def wait_quiet(max_other: float, timeout_s: float) -> float | None:
    """Before a run (no cluster of ours is up): wait until the machine's busy cores over 2 s are at most
    `max_other`, for at most `timeout_s`. Returns the last reading (None if /proc/stat is unreadable)."""
    from bench_throughput import CpuMeter

    deadline = time.monotonic() + timeout_s
    while True:
        meter = CpuMeter([])
        time.sleep(2.0)
        other = meter.stop()["other_cores"]
        if other is None or other <= max_other or time.monotonic() >= deadline:
            return other
        time.sleep(3.0)


def run_one(mode: str, buffers: int, seconds: float, warmup: float, max_warmup: float,
            inflight_target_s: float | None = None) -> dict[str, Any]:
    from runtime.cli.local_cluster import LocalCluster

    log_dir = tempfile.mkdtemp(prefix="sluice-bench-cp-")
    state_dir = os.path.join(log_dir, "state")
    cluster = LocalCluster(workers=2, slots=2, log_dir=log_dir, state_dir=state_dir)
    from bench_throughput import logs_kept_on_failure

    with logs_kept_on_failure(cluster, log_dir):
        cluster.start()
        result = asyncio.run(_measure(cluster, mode, buffers, seconds, warmup, max_warmup, inflight_target_s))
        if result["checkpoints"] is not None:
            ids = [h["checkpoint_id"] for h in result["history"] if h["status"] == "COMPLETED"
                   and result["measure_from"] <= h["started_at"] <= result["measure_to"]]
            result["checkpoints"]["timeline"] = barrier_timeline(state_dir, result["job_id"], ids)
        for sp in result["savepoints"]:
            sp.update(savepoint_details(sp, result["history"], result["running_at"]))
    return result


def savepoint_line(sp: dict[str, Any]) -> str:
    """One savepoint's figures on a line: latency, where it went, and the keyed tasks' last barriers."""
    def f(v: Any) -> str:
        return "-" if v is None else f"{v:.3f}"

    line = (f"savepoint {sp['checkpoint_id']} {sp['status']} at +{sp['requested_after_s']:.1f} s: latency "
            f"{sp['latency_s']:.3f} s (trigger delay {f(sp.get('trigger_delay_s'))}, acks {f(sp.get('duration_s'))}, "
            f"alignment {f(sp.get('alignment_s'))}); periodic in flight at request "
            f"{sp.get('periodic_in_flight_at_request', [])}, triggered while it aligned "
            f"{sp.get('periodic_triggered_while_aligning', [])}, of which done while it aligned (s) "
            f"{ {n: round(d, 3) for n, d in (sp.get('periodic_done_while_aligning') or {}).items()} }")
    tasks = sp.get("tasks") or {}
    if tasks:
        line += "; barriers first/last: " + ", ".join(
            f"{t} {f(x['first_barrier_s'])}/{f(x['last_barrier_s'])}" for t, x in tasks.items())
    return line


def savepoint_details(sp: dict[str, Any], history: list[dict[str, Any]], running_at: float) -> dict[str, Any]:
    """Where one savepoint's latency went: when it was requested (s after the job ran), how long the coordinator
    held it before the trigger, the periodic checkpoints in flight at the request and triggered while it ran,
    its alignment, and from its `_metadata` each task's barrier timeline (s after the trigger)."""
    h = next((x for x in history if x["checkpoint_id"] == sp["checkpoint_id"]), None)
    out: dict[str, Any] = {"requested_after_s": sp["requested_at"] - running_at}
    if h is None:
        return out
    # the savepoint aligns from its trigger to its last acknowledgement
    t0, t1 = sp["requested_at"], h["started_at"] + (h["duration_s"] or sp["latency_s"])
    periodic = [x for x in history if not x["savepoint"]]
    out.update({
        "trigger_delay_s": h["started_at"] - t0, "duration_s": h["duration_s"], "alignment_s": h["alignment_s"],
        "start_delay_s": h["start_delay_s"], "state_bytes": h["state_bytes"],
        "periodic_in_flight_at_request": [x["checkpoint_id"] for x in periodic if x["started_at"] <= t0
                                          and (x["duration_s"] is None or x["started_at"] + x["duration_s"] > t0)],
        "periodic_triggered_while_aligning": [x["checkpoint_id"] for x in periodic if t0 < x["started_at"] < t1],
        # and those of them with every ack in before the savepoint's last one: started and ended while it aligned
        "periodic_done_while_aligning": {x["checkpoint_id"]: x["duration_s"] for x in periodic
                                         if t0 < x["started_at"] and x["status"] == "COMPLETED"
                                         and x["started_at"] + x["duration_s"] < t1},
    })
    if sp.get("path"):
        try:
            acks = read_checkpoint_metadata(sp["path"]).acks
        except BadMetadata:
            acks = {}
        out["tasks"] = {t: {k: a["figures"].get(k) for k in ("first_barrier_s", "last_barrier_s", "alignment_s",
                                                              "sync_s", "async_s")} for t, a in sorted(acks.items())}
    return out


def run_flink(python: str, mode: str, cost_us: float, seconds: float, warmup: float) -> dict[str, Any]:
    """The same job on Flink (scripts/flink_checkpoint_job.py, run by the Flink venv's `python`): the durations
    of the checkpoints triggered in its measured window."""
    import subprocess

    cmd = [python, os.path.join(SCRIPTS, "flink_checkpoint_job.py"), "--mode", mode, "--cost-us", repr(cost_us),
           "--seconds", repr(seconds), "--warmup", repr(warmup), "--interval", repr(INTERVAL_S)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=warmup + seconds + 300)
        if done.returncode != 0:
            raise RuntimeError(f"the Flink job failed ({done.returncode}): {done.stderr[-2000:]}")
        result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    except (OSError, RuntimeError, ValueError, IndexError, subprocess.TimeoutExpired) as exc:
        # the Sluice runs of the matrix are kept: a Flink failure is reported in its place
        return {"engine": "flink", "mode": mode, "error": str(exc), "completed": 0, "failed": 0, "durations_s": [],
                "median_s": None, "max_s": None}
    durations = result["durations_s"]
    result["median_s"] = statistics.median(durations) if durations else None
    result["max_s"] = max(durations) if durations else None
    return result


# -- report -----------------------------------------------------------------------------------


def _dur(p: dict[str, Any] | None) -> str:
    if p is None:
        return "-"
    return ("≥ " if p["lower_bound"] else "") + f"{p['s']:.3f}"


def _bytes(n: float | None) -> str:
    if n is None:
        return "-"
    if n >= 1024 * 1024:
        return f"{n / (1024 * 1024):.1f} MiB"
    if n >= 1024:
        return f"{n / 1024:.0f} KiB"
    return f"{n:.0f} B"


def _rel(value: float, base: float | None) -> str:
    return "-" if not base else f"{100 * (value / base - 1):+.1f} %"


def table(runs: list[dict[str, Any]]) -> list[str]:
    base = {r["buffers_per_channel"]: r for r in runs if r["mode"] == "none"}
    lines = ["| buffers/channel | mode | checkpoints ok / failed | duration median (s) | p95 (s) | max (s) "
             "| in-flight median | source records/s | vs none | processed records/s | vs none | warm-up (s) "
             "| other load (cores) |",
             "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in runs:
        cp = r["checkpoints"]
        b = base.get(r["buffers_per_channel"]) if r["mode"] != "none" else None
        other = "?" if r["other_cores"] is None else f"{r['other_cores']:.2f}"
        if cp is None:
            counts = dur = p95 = mx = inflight = "-"
        else:
            counts = f"{cp['completed']} / {cp['failed']}"
            if cp["timed_out"]:
                counts += f" ({cp['timed_out']} timed out)"
            if cp["in_progress_at_end"]:
                counts += f" + {cp['in_progress_at_end']} unfinished"
            dur, p95, mx = _dur(cp["duration_median"]), _dur(cp["duration_p95"]), _dur(cp["duration_max"])
            inflight = _bytes(cp["inflight_bytes_median"])
        warm = f"{r['warmup_s']:.0f}" + ("" if r["steady"] else " (not steady)")
        lines.append(
            f"| {r['buffers_per_channel']} | {r['mode']} | {counts} | {dur} | {p95} | {mx} | {inflight} "
            f"| {r['source_records_per_s']:,.0f} | {_rel(r['source_records_per_s'], b and b['source_records_per_s'])} "
            f"| {r['processed_records_per_s']:,.0f} "
            f"| {_rel(r['processed_records_per_s'], b and b['processed_records_per_s'])} | {warm} | {other} |")
    return lines


def new_modes_table(runs: list[dict[str, Any]]) -> list[str]:
    """Per-channel switching, the cap and concurrent checkpoints: alignment, in-flight bytes, savepoints."""
    lines = ["| buffers/channel | mode | alignment median (s) | in-flight median | in-flight max "
             "| checkpoints with in-flight data | savepoint latency median (s) | max (s) | savepoints ok |",
             "|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in runs:
        cp = r["checkpoints"]
        if cp is None:
            continue
        sps = r.get("savepoints") or []
        lat = [sp["latency_s"] for sp in sps if sp["status"] == "COMPLETED"]
        align = cp["alignment_s_median"]
        lines.append(
            f"| {r['buffers_per_channel']} | {r['mode']} | {'-' if align is None else format(align, '.3f')} "
            f"| {_bytes(cp['inflight_bytes_median'])} | {_bytes(cp['inflight_bytes_max'])} "
            f"| {cp['with_inflight_data']} / {cp['completed']} "
            f"| {format(statistics.median(lat), '.3f') if lat else '-'} | {format(max(lat), '.3f') if lat else '-'} "
            f"| {f'{len(lat)} / {len(sps)}' if sps else '-'} |")
    return lines


def pooled_median(runs: list[dict[str, Any]], mode: str, buffers: int) -> float | None:
    """Median duration over every checkpoint of every round of one configuration (timed-out ones count as the
    timeout)."""
    values = [h["duration_s"] if h["status"] == "COMPLETED" else CHECKPOINT_TIMEOUT_S
              for r in runs if r["mode"] == mode and r["buffers_per_channel"] == buffers
              for h in r["history"] if not h["savepoint"] and r["measure_from"] <= h["started_at"] <= r["measure_to"]
              and (h["status"] == "COMPLETED" or h["failure_reason"].startswith("timeout"))]
    return statistics.median(values) if values else None


def verdicts(runs: list[dict[str, Any]], buffers: list[int]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    by = {(r["mode"], r["buffers_per_channel"]): r for r in runs}

    def stat(mode: str, b: int, key: str) -> dict[str, Any] | None:
        r = by.get((mode, b))
        return r["checkpoints"][key] if r and r["checkpoints"] else None

    un = {b: stat("unaligned", b, "duration_p95") for b in buffers}
    un = {b: p for b, p in un.items() if p is not None}
    if un:
        ok = all(not p["lower_bound"] and p["s"] <= TARGET_UNALIGNED_P95_S for p in un.values())
        out.append({"target": f"unaligned p95 <= {TARGET_UNALIGNED_P95_S:g} s", "met": ok,
                    "detail": ", ".join(f"{b} buffers: {_dur(p)} s" for b, p in un.items())})
    if len(un) >= 2:
        lo, hi = un[min(un)], un[max(un)]
        ratio = max(lo["s"], hi["s"]) / max(min(lo["s"], hi["s"]), 1e-9)
        out.append({"target": f"unaligned p95 within {TARGET_UNALIGNED_SPREAD:g}x between {min(un)} and {max(un)} "
                              "buffers", "met": ratio <= TARGET_UNALIGNED_SPREAD, "detail": f"ratio {ratio:.2f}"})
    meds = {b: pooled_median(runs, "aligned", b) for b in buffers if ("aligned", b) in by}
    if meds:
        ok = all(m is not None and m <= TARGET_ALIGNED_MEDIAN_S for m in meds.values())
        out.append({"target": f"aligned median <= {TARGET_ALIGNED_MEDIAN_S:g} s (Flink 2.3 on this shape) at every "
                              "buffer setting", "met": ok,
                    "detail": ", ".join(f"{b} buffers: median {'-' if m is None else format(m, '.3f')} s"
                                        for b, m in sorted(meds.items()))})
    for b in buffers:
        none, u = by.get(("none", b)), by.get(("unaligned", b))
        if none and u:
            cost = 1 - u["source_records_per_s"] / none["source_records_per_s"]
            cost_p = 1 - u["processed_records_per_s"] / none["processed_records_per_s"]
            out.append({"target": f"throughput cost of 1 s unaligned checkpoints <= {TARGET_THROUGHPUT_COST:.0%} "
                                  f"({b} buffers)", "met": cost <= TARGET_THROUGHPUT_COST,
                        "detail": f"source {cost:+.1%} ({u['source_records_per_s']:,.0f} vs "
                                  f"{none['source_records_per_s']:,.0f} records/s); processed {cost_p:+.1%}"})
    return out


# -- driver -----------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    global CAP_BYTES, SAVEPOINT_EVERY_S, SAVEPOINT_MODES  # from --cap-bytes and --savepoint-every, for the runs
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=15.0, help="measured seconds of each run, after the "
                        "warm-up (default 15)")
    parser.add_argument("--warmup", type=float, default=2.0, help="minimum warm-up in seconds (default 2)")
    parser.add_argument("--max-warmup", type=float, default=30.0,
                        help="longest warm-up while waiting for a steady state (default 30)")
    parser.add_argument("--modes", default=",".join(DEFAULT_MODES),
                        help=f"comma-separated checkpoint modes (default {','.join(DEFAULT_MODES)}; also "
                             f"{', '.join(m for m in MODES if m not in DEFAULT_MODES)}); a run without "
                             "checkpoints is always added")
    parser.add_argument("--cap-bytes", type=int, default=CAP_BYTES,
                        help=f"switch_cap: in-flight bytes persisted per task per checkpoint (default {CAP_BYTES})")
    parser.add_argument("--savepoint-every", type=float, default=None, metavar="SECONDS",
                        help=f"a savepoint every this many seconds of the window, in every mode (default: "
                             f"{SAVEPOINT_EVERY_S:g} s, in the concurrent mode only)")
    parser.add_argument("--buffers", default="4,64", help="comma-separated buffers_per_channel settings (default 4,64)")
    parser.add_argument("--cost-us", type=float, default=DEFAULT_COST_US,
                        help=f"busy-wait per record in the keyed count, microseconds (default {DEFAULT_COST_US:g})")
    parser.add_argument("--max-other-load", type=float, default=0.1,
                        help="rerun a configuration when other processes used more cores than this during its "
                             "measurement (default 0.1)")
    parser.add_argument("--retries", type=int, default=2, help="reruns per configuration for --max-other-load "
                        "(default 2); the run with the least other load is kept")
    parser.add_argument("--quiet-wait", type=float, default=60.0,
                        help="before each run, wait up to this many seconds for the other load to fall to "
                             "--max-other-load (default 60; 0 = do not wait)")
    parser.add_argument("--rounds", type=int, default=1, help="repeat the whole matrix this many times, "
                        "interleaved, so slow drifts of the machine's load hit every configuration alike (default 1)")
    parser.add_argument("--inflight-target", type=float, default=None, metavar="SECONDS",
                        help="inflight_target_s of the job (default: the runtime's, 1 s; 0 = fixed-size buffers)")
    parser.add_argument("--no-baseline", action="store_true",
                        help="skip the run without checkpoints (the throughput columns then compare with nothing)")
    parser.add_argument("--flink-python", default=os.environ.get("SLUICE_FLINK_PYTHON"), metavar="PATH",
                        help="the Python of a venv with apache-flink: each round also runs the same job on Flink "
                             "(scripts/flink_checkpoint_job.py) for the aligned and unaligned modes "
                             "(default: $SLUICE_FLINK_PYTHON; none: Sluice only)")
    parser.add_argument("--flink-warmup", type=float, default=10.0, help="the Flink job's warm-up, s (default 10)")
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of text")
    args = parser.parse_args(argv)
    CAP_BYTES = args.cap_bytes
    if args.savepoint_every is not None:
        SAVEPOINT_EVERY_S, SAVEPOINT_MODES = args.savepoint_every, set(MODES)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    bad = [m for m in modes if m not in MODES]
    if bad:
        parser.error(f"unknown modes {bad}; choose from {', '.join(MODES)}")
    try:
        buffers = [int(b) for b in args.buffers.split(",") if b.strip()]
    except ValueError:
        parser.error("--buffers takes comma-separated integers")
    if not buffers or min(buffers) < 1:
        parser.error("--buffers must list integers >= 1")
    if args.seconds < 2 or args.warmup < 0 or args.max_warmup < args.warmup or args.retries < 0 or args.rounds < 1:
        parser.error("need --seconds >= 2, --warmup >= 0, --max-warmup >= --warmup, --retries >= 0, --rounds >= 1")
    if args.inflight_target is not None and not 0 <= args.inflight_target < math.inf:
        parser.error("--inflight-target takes seconds >= 0")

    def say(text: str) -> None:
        print(text, file=sys.stderr if args.json else sys.stdout, flush=True)

    from bench_throughput import machine

    os.environ[COST_ENV] = repr(args.cost_us)  # inherited by the cluster's processes
    # The workers add the submission's sys_path before importing the job module, but the coordinator imports
    # it with its own sys.path when it builds the plan, so this directory goes on the processes' PYTHONPATH too.
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in [SCRIPTS, os.environ.get("PYTHONPATH", "")] if p)
    info = machine()
    say(f"bench_checkpoint: {args.seconds:g} s measured per run after a warm-up of "
        f"{args.warmup:g}-{args.max_warmup:g} s; "
        f"cost {args.cost_us:g} us/record; checkpoint interval {INTERVAL_S:g} s, timeout {CHECKPOINT_TIMEOUT_S:g} s, "
        f"aligned_timeout {ALIGNED_TIMEOUT_S:g} s; {info['nproc']} cpus ({info['cpu_model']}), "
        f"Python {info['python']}, {info['event_loop']}; revision {info['revision']}")
    runs: list[dict[str, Any]] = []
    flink: list[dict[str, Any]] = []
    started = time.monotonic()
    matrix = [(rnd, b, mode) for rnd in range(args.rounds) for b in buffers
              for mode in ([] if args.no_baseline else ["none"]) + modes]
    for rnd, b, mode in matrix:
        attempts: list[dict[str, Any]] = []
        while True:
            if args.quiet_wait > 0:
                wait_quiet(args.max_other_load, args.quiet_wait)
            r = run_one(mode, b, args.seconds, args.warmup, args.max_warmup, args.inflight_target)
            r["round"] = rnd
            attempts.append(r)
            cp = r["checkpoints"]
            extra = ""
            if cp is not None:
                extra = (f"; checkpoints {cp['completed']} ok, {cp['failed']} failed, "
                         f"{cp['in_progress_at_end']} unfinished; duration median {_dur(cp['duration_median'])} "
                         f"p95 {_dur(cp['duration_p95'])} max {_dur(cp['duration_max'])} s; in-flight median "
                         f"{_bytes(cp['inflight_bytes_median'])}")
                tl = cp.get("timeline") or {}
                if tl:
                    extra += (f"; barriers (median s after trigger): sources {tl['source_trigger_max_s']:.3f} "
                              f"(skew {tl['source_skew_s']:.3f}), keyed first {tl['keyed_first_barrier_s']:.3f} "
                              f"last {tl['keyed_last_barrier_s']:.3f}")
            other = r["other_cores"]
            say(f"  round {rnd + 1} buffers {b:>3} {mode:<15} source {r['source_records_per_s']:>7,.0f} rec/s, "
                f"processed {r['processed_records_per_s']:>7,.0f} rec/s{extra}; warm-up {r['warmup_s']:.0f} s"
                f"{'' if r['steady'] else ' (not steady)'}; other load "
                f"{'?' if other is None else format(other, '.2f')} cores")
            for sp in r["savepoints"]:
                say("    " + savepoint_line(sp))
            if other is None or other <= args.max_other_load or len(attempts) > args.retries:
                break
            say(f"    other load above {args.max_other_load:g} cores: running it again")
        best = min(attempts, key=lambda x: x["other_cores"] if x["other_cores"] is not None else 0.0)
        best["attempts"] = len(attempts)
        best["other_cores_attempts"] = [x["other_cores"] for x in attempts]
        runs.append(best)
        if args.flink_python and b == buffers[-1] and mode in ("aligned", "unaligned"):
            f = run_flink(args.flink_python, mode, args.cost_us, args.seconds, args.flink_warmup)
            f["round"] = rnd
            flink.append(f)
            say(f"  round {rnd + 1} Flink {mode:<15} checkpoints {f['completed']} ok, {f['failed']} failed; "
                f"duration median {'-' if f['median_s'] is None else format(f['median_s'], '.3f')} "
                f"max {'-' if f['max_s'] is None else format(f['max_s'], '.3f')} s"
                + (f"; error: {f['error'][-300:]}" if "error" in f else ""))
    result = {"benchmark": "checkpoint", "entry": ENTRY, "seconds": args.seconds, "warmup_s": args.warmup,
              "max_warmup_s": args.max_warmup, "cost_us": args.cost_us, "interval_s": INTERVAL_S,
              "checkpoint_timeout_s": CHECKPOINT_TIMEOUT_S, "aligned_timeout_s": ALIGNED_TIMEOUT_S,
              "machine": info, "elapsed_s": time.monotonic() - started, "runs": runs, "flink": flink,
              "targets": verdicts(runs, buffers)}
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print()
    for line in table(runs):
        print(line)
    print()
    if any(r["mode"] not in DEFAULT_MODES + ("none",) or r["savepoints"] for r in runs):
        for line in new_modes_table(runs):
            print(line)
        print()
    if args.rounds > 1:
        for b in buffers:
            for mode in modes:
                m = pooled_median(runs, mode, b)
                print(f"pooled over {args.rounds} rounds: buffers {b} {mode}: median "
                      f"{'-' if m is None else format(m, '.3f')} s")
        print()
    for mode in ("aligned", "unaligned"):
        pooled = [d for f in flink if f["mode"] == mode for d in f["durations_s"]]
        if pooled:
            print(f"Flink {mode}: {len(pooled)} checkpoints over {len(flink) // 2 or 1} round(s), median "
                  f"{statistics.median(pooled):.3f} s, slowest {max(pooled):.3f} s")
    for v in result["targets"]:
        print(f"{'met    ' if v['met'] else 'NOT met'}  {v['target']}: {v['detail']}")
    other = max((r["other_cores"] for r in runs if r["other_cores"] is not None), default=None)
    if other is not None and other > args.max_other_load:
        print(f"note: other processes used up to {other:.2f} cores during a kept run; the machine was not idle")
    print(f"total {result['elapsed_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
