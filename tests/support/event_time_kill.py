"""The kill -9 run of the event-time tests (tests/integration/test_event_time.py, test_windows.py): three named
workers, a job with unaligned checkpoints every 0.5 s and fixed-delay restarts, the worker running a chosen
task killed once the test's condition holds and started again, and committed rows compared with a model."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.support.cluster import Cluster, committed_rows, kill_worker, logs, poll
from tests.support.failover import WORKER_ARGS, restart_worker


def run_killed(cluster: Cluster, entry: str, buffer_bytes: int, ready: Callable[[str, dict[str, Any]], bool],
               victim_task: str, *, what: str, timeout_s: float = 240) -> dict[str, Any]:
    """Start three workers, submit `entry`, and once `ready(job_id, status)` holds kill -9 the worker running the first
    task whose name holds `victim_task`, then start it again; returns the final status (FINISHED, restarted)."""
    cluster.start(3, worker_args=WORKER_ARGS, worker_ids=True)
    job_id = cluster.submit(entry, {
        "buffer_bytes": buffer_bytes, "buffers_per_channel": 4,
        "checkpoint": {"interval_s": 0.5, "mode": "unaligned", "timeout_s": 20, "tolerable_failures": 3},
        "restart": {"kind": "fixed", "max_attempts": 3, "delay_s": 0.5, "slot_wait_s": 60}})
    found: dict[str, Any] = {}

    def ready_to_kill() -> bool:
        st = cluster.call("status", {"job_id": job_id})
        assert st["state"] in ("CREATED", "DEPLOYING", "RUNNING"), f"{st}\n{logs(cluster)}"
        found.clear()
        found.update(st)
        return ready(job_id, st) and any(victim_task in t["name"] for t in st["tasks"])

    poll(ready_to_kill, 90, what)
    victim = next(t["worker"] for t in found["tasks"] if victim_task in t["name"])
    kill_worker(cluster, victim)
    restart_worker(cluster, victim)
    st = cluster.wait_job(job_id, timeout_s)
    assert st["state"] == "FINISHED", f"{st}\n{logs(cluster)}"
    assert st["restarts"] >= 1, st
    return dict(st)


def assert_committed_exactly(expected: dict[str, tuple[Path, Counter[str]]]) -> None:
    """Each output directory (`name -> (directory, expected lines)`) holds exactly its expected lines once its
    last commit is in (no in-progress files left)."""
    directories = [d for d, _ in expected.values()]
    poll(lambda: not any(committed_rows(d)[1] for d in directories), 15, "the final commits")
    for name, (directory, lines) in expected.items():
        rows, _ = committed_rows(directory)
        missing, extra = lines - rows, rows - lines
        assert not missing and not extra, (f"{name}: {sum(missing.values())} missing, e.g. {list(missing)[:5]}; "
                                           f"{sum(extra.values())} extra, e.g. {list(extra)[:5]}")
