"""What the REST API shows, as pure functions from the coordinator's records to JSON-ready dicts.

No I/O and no clock reads (callers pass `now`), so every view is tested with
plain values; coordinator/rest.py does the HTTP. Field names follow the
OpenAPI document (coordinator/ui/openapi.json), which the tests hold the
answers to.

Rates and backpressure come from the tasks' heartbeats: `task_sample` turns
the heartbeat reports of one task into per-second rates and the fraction of
the time the task spent backpressured (Flink's backPressuredTimeMsPerSecond,
as a ratio), which is what the UI colours. Every figure is a difference over
the same window of about RATE_WINDOW_S seconds, timed by the worker's clock
(`measured_at`, read with the counters), not by when the heartbeat arrived:
a late heartbeat must not stretch one task's interval and shrink the next.
The task counts the wait in progress in its backpressured time, so no
interval is clipped. A backpressured source emits in bursts (a buffer frees,
it fills it at once), so the window spans several of them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from runtime.graph.checkpoint_figures import AGGREGATED, TaskCheckpointFigures, declaration

if TYPE_CHECKING:
    from coordinator.jobs import JobRecord
    from coordinator.registry import WorkerRecord

# backpressured_ratio thresholds, as Flink's UI: OK below 10 %, LOW below 50 %, HIGH above
BACKPRESSURE_LOW = 0.10
BACKPRESSURE_HIGH = 0.50
RATE_WINDOW_S = 10.0  # rates and ratios are differences over about this long (one window for every task)

_COUNTERS = (("records_in", "records_in_per_s"), ("records_out", "records_out_per_s"),
             ("bytes_in", "bytes_in_per_s"), ("bytes_out", "bytes_out_per_s"))
_TIMES = (("backpressured_s", "backpressured_ratio"), ("busy_s", "busy_ratio"), ("idle_s", "idle_ratio"))
_KEYS = tuple(key for key, _ in (*_COUNTERS, *_TIMES))


def task_sample(previous: Mapping[str, Any] | None, report: dict[str, Any], now: float) -> dict[str, Any]:
    """A task's heartbeat report with rates over the last RATE_WINDOW_S seconds of its reports.

    `window` keeps [measured_at, *counters] of the reports in the window, plus the one just before it. The
    first report of a task, or one whose counters went backwards (a new attempt), starts the window afresh
    (rates 0). `measured_at` is the worker's monotonic clock when it read the counters; without it (an older
    worker) the arrival time `now` stands in.
    """
    at = float(report.get("measured_at", now))
    point = [at, *(float(report.get(k, 0)) for k in _KEYS)]
    window = [list(p) for p in previous.get("window", [])] if previous is not None else []
    if window and (at <= window[-1][0] or any(v < w for v, w in zip(point[1:], window[-1][1:], strict=True))):
        window = []
    window.append(point)
    while len(window) > 2 and at - window[1][0] >= RATE_WINDOW_S:
        window.pop(0)
    out = {**report, "sampled_at": now, "window": window, "rated": len(window) > 1}
    first = window[0]
    dt = at - first[0]
    for i, (_, rate) in enumerate((*_COUNTERS, *_TIMES), start=1):
        out[rate] = round(max(0.0, (point[i] - first[i]) / dt), 4) if dt > 0 else 0.0
    return out


def backpressure_level(ratio: float) -> str:
    if ratio >= BACKPRESSURE_HIGH:
        return "HIGH"
    if ratio >= BACKPRESSURE_LOW:
        return "LOW"
    return "OK"


def job_brief(job: JobRecord) -> dict[str, Any]:
    done, failed = job.checkpoint_counts()
    return {"job_id": job.job_id, "name": job.name, "entry": job.entry, "state": job.state, "attempt": job.attempt,
            "error": job.error, "submitted_at": job.submitted_at, "ended_at": job.ended_at,
            "tasks_total": job.total_tasks(), "restarts": job.restarts, "checkpoints_completed": done,
            "checkpoints_failed": failed, "last_checkpoint_id": (job.last_checkpoint or {}).get("checkpoint_id")}


def job_detail(job: JobRecord) -> dict[str, Any]:
    return {**job_brief(job), "restored_from": job.restored_from,
            "restored_checkpoint_id": job.restored_checkpoint_id, "final_checkpoint_id": job.final_checkpoint_id,
            "checkpoint_mode": getattr(job.checkpoint_settings, "mode", None),
            "checkpoint_interval_s": getattr(job.checkpoint_settings, "interval_s", None)}


def _subtask_view(index: int, worker: str | None, stats: Mapping[str, Any] | None) -> dict[str, Any]:
    st = stats or {}
    ratio = float(st.get("backpressured_ratio", 0.0))
    return {"subtask": index, "worker": worker, "state": st.get("state"),
            "records_in": int(st.get("records_in", 0)), "records_out": int(st.get("records_out", 0)),
            "records_in_per_s": float(st.get("records_in_per_s", 0.0)),
            "records_out_per_s": float(st.get("records_out_per_s", 0.0)),
            "backpressured_ratio": ratio, "busy_ratio": float(st.get("busy_ratio", 0.0)),
            "output_pool_usage": float(st.get("output_pool_usage", 0.0)),
            "input_queue": int(st.get("input_queue", 0)), "output_queue": int(st.get("output_queue", 0)),
            "backpressure": backpressure_level(ratio)}


def job_graph(job: JobRecord) -> dict[str, Any]:
    """Vertices (chained tasks) with per-subtask figures and their sums, and the edges between them."""
    plan = job.plan
    if plan is None:
        return {"job_id": job.job_id, "vertices": [], "edges": []}
    vertices = []
    for v in plan.vertices:
        subtasks = [_subtask_view(i, plan.placement.get(f"{v.id}:{i}"),
                                  job.task_stats.get(f"{job.job_id}/{v.id}:{i}")) for i in range(v.parallelism)]
        worst = max((s["backpressured_ratio"] for s in subtasks), default=0.0)
        vertices.append({
            "id": v.id, "name": v.name, "parallelism": v.parallelism,
            "records_in_per_s": round(sum(s["records_in_per_s"] for s in subtasks), 2),
            "records_out_per_s": round(sum(s["records_out_per_s"] for s in subtasks), 2),
            "records_in": sum(s["records_in"] for s in subtasks),
            "records_out": sum(s["records_out"] for s in subtasks),
            "backpressured_ratio": worst, "backpressure": backpressure_level(worst),
            "busy_ratio": max((s["busy_ratio"] for s in subtasks), default=0.0),
            "subtasks": subtasks})
    edges = [{"from": e.up, "to": e.down, "partitioner": e.partitioner} for e in plan.edges]
    return {"job_id": job.job_id, "vertices": vertices, "edges": edges}


def checkpoint_view(summary: Mapping[str, Any], task_figures: Mapping[str, TaskCheckpointFigures] | None,
                    wall_offset: float = 0.0) -> dict[str, Any]:
    """One checkpoint (a CheckpointSummary as a dict) with its per-task figures when they are still known.

    The checkpoint coordinator keeps monotonic times; `wall_offset` (wall clock minus monotonic clock) turns
    `started_at` into Unix time for the API's users."""
    return {"checkpoint_id": summary["checkpoint_id"], "status": str(summary["status"]), "mode": summary["mode"],
            "savepoint": bool(summary["savepoint"]), "started_at": round(summary["started_at"] + wall_offset, 3),
            "duration_s": summary["duration_s"],
            **{f.name: summary.get(f.name, 0) for f in AGGREGATED},  # the checkpoint's own figures
            "failure_reason": summary.get("failure_reason", ""),
            "tasks": [{"task": task, **figures.to_wire()} for task, figures in sorted((task_figures or {}).items())]}


def checkpoints_view(job: JobRecord, history: Iterable[Mapping[str, Any]],
                     figures: Mapping[int, Mapping[str, TaskCheckpointFigures]],
                     wall_offset: float = 0.0) -> dict[str, Any]:
    """The job's checkpoint history, oldest first; `figures` maps checkpoint id -> task -> ack figures."""
    items = [checkpoint_view(h, figures.get(int(h["checkpoint_id"])), wall_offset) for h in history]
    done, failed = job.checkpoint_counts()
    return {"job_id": job.job_id, "completed": done, "failed": failed,
            "last_completed": job.last_checkpoint, "figures": declaration(), "history": items}


def restarts_view(job: JobRecord) -> dict[str, Any]:
    return {"job_id": job.job_id, "restarts": job.restarts, "failures": list(job.failures[-50:]),
            "restart_s": list(job.restart_s[-50:]), "last_restart_s": job.last_restart_s,
            "rescale_s": list(job.rescale_s[-50:]), "restored_checkpoint_id": job.restored_checkpoint_id}


def worker_view(w: WorkerRecord, now: float) -> dict[str, Any]:
    return {"worker_id": w.worker_id, "host": w.host, "data_port": w.data_port, "slots": w.slots,
            "metrics_port": w.metrics_port, "pid": w.pid,
            "metrics_url": f"http://{w.host}:{w.metrics_port}/metrics" if w.metrics_port else None,
            "last_heartbeat_s_ago": round(max(0.0, now - w.last_heartbeat), 3)}
