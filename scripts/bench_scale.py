#!/usr/bin/env python
"""Scale benchmark (issue 22): deploy time, checkpoint duration and coordinator CPU at 10 to 1,000 tasks.

Job (defined in this file, `bench_scale:build`): unbounded GeneratorSource at a low rate -> map ->
key_by -> keyed count -> DiscardSink, every vertex at parallelism P (SLUICE_BENCH_SCALE_P, set before the
cluster starts and inherited by its processes). Source+map and count+sink chain, so the job has 2P tasks.

For every task count (--tasks) the script starts a fresh local cluster (a coordinator and
ceil(tasks / --slots) workers) and measures:

- deploy time: submit RPC -> the job RUNNING with every task reporting statistics (the tasks report with
  their 1 s heartbeat, so this is an upper bound by up to about 1 s);
- the coordinator's CPU seconds over the deployment;
- coordinator CPU per second while idle (heartbeats and task reports only), over --idle s before the
  checkpoints and again after them (the mean of the two is the idle rate);
- --checkpoints checkpoints triggered one after another by RPC (interval off): the median duration the
  coordinator records (trigger -> last acknowledgement), the median round trip of the RPC (request ->
  `_metadata` written and the tasks told), and the coordinator's CPU seconds per checkpoint (utime+stime from
  /proc/<pid>/stat before and after, raw and minus the idle rate over the same wall time);
- the workers' CPU per second together, idle (before the checkpoints) and during the checkpoints;
- the load average before and after, and the resident memory of the coordinator and of all workers.

With --profile DIR, py-spy records the coordinator (collapsed stacks, `<tasks>-deploy.txt` over the deployment
and `<tasks>-checkpoints.txt` over the checkpoints), and the first worker likewise (`<tasks>-worker-...`,
and `<tasks>-worker-idle.txt` over the idle measurement).

Every process is stopped by PID (terminate -> wait -> kill) in a finally.

    .venv/bin/python scripts/bench_scale.py --tasks 10 100 1000 --slots 10 [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

SCRIPTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(SCRIPTS)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from runtime.api import DiscardSink, GeneratorSource, Job  # noqa: E402
from runtime.examples.wordcount import Count  # noqa: E402

ENTRY = "bench_scale:build"
PARALLELISM_ENV = "SLUICE_BENCH_SCALE_P"
RATE_PER_SOURCE = 20.0  # records/s per source subtask: the load stays low, so the figures are the overhead
CLK_TCK = os.sysconf("SC_CLK_TCK")
CALL_TIMEOUT_S = 180.0
STATUS_POLL_S = 0.25  # a 1,000-task status answer is large: do not poll the coordinator harder


# -- the job (runs in the cluster's processes) ---------------------------------------------


def build(job: Job) -> None:
    p = int(os.environ.get(PARALLELISM_ENV, "5"))
    job.max_parallelism = max(job.max_parallelism, p)  # the default 128 would refuse P = 500
    (job.source(GeneratorSource(count=None, keys=1000, seed=7, records_per_second=RATE_PER_SOURCE),
                parallelism=p)
        .map(lambda r: r, parallelism=p)
        .key_by(lambda r: r[0])
        .process(Count(), parallelism=p)
        .sink(DiscardSink()))


# -- measurement ------------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """utime + stime of `pid` in seconds (fields 14 and 15 of /proc/<pid>/stat)."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def rss_mib(pid: int, field: str = "VmRSS") -> float:
    """A field of /proc/<pid>/status in MiB (VmRSS now, VmHWM the peak); 0 for a process that is gone."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def total_cpu_seconds(pids: list[int]) -> float:
    """utime + stime of all `pids` (a process that is gone counts 0)."""
    total = 0.0
    for pid in pids:
        try:
            total += cpu_seconds(pid)
        except OSError:
            pass
    return total


async def call(cluster: Any, method: str, args: dict[str, Any]) -> Any:
    """A call on its own connection, as LocalCluster.call, but waiting up to CALL_TIMEOUT_S for the handshake and
    the answer: 100 workers deploying at once on 2 cores keep the coordinator from answering for tens of seconds."""
    from netstack.errors import NetstackError
    from runtime.cli.client import open_link

    host, port = cluster.rpc
    deadline = time.monotonic() + CALL_TIMEOUT_S
    while True:  # the connection again when its handshake timed out (before the call was sent: no call twice)
        try:
            link = await open_link(host, port, cluster.token, CALL_TIMEOUT_S, cluster.tls)
            break
        except NetstackError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(1.0)
    try:
        return await link.call(method, args, timeout_s=CALL_TIMEOUT_S)
    finally:
        link.close("done")


async def idle_rate(pid: int, seconds: float, workers: list[int] | None = None) -> tuple[float, float]:
    """The process's CPU seconds per second over `seconds`, and the workers' together."""
    workers = workers or []
    c0, k0, w0 = cpu_seconds(pid), total_cpu_seconds(workers), time.monotonic()
    await asyncio.sleep(seconds)
    wall = time.monotonic() - w0
    return (cpu_seconds(pid) - c0) / wall, (total_cpu_seconds(workers) - k0) / wall


class Profiler:
    """py-spy recording one process into one file, from `start()` to `stop()` (SIGINT: it writes the file)."""

    def __init__(self, directory: str | None, pid: int) -> None:
        self.directory, self.pid = directory, pid
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, name: str) -> None:
        if self.directory is None:
            return
        py_spy = os.path.join(os.path.dirname(sys.executable), "py-spy")
        self.proc = subprocess.Popen([py_spy, "record", "--pid", str(self.pid), "--rate", "50", "--nonblocking",
                                      "--format", "raw", "-o", os.path.join(self.directory, name)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def stop(self) -> None:
        if self.proc is None:
            return
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None


async def measure(tasks: int, slots: int, checkpoints: int, idle_s: float, buffers: int,
                  heartbeat_timeout_s: float, keep_logs: bool = False,
                  profile_dir: str | None = None, result: dict[str, Any] | None = None) -> dict[str, Any]:
    from runtime.cli.local_cluster import LocalCluster

    p = max(1, tasks // 2)
    workers = max(1, math.ceil(2 * p / slots))
    cluster = LocalCluster(workers=workers, slots=slots, restart_workers=False,
                           link_timeout_s=max(10.0, heartbeat_timeout_s),
                           log_dir=tempfile.mkdtemp(prefix="sluice-scale-") if keep_logs else None,
                           env_overrides={PARALLELISM_ENV: str(p)})
    result = {} if result is None else result  # the caller's: what was measured stays when a later step fails
    result.update({"tasks_asked": tasks, "workers": workers, "slots": slots})
    if keep_logs:
        print(f"bench_scale: {tasks} tasks: logs in {cluster.log_dir}", file=sys.stderr)
    profiler: Profiler | None = None
    worker_profiler: Profiler | None = None
    try:
        t0 = time.monotonic()
        # the lease and the workers' link timeout follow the heartbeat timeout: on 2 cores a 1,000-task
        # deployment stalls the coordinator's event loop for longer than their defaults (5 s, 10 s)
        cluster.start_coordinator("--heartbeat-timeout", str(heartbeat_timeout_s), "--allowed-job-path", SCRIPTS,
                                  "--lease-timeout", str(max(5.0, heartbeat_timeout_s)))
        for _ in range(workers):
            cluster.start_worker()
        await cluster.wait_workers(timeout_s=300.0)
        result["cluster_start_s"] = time.monotonic() - t0
        coordinator_pid = cluster.coordinator.pid if cluster.coordinator else 0
        config = {"buffers_per_channel": buffers,
                  "checkpoint": {"interval_s": None, "mode": "aligned", "timeout_s": 120.0,
                                 "tolerable_failures": 100, "min_pause_s": 0}}
        result["load_before"] = os.getloadavg()[0]
        profiler = Profiler(profile_dir, coordinator_pid)
        worker_profiler = Profiler(profile_dir, cluster.worker_procs[0].pid)  # one worker: they are alike
        profiler.start(f"{tasks}-deploy.txt")
        worker_profiler.start(f"{tasks}-worker-deploy.txt")
        deploy_cpu0 = cpu_seconds(coordinator_pid)
        submit_at = time.monotonic()
        submitted = await call(cluster, "submit", {"entry": ENTRY, "name": f"bench-scale-{tasks}",
                                                  "config": config, "sys_path": SCRIPTS})
        job_id = result["job_id"] = submitted["job_id"]
        result["tasks"] = submitted["tasks"]
        deadline = submit_at + 600.0
        while True:
            summary = await call(cluster, "status", {"job_id": job_id})
            if summary["state"] in ("FAILED", "CANCELLED", "FINISHED"):
                raise RuntimeError(f"job {job_id} ended {summary['state']}: {summary.get('error', '')}")
            if summary["state"] == "RUNNING" and len(summary["tasks"]) == summary["tasks_total"]:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"job {job_id} did not run all its tasks within 600 s")
            await asyncio.sleep(STATUS_POLL_S)
        result["deploy_s"] = time.monotonic() - submit_at
        result["coordinator_deploy_cpu_s"] = cpu_seconds(coordinator_pid) - deploy_cpu0
        profiler.stop()
        worker_profiler.stop()

        # idle: heartbeats and task reports only, before the checkpoints and again after them (their mean is
        # subtracted: at 1,000 tasks a checkpoint lasts seconds, so the heartbeats' share is most of its CPU)
        await asyncio.sleep(2.0)
        worker_pids = [w.pid for w in cluster.worker_procs]
        worker_profiler.start(f"{tasks}-worker-idle.txt")
        idle_before, workers_idle = await idle_rate(coordinator_pid, idle_s, worker_pids)
        worker_profiler.stop()

        durations: list[float] = []
        cycles: list[float] = []
        profiler.start(f"{tasks}-checkpoints.txt")
        worker_profiler.start(f"{tasks}-worker-checkpoints.txt")
        c0, w0, k0 = cpu_seconds(coordinator_pid), time.monotonic(), total_cpu_seconds(worker_pids)
        for _ in range(checkpoints):
            asked = time.monotonic()
            done = await call(cluster, "checkpoint", {"job_id": job_id, "timeout_s": 150.0})
            cycles.append(time.monotonic() - asked)
            if isinstance(done, dict) and done.get("duration_s") is not None:
                durations.append(float(done["duration_s"]))
        wall = time.monotonic() - w0
        cpu = cpu_seconds(coordinator_pid) - c0
        workers_cpu = total_cpu_seconds(worker_pids) - k0
        profiler.stop()
        worker_profiler.stop()
        idle_after, _ = await idle_rate(coordinator_pid, idle_s)
        idle = (idle_before + idle_after) / 2
        result.update({"workers_idle_cpu_per_s": workers_idle,
                       "workers_cpu_during_checkpoints_per_s": workers_cpu / wall,
                       "coordinator_idle_cpu_per_s": idle, "idle_before": idle_before, "idle_after": idle_after,
                       "checkpoint_rpc_median_s": statistics.median(cycles),
                       "coordinator_rss_mib": rss_mib(coordinator_pid),
                       "workers_rss_mib": sum(rss_mib(w.pid) for w in cluster.worker_procs),
                       "load_after": os.getloadavg()[0]})
        history = (await call(cluster, "checkpoints", {"job_id": job_id}))["history"]
        completed = [h for h in history if h["status"] == "COMPLETED" and h["duration_s"] is not None]
        if len(durations) < checkpoints:  # the RPC's answer did not carry the duration: read the history
            durations = [h["duration_s"] for h in completed]
        result.update({
            "checkpoints_completed": len(completed),
            "checkpoint_median_s": statistics.median(durations) if durations else None,
            "checkpoint_max_s": max(durations) if durations else None,
            "coordinator_cpu_per_checkpoint_s": cpu / checkpoints,
            "coordinator_cpu_per_checkpoint_net_s": max(0.0, cpu - idle * wall) / checkpoints,
            "coordinator_cpu_during_checkpoints_per_s": cpu / wall,
        })
        try:
            await call(cluster, "cancel", {"job_id": job_id})
        except Exception:  # noqa: BLE001 - the cluster is stopped next anyway
            pass
    finally:
        if sys.exc_info()[0] is not None and result.get("job_id"):  # why the job stopped, for the row
            try:
                status = await asyncio.wait_for(call(cluster, "status", {"job_id": result["job_id"]}), 60.0)
                result["job_state"], result["job_failures"] = status.get("state"), status.get("failures")
            except Exception:  # noqa: BLE001 - the row says what it can
                pass
        for running in (profiler, worker_profiler):
            if running is not None:
                running.stop()
        for worker in cluster.worker_procs:  # all at once: one by one, 100 loaded workers take minutes to stop
            if worker.proc.poll() is None:
                worker.proc.terminate()
        cluster.stop()  # every worker, then the coordinator: terminate -> wait -> kill, by PID
    return result


def show(rows: list[dict[str, Any]]) -> None:
    def f(v: Any, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    print(f"{'tasks':>6} {'workers':>7} {'start s':>8} {'deploy s':>9} {'cp med s':>9} {'cp max s':>9} "
          f"{'rpc med s':>9} {'coord cpu/cp s':>15} {'net cpu/cp s':>13} {'idle cpu/s':>11} {'cp cpu/s':>9}")
    for r in rows:
        print(f"{r.get('tasks', r['tasks_asked']):>6} {r['workers']:>7} {f(r.get('cluster_start_s'), '.1f'):>8} "
              f"{f(r.get('deploy_s'), '.2f'):>9} {f(r.get('checkpoint_median_s'), '.3f'):>9} "
              f"{f(r.get('checkpoint_max_s'), '.3f'):>9} {f(r.get('checkpoint_rpc_median_s'), '.3f'):>9} "
              f"{f(r.get('coordinator_cpu_per_checkpoint_s'), '.3f'):>15} "
              f"{f(r.get('coordinator_cpu_per_checkpoint_net_s'), '.3f'):>13} "
              f"{f(r.get('coordinator_idle_cpu_per_s'), '.3f'):>11} "
              f"{f(r.get('coordinator_cpu_during_checkpoints_per_s'), '.3f'):>9}"
              + (f"  ERROR {r['error']}" if "error" in r else ""))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", type=int, nargs="+", default=[10, 100, 1000])
    ap.add_argument("--slots", type=int, default=10, help="slots per worker (workers = tasks / slots)")
    ap.add_argument("--checkpoints", type=int, default=5)
    ap.add_argument("--idle", type=float, default=5.0, help="seconds of idle coordinator CPU measurement")
    ap.add_argument("--buffers", type=int, default=2, help="buffers per channel (P x P keyed channels)")
    ap.add_argument("--heartbeat-timeout", type=float, default=10.0,
                    help="the coordinator's; 100 workers deploying 1,000 tasks on 2 cores miss the default 10 s")
    ap.add_argument("--keep-logs", action="store_true", help="keep the processes' logs (their directory is printed)")
    ap.add_argument("--profile", metavar="DIR", help="py-spy the coordinator over deploy and checkpoints into DIR")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = []
    for tasks in args.tasks:
        row: dict[str, Any] = {}
        try:
            asyncio.run(measure(tasks, args.slots, args.checkpoints, args.idle, args.buffers,
                                args.heartbeat_timeout, args.keep_logs, args.profile, row))
        except Exception as exc:  # noqa: BLE001 - one size failing still reports the others
            row.setdefault("tasks_asked", tasks)
            row.setdefault("workers", max(1, math.ceil(tasks / args.slots)))
            row["error"] = repr(exc)
        rows.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
    show(rows)
    if args.json:
        print(json.dumps(rows, indent=2))
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
