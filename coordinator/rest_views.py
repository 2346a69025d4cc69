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

Watermarks come with the same reports (jobs with event time): a vertex's
watermark is its lowest subtask's, as in Flink, and a subtask's lag is how
far its watermark is behind the wall clock at the report. Times the
coordinator keeps on its monotonic clock become Unix time through
`wall_offset` (wall clock minus monotonic clock, read by the caller).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, is_dataclass
from typing import TYPE_CHECKING, Any

from runtime.api.time import MAX_WATERMARK, MIN_WATERMARK
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
_RATES = tuple(enumerate((rate for _, rate in (*_COUNTERS, *_TIMES)), start=1))  # (index in a point, rate name)


def task_sample(previous: Mapping[str, Any] | None, report: dict[str, Any], now: float) -> dict[str, Any]:
    """A task's heartbeat report with rates over the last RATE_WINDOW_S seconds of its reports.

    `window` keeps [measured_at, *counters] of the reports in the window, plus the one just before it. The
    first report of a task, or one whose counters went backwards (a new attempt), starts the window afresh
    (rates 0). `measured_at` is the worker's monotonic clock when it read the counters; without it (an older
    worker) the arrival time `now` stands in.
    """
    # every heartbeat samples every task (1,000 a second at 1,000 tasks): written for speed, loops over tuples
    at = float(report.get("measured_at", now))
    get = report.get
    point = [at] + [float(get(k, 0)) for k in _KEYS]
    window = _slide(previous, point)
    out = {**report, "sampled_at": now, "window": window, "rated": len(window) > 1}
    first = window[0]
    dt = at - first[0]
    if dt > 0:
        for i, rate in _RATES:
            out[rate] = round(max(0.0, (point[i] - first[i]) / dt), 4)
    else:
        for _, rate in _RATES:
            out[rate] = 0.0
    return out


def _slide(previous: Mapping[str, Any] | None, point: list[float]) -> list[list[float]]:
    """The window of [measured_at, *counters] points ending at `point`: the reports of the last RATE_WINDOW_S
    seconds plus the one just before them; afresh when the clock or a counter went backwards (a new attempt or
    process)."""
    window = list(previous.get("window", [])) if previous is not None else []  # its points are never changed
    if window:
        last = window[-1]
        if point[0] <= last[0] or len(point) != len(last):
            window = []
        else:
            for i in range(1, len(point)):
                if point[i] < last[i]:
                    window = []
                    break
    window.append(point)
    while len(window) > 2 and point[0] - window[1][0] >= RATE_WINDOW_S:
        window.pop(0)
    return window


def process_sample(previous: Mapping[str, Any] | None, report: Mapping[str, Any], now: float) -> dict[str, Any]:
    """A worker's process figures (rss_bytes, cpu_s) with its CPU use over the same window as the task rates,
    as a fraction of one core (0 for the first report or after a restart of the process)."""
    at = float(report.get("measured_at", now))
    cpu = float(report.get("cpu_s", 0.0))
    window = _slide(previous, [at, cpu])
    dt = at - window[0][0]
    return {"rss_bytes": int(report.get("rss_bytes", 0)), "cpu_s": cpu, "sampled_at": now, "window": window,
            "cpu_ratio": round(max(0.0, (cpu - window[0][1]) / dt), 4) if dt > 0 else 0.0,
            "rated": len(window) > 1}


def watermark_view(watermark: Any, sampled_at: float | None, wall_offset: float) -> dict[str, Any]:
    """A task's watermark (ms) and status: None without event time, NONE before the first watermark, END after
    the last (end of input), else ACTIVE with its lag behind the wall clock when it was reported."""
    if watermark is None:
        return {"watermark": None, "watermark_status": None, "watermark_lag_ms": None}
    mark = int(watermark)
    if mark <= MIN_WATERMARK:
        return {"watermark": None, "watermark_status": "NONE", "watermark_lag_ms": None}
    if mark >= MAX_WATERMARK:
        return {"watermark": None, "watermark_status": "END", "watermark_lag_ms": None}
    lag = None if sampled_at is None else round((sampled_at + wall_offset) * 1000.0 - mark)
    return {"watermark": mark, "watermark_status": "ACTIVE", "watermark_lag_ms": lag}


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
            "checkpoints_failed": failed, "last_checkpoint_id": job.last_checkpoint_id}


def job_detail(job: JobRecord, wall_offset: float = 0.0) -> dict[str, Any]:
    return {**job_brief(job), "restored_from": job.restored_from,
            "restored_checkpoint_id": job.restored_checkpoint_id, "final_checkpoint_id": job.final_checkpoint_id,
            "checkpoint_mode": getattr(job.checkpoint_settings, "mode", None),
            "checkpoint_interval_s": getattr(job.checkpoint_settings, "interval_s", None),
            "autoscaler": autoscaler_view(job, wall_offset)}


def autoscaler_view(job: JobRecord, wall_offset: float = 0.0) -> dict[str, Any]:
    """The load autoscaler's settings, its last evaluation per vertex and its recent decisions, oldest first
    (coordinator/load_scaler.py); status "off" when the job's config does not enable it."""
    settings = job.config.autoscaler
    state = job.load_scaling
    if settings.enabled and state is not None:
        described = state.describe(wall_offset)
    else:
        described = {"status": "off" if not settings.enabled else "stabilizing", "held": "", "ready_at": None,
                     "vertices": [], "decisions": []}
    return {"enabled": settings.enabled, "dry_run": settings.dry_run,
            "target_utilization": settings.target_utilization,
            "utilization_boundary": settings.utilization_boundary, "window_s": settings.window_s,
            "stabilization_s": settings.stabilization_s, **described}


def _subtask_view(index: int, worker: str | None, stats: Mapping[str, Any] | None,
                  wall_offset: float = 0.0) -> dict[str, Any]:
    st = stats or {}
    ratio = float(st.get("backpressured_ratio", 0.0))
    sampled = st.get("sampled_at")
    return {"subtask": index, "worker": worker, "state": st.get("state"),
            **watermark_view(st.get("current_watermark"), float(sampled) if sampled is not None else None,
                             wall_offset),
            "records_in": int(st.get("records_in", 0)), "records_out": int(st.get("records_out", 0)),
            "records_in_per_s": float(st.get("records_in_per_s", 0.0)),
            "records_out_per_s": float(st.get("records_out_per_s", 0.0)),
            "backpressured_ratio": ratio, "busy_ratio": float(st.get("busy_ratio", 0.0)),
            "output_pool_usage": float(st.get("output_pool_usage", 0.0)),
            "input_queue": int(st.get("input_queue", 0)), "output_queue": int(st.get("output_queue", 0)),
            "backpressure": backpressure_level(ratio),
            # the task's connectors' figures as the worker's metric samples (a Kafka source's lag per partition)
            "connectors": list(st.get("connectors") or [])}


def _vertex_watermark(subtasks: list[dict[str, Any]]) -> dict[str, Any]:
    """The vertex's watermark is its lowest subtask's (Flink's low watermark); its lag the largest."""
    statuses = [s["watermark_status"] for s in subtasks]
    if not statuses or None in statuses:
        return {"watermark": None, "watermark_status": None, "watermark_lag_ms": None}
    if "NONE" in statuses:
        return {"watermark": None, "watermark_status": "NONE", "watermark_lag_ms": None}
    active = [s for s in subtasks if s["watermark_status"] == "ACTIVE"]
    if not active:
        return {"watermark": None, "watermark_status": "END", "watermark_lag_ms": None}
    lags = [s["watermark_lag_ms"] for s in active if s["watermark_lag_ms"] is not None]
    return {"watermark": min(s["watermark"] for s in active), "watermark_status": "ACTIVE",
            "watermark_lag_ms": max(lags) if lags else None}


def _saved_graph(job: JobRecord) -> dict[str, Any]:
    """A job without a plan (recovered after it ended): its vertices and totals as last recorded."""
    saved = job.saved_graph or {"vertices": [], "edges": []}
    vertices = [{"id": v["id"], "name": v["name"], "parallelism": v["parallelism"], "records_in_per_s": 0.0,
                 "records_out_per_s": 0.0, "records_in": int(v.get("records_in", 0)),
                 "records_out": int(v.get("records_out", 0)), "backpressured_ratio": 0.0, "backpressure": "OK",
                 "busy_ratio": 0.0, "watermark": None, "watermark_status": None, "watermark_lag_ms": None,
                 "subtasks": []} for v in saved["vertices"]]
    return {"job_id": job.job_id, "vertices": vertices, "edges": list(saved.get("edges", []))}


def job_graph(job: JobRecord, wall_offset: float = 0.0) -> dict[str, Any]:
    """Vertices (chained tasks) with per-subtask figures and their sums, and the edges between them."""
    plan = job.plan
    if plan is None:
        return _saved_graph(job)
    vertices = []
    for v in plan.vertices:
        subtasks = [_subtask_view(i, plan.placement.get(f"{v.id}:{i}"),
                                  job.task_view(job.task_stats.get(f"{job.job_id}/{v.id}:{i}")), wall_offset)
                    for i in range(v.parallelism)]
        worst = max((s["backpressured_ratio"] for s in subtasks), default=0.0)
        vertices.append({
            "id": v.id, "name": v.name, "parallelism": v.parallelism,
            "records_in_per_s": round(sum(s["records_in_per_s"] for s in subtasks), 2),
            "records_out_per_s": round(sum(s["records_out_per_s"] for s in subtasks), 2),
            "records_in": sum(s["records_in"] for s in subtasks),
            "records_out": sum(s["records_out"] for s in subtasks),
            "backpressured_ratio": worst, "backpressure": backpressure_level(worst),
            "busy_ratio": max((s["busy_ratio"] for s in subtasks), default=0.0),
            **_vertex_watermark(subtasks),
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
            "last_completed": job.last_checkpoint_document(), "figures": declaration(), "history": items}


def restarts_view(job: JobRecord) -> dict[str, Any]:
    return {"job_id": job.job_id, "restarts": job.restarts, "failures": list(job.failures[-50:]),
            "restart_s": list(job.restart_s[-50:]), "last_restart_s": job.last_restart_s,
            "rescale_s": list(job.rescale_s[-50:]), "restored_checkpoint_id": job.restored_checkpoint_id}


def exceptions_view(job: JobRecord, limit: int) -> dict[str, Any]:
    """The job's exception history, newest first: cause, traceback, and the restart it caused."""
    entries = [e.to_dict() for e in job.exceptions.entries()][-limit:]
    return {"job_id": job.job_id, "restarts": job.restarts, "exceptions": entries[::-1]}


def _plain(value: Any) -> Any:
    """A settings object as JSON-ready values: its document if it has one (JobConfig), a dataclass as a dict."""
    if hasattr(value, "to_document"):
        return value.to_document()
    if is_dataclass(value) and not isinstance(value, type):
        return asdict(value)
    return value


def config_view(job: JobRecord) -> dict[str, Any]:
    """What the job was submitted with: its entry, job config, checkpoint settings and restart strategy."""
    return {"job_id": job.job_id, "entry": job.entry, "name": job.name, "sys_path": job.sys_path,
            "restored_from": job.restored_from, "config": _plain(job.config),
            "checkpoint": _plain(job.checkpoint_settings), "restart": _plain(job.restart_strategy)}


def worker_view(w: WorkerRecord, now: float, tasks: int = 0, scheme: str = "http") -> dict[str, Any]:
    """A worker with its process figures (from heartbeats) and how many of its slots hold tasks."""
    process = w.process or {}
    return {"worker_id": w.worker_id, "host": w.host, "data_port": w.data_port, "slots": w.slots,
            "metrics_port": w.metrics_port, "pid": w.pid,
            "metrics_url": f"{scheme}://{w.host}:{w.metrics_port}/metrics" if w.metrics_port else None,
            "last_heartbeat_s_ago": round(max(0.0, now - w.last_heartbeat), 3),
            "rss_bytes": process.get("rss_bytes"), "cpu_s": process.get("cpu_s"),
            "cpu_ratio": process.get("cpu_ratio"), "tasks": tasks}


def tasks_on(jobs: Iterable[JobRecord], worker_id: str) -> list[dict[str, Any]]:
    """The subtasks of running jobs placed on one worker, with their latest figures."""
    out = []
    for job in jobs:
        if job.plan is None or job.terminal:
            continue
        names = {v.id: v.name for v in job.plan.vertices}
        for task, worker in sorted(job.plan.placement.items()):
            if worker != worker_id:
                continue
            st = job.task_stats.get(f"{job.job_id}/{task}") or {}
            vertex, _, subtask = task.partition(":")
            out.append({"job_id": job.job_id, "task": task, "name": names.get(int(vertex), task),
                        "subtask": int(subtask), "state": st.get("state"),
                        "records_in": int(st.get("records_in", 0)), "records_out": int(st.get("records_out", 0))})
    return out


def profile_view(reply: Mapping[str, Any]) -> dict[str, Any]:
    """A worker's profile (the `profile` reply, runtime/graph/replies.py Profile) as the REST API answers it:
    each stack with its thread, its task (None for threads that are no task's: the event loop is MainThread)
    and its frames root first; and per thread its samples, most first, for the UI's choice of one task."""
    stacks = [{"thread": thread, "task": task, "frames": frames.split(";") if frames else [], "samples": samples}
              for thread, task, frames, samples in reply["stacks"]]
    threads: dict[str, dict[str, Any]] = {}
    for s in stacks:
        entry = threads.setdefault(s["thread"], {"thread": s["thread"], "task": s["task"], "samples": 0})
        entry["samples"] += s["samples"]
    return {"worker_id": reply["worker_id"], "seconds": reply["seconds"], "rate_hz": reply["rate_hz"],
            "samples": reply["samples"], "dropped_samples": reply.get("dropped_samples", 0),
            "threads": sorted(threads.values(), key=lambda t: (-t["samples"], t["thread"])), "stacks": stacks}
