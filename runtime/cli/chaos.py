"""Chaos runs: the Parquet word count under backpressure while worker processes are killed with SIGKILL,
and (with `link_cuts`) while worker-to-worker links are cut in network namespaces.

Used by tests/chaos (a small run in CI), scripts/chaos.sh (the full run, repeated) and the demo. A run
generates its input with Spark (`sluice data generate`), starts a local cluster whose supervisor starts
killed workers again, runs the job with checkpoints every `interval_s`, kills workers on a schedule, and
finally checks the committed output with Spark (`sluice data verify`). The schedule always includes a
kill while a checkpoint is in flight and a kill of a worker that hosts the sink; the rest are random.

A coordinator kill (`kill_coordinator`) SIGKILLs the coordinator mid-job and starts a new one on the same
state directory and port: the workers re-register by themselves and the new coordinator recovers the job from
its records, from the latest complete checkpoint, with nothing resubmitted; the output must still verify exactly.

A link cut (`LinkCutFault`) runs each worker in its own namespace (runtime/cli/netns.py), silences the veth
pair between two workers that host tasks, and heals it once the job has noticed (the link timeout fired
and the job left RUNNING); it records how long detection and the restart took.

A wipe (`wipes`) deletes the job's whole checkpoint directory while it runs (a wiped or lifecycle-expired bucket);
the next fault waits for a checkpoint completed after it, so the restart finds one and the output stays exact (with
none, the job would fail with one line naming the missing checkpoint, never replay its input over committed
output: tests/integration/test_missing_checkpoints.py). A partition (`partition_s`) cuts every worker-to-worker
link of a worker hosting the job for that long (network namespaces, as link cuts), then heals them: the restarts
meanwhile fail, and the default restart strategy (exponential, counted in a window) must outlast it.

A rescale (`rescales`) runs what `sluice rescale` does between the kills: the coordinator checkpoints the running
job in its own mode, stops it and redeploys it at a parallelism drawn from the run's seeded random generator
(every operator, 1 to `max_rescale_parallelism`, never the current one); a refusal (too few slots while a killed
worker is away, a checkpoint aborted by a kill) is logged and tried again a little later. The output must still
verify exactly.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from netstack.errors import NetstackError
from netstack.transport import run
from runtime.cli.local_cluster import LocalCluster
from runtime.cli.netns import NetnsLab
from runtime.graph import protocol as p


@dataclass(frozen=True)
class ChaosSettings:
    workdir: str
    rows: int = 2_000_000
    keys: int = 1000
    partitions: int = 4
    mode: str = "unaligned"  # or aligned_timeout
    aligned_timeout_s: float = 0.1
    interval_s: float = 0.5
    kills: int = 3
    workers: int = 3
    parallelism: int = 2
    sink_delay_s: float = 0.00002
    seed: int = 7
    job_timeout_s: float = 900.0
    link_cuts: int = 0  # > 0: workers run in network namespaces and this many worker-to-worker links are cut
    link_timeout_s: float = 2.0
    coordinator_kills: int = 0  # SIGKILL the coordinator this many times; the job is resubmitted with a restore
    rescales: int = 0  # rescale the running job this many times, between the kills, to a random parallelism
    wipes: int = 0  # delete the job's checkpoint directory this many times (each before a worker kill)
    partition_s: float = 0.0  # > 0: once, cut a worker hosting the job off from every other worker this long
    max_rescale_parallelism: int = 4  # fits the slots left while one of 3 workers (2 slots each) is away
    # > 0: the windowed job (runtime/examples/windowcount.py:build_parquet) over input out of order by up to
    # jitter_ms, instead of the word count; Spark verifies its windows and its late records
    window_ms: int = 0
    jitter_ms: int = 0
    max_delay_ms: int = 0
    allowed_lateness_ms: int = 0

    @property
    def entry(self) -> str:
        job = "windowcount" if self.window_ms else "wordcount"
        return f"runtime.examples.{job}:build_parquet"


@dataclass
class ChaosResult:
    ok: bool
    verify: dict[str, Any]
    state: str
    kills: list[dict[str, Any]] = field(default_factory=list)
    link_cuts: list[dict[str, Any]] = field(default_factory=list)
    wipes: list[dict[str, Any]] = field(default_factory=list)
    partitions: list[dict[str, Any]] = field(default_factory=list)
    rescales: list[dict[str, Any]] = field(default_factory=list)
    rescales_refused: int = 0
    restarts: int = 0
    restart_s: list[float] = field(default_factory=list)
    checkpoint_s: list[float] = field(default_factory=list)
    checkpoints_completed: int = 0
    checkpoints_failed: int = 0
    inflight_bytes: list[int] = field(default_factory=list)
    job_s: float = 0.0
    error: str = ""


def sluice_cli(*args: str, timeout_s: float = 600.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "runtime.cli", *args], capture_output=True, text=True,
                          timeout=timeout_s)


def generate_input(settings: ChaosSettings, log: Callable[[str], None], spark: Any = None) -> str:
    """Generate the Parquet input once per (rows, keys, seed, partitions, jitter): later runs reuse it. With a
    SparkSession, in it (the tests share one: its JVM starts once), else with `sluice data generate`."""
    path = os.path.join(settings.workdir, f"input-{settings.rows}-{settings.keys}-{settings.seed}-"
                                          f"{settings.partitions}-{settings.jitter_ms}")
    if os.path.exists(os.path.join(path, "_SUCCESS")):
        return path
    t0 = time.monotonic()
    if spark is not None:
        from runtime.data.generate import generate

        generate(spark, path, rows=settings.rows, keys=settings.keys, partitions=settings.partitions,
                 seed=settings.seed, jitter_ms=settings.jitter_ms)
        log(f"generated {settings.rows:,} rows with Spark in {time.monotonic() - t0:.1f}s: {path}")
        return path
    proc = sluice_cli("data", "generate", path, "--rows", str(settings.rows), "--keys", str(settings.keys),
                      "--partitions", str(settings.partitions), "--seed", str(settings.seed),
                      "--jitter-ms", str(settings.jitter_ms))
    if proc.returncode != 0:
        raise RuntimeError(f"sluice data generate failed: {proc.stdout}{proc.stderr}")
    log(f"generated {settings.rows:,} rows with Spark in {time.monotonic() - t0:.1f}s: {path}")
    return path


def verify_output(input_path: str, output_path: str, settings: ChaosSettings | None = None,
                  late_path: str | None = None, spark: Any = None) -> dict[str, Any]:
    """`sluice data verify --json`'s result; with a SparkSession, computed in it (the same function)."""
    if spark is not None:
        from runtime.data.verify import EventTimeOptions, verify

        options = EventTimeOptions()
        if settings is not None and settings.window_ms:
            options = EventTimeOptions(window_ms=settings.window_ms, max_delay_ms=settings.max_delay_ms,
                                       allowed_lateness_ms=settings.allowed_lateness_ms, late_output=late_path)
        return verify(spark, input_path, output_path, "window-count" if options.window_ms else "wordcount",
                      options).to_json()
    query = ["--query", "wordcount"]
    if settings is not None and settings.window_ms:
        query = ["--query", "window-count", "--window-ms", str(settings.window_ms),
                 "--max-delay-ms", str(settings.max_delay_ms),
                 "--allowed-lateness-ms", str(settings.allowed_lateness_ms)]
        if late_path is not None:
            query += ["--late-output", late_path]
    proc = sluice_cli("data", "verify", "--input", input_path, "--output", output_path, *query, "--json")
    start = proc.stdout.find("{")
    try:
        result: dict[str, Any] = json.loads(proc.stdout[start:]) if start >= 0 else {}
    except json.JSONDecodeError:
        result = {}
    if not result:
        return {"ok": False, "summary": f"verify printed no result (status {proc.returncode}): "
                                        f"{proc.stdout}{proc.stderr}"}
    return result


def sink_workers(status: dict[str, Any], sink_kind: str = "FileSink") -> list[str]:
    sink_vertices = {str(v["id"]) for v in status.get("vertices", []) if sink_kind in v["name"]}
    return sorted({w for task, w in status.get("placement", {}).items() if task.split(":")[0] in sink_vertices})


@dataclass
class LinkCutFault:
    """Cuts worker-to-worker links one at a time: after a checkpoint, heal once the job noticed the cut."""

    lab: NetnsLab
    remaining: int
    link_timeout_s: float
    rng: random.Random
    next_at: float
    cuts: list[dict[str, Any]] = field(default_factory=list)
    _open: dict[str, Any] | None = None  # the cut in progress
    _seen: int = 0  # checkpoints completed when the last cut healed: the next cut waits for a newer one

    @property
    def busy(self) -> bool:
        return self._open is not None

    def _pick_pair(self, status: dict[str, Any]) -> tuple[int, int] | None:
        """Two workers joined by a data channel of the job: one hosts vertex v, the other vertex v + 1 (the
        word count's edges are all-to-all), so the cut link really carries its data."""
        vertices: dict[int, set[int]] = {}
        for task, worker in status.get("placement", {}).items():
            vertices.setdefault(int(worker.rsplit("-", 1)[1]) - 1, set()).add(int(task.split(":")[0]))
        pairs = [(i, j) for i in vertices for j in vertices
                 if i < j and any(v + 1 in vertices[j] or v - 1 in vertices[j] for v in vertices[i])]
        return self.rng.choice(sorted(pairs)) if pairs else None

    def tick(self, status: dict[str, Any], now: float, t0: float, log: Callable[[str], None]) -> None:
        cut = self._open
        if cut is not None:
            noticed = status["state"] != "RUNNING" or status.get("restarts", 0) > cut["restarts_before"]
            # heal when the job noticed, or give up waiting after three timeouts (recorded as undetected)
            if noticed or now - cut["t"] > 3 * self.link_timeout_s + 5:
                cut["detected_s"] = round(now - cut["t"], 2) if noticed else None
                cut["cut_for_s"] = round(self.lab.heal(*cut["pair"]), 2)
                log(f"  [{now - t0:5.1f}s] link {cut['workers'][0]}<->{cut['workers'][1]} healed after "
                    f"{cut['cut_for_s']:.2f}s; " + (f"job noticed after {cut['detected_s']:.2f}s" if noticed
                                                     else "the job never noticed"))
                self.cuts.append({k: v for k, v in cut.items() if k != "t"})
                self._open = None
                self._seen = status.get("checkpoints_completed", 0)
                self.next_at = now + self.rng.uniform(1.5, 3.0)
            return
        done = status.get("checkpoints_completed", 0)
        if not self.remaining or status["state"] != "RUNNING" or now < self.next_at or done <= self._seen:
            return
        pair = self._pick_pair(status)
        if pair is None:
            return
        self.lab.cut(pair[0], pair[1])
        self.remaining -= 1
        self._open = {"at_s": round(now - t0, 2), "pair": pair, "workers": [f"worker-{i + 1}" for i in pair],
                      "t": now, "restarts_before": status.get("restarts", 0),
                      "last_checkpoint": (status.get("last_checkpoint") or {}).get("checkpoint_id")}
        log(f"  [{now - t0:5.1f}s] cut link worker-{pair[0] + 1}<->worker-{pair[1] + 1} (link timeout "
            f"{self.link_timeout_s}s); last completed checkpoint #{self._open['last_checkpoint']}")


def latest_complete_checkpoint(state_dir: str, job_id: str) -> tuple[int, str] | None:
    """The newest `chk-<n>` of the job with a `_metadata` (written last: without it, not a checkpoint)."""
    job_dir = os.path.join(state_dir, "checkpoints", job_id)
    found = []
    for name in os.listdir(job_dir) if os.path.isdir(job_dir) else []:
        number = name.removeprefix("chk-")
        if name.startswith("chk-") and number.isdigit() and os.path.isfile(os.path.join(job_dir, name, "_metadata")):
            found.append((int(number), os.path.join(job_dir, name)))
    return max(found) if found else None


async def kill_coordinator(cluster: LocalCluster, job_id: str, log: Callable[[str], None],
                           t0: float) -> dict[str, Any]:
    """SIGKILL the coordinator and start a new one on the same state directory and port; it recovers the job
    by itself (coordinator/job_store.py). Returns what happened once the job runs again."""
    assert cluster.coordinator is not None and cluster.state_dir is not None
    killed_at = time.monotonic()
    old = cluster.coordinator
    port = cluster.rpc[1]
    os.kill(old.pid, signal.SIGKILL)
    await asyncio.to_thread(old.proc.wait, 10)
    latest = latest_complete_checkpoint(cluster.state_dir, job_id)
    log(f"  [{killed_at - t0:5.1f}s] kill -9 coordinator (pid {old.pid}); latest complete checkpoint "
        f"{f'#{latest[0]}' if latest else 'none'}")
    # the same port: the workers' heartbeat loops dial it again and re-register
    await asyncio.to_thread(cluster.start_coordinator, "--port", str(port))
    await cluster.wait_workers(60.0)
    status: dict[str, Any] = {}
    deadline = time.monotonic() + 60.0
    while time.monotonic() < deadline:
        status = (await cluster.ask(p.JobStatus(job_id))).to_wire()
        if status["state"] != "RESTARTING" and status["state"] != "DEPLOYING":
            break
        await asyncio.sleep(0.05)
    record = {"at_s": round(killed_at - t0, 2), "kind": "coordinator", "job": job_id,
              "restored_checkpoint": status.get("restored_checkpoint_id"),
              "recovered_after_s": round(time.monotonic() - killed_at, 2)}
    log(f"  [{time.monotonic() - t0:5.1f}s] new coordinator pid {cluster.coordinator.pid} recovered {job_id}: "
        f"{status.get('state')} from checkpoint #{record['restored_checkpoint']} "
        f"{record['recovered_after_s']:.2f}s after the kill")
    return record


def fault_plan(kills: int, coordinator_kills: int, rescales: int, rng: random.Random, *, wipes: int = 0,
               partitions: int = 0) -> list[str]:
    """The order of the faults: the kills shuffled (always one while a checkpoint is in flight and one of a worker
    hosting the sink), then a rescale after each kill, so rescales sit between kills; extra rescales go last. A
    wipe goes right before a worker kill (the kill's restart needs a checkpoint completed after the wipe), a
    partition after the kills."""
    plan = (["in-flight", "sink"] + ["random"] * max(0, kills - 2))[:kills]
    plan += ["coordinator"] * coordinator_kills
    rng.shuffle(plan)
    out: list[str] = []
    for kind in plan:
        if wipes > 0 and kind != "coordinator":
            out.append("wipe")
            wipes -= 1
        out.append(kind)
        if rescales > 0:
            out.append("rescale")
            rescales -= 1
    return out + ["rescale"] * rescales + ["wipe"] * wipes + ["partition"] * partitions


def wipe_checkpoints(state_dir: str, job_id: str) -> list[str]:
    """Delete the job's checkpoint directory, as a wiped or expired bucket would; returns what it held."""
    job_dir = os.path.join(state_dir, "checkpoints", job_id)
    held = sorted(os.listdir(job_dir)) if os.path.isdir(job_dir) else []
    shutil.rmtree(job_dir, ignore_errors=True)
    return held


@dataclass
class PartitionFault:
    """Cuts every worker-to-worker link of one worker for `duration_s`, then heals them all."""

    lab: NetnsLab
    duration_s: float
    record: dict[str, Any] | None = None
    _pairs: list[tuple[int, int]] = field(default_factory=list)
    _until: float = 0.0

    @property
    def busy(self) -> bool:
        return bool(self._pairs)

    def start(self, worker: str, status: dict[str, Any], now: float, t0: float, log: Callable[[str], None]) -> None:
        i = int(worker.rsplit("-", 1)[1]) - 1
        self._pairs = [(min(i, j), max(i, j)) for j in range(len(self.lab.namespaces)) if j != i]
        for a, b in self._pairs:
            self.lab.cut(a, b)
        self._until = now + self.duration_s
        self.record = {"at_s": round(now - t0, 2), "worker": worker, "duration_s": self.duration_s,
                       "restarts_before": status.get("restarts", 0)}
        log(f"  [{now - t0:5.1f}s] partition: {worker} cut off from every other worker for {self.duration_s:g}s")

    def tick(self, status: dict[str, Any], now: float, t0: float, log: Callable[[str], None]) -> bool:
        """Heal once the time is up; True when it healed now."""
        if not self._pairs or now < self._until:
            return False
        for a, b in self._pairs:
            self.lab.heal(a, b)
        self._pairs = []
        assert self.record is not None
        self.record["restarts_during"] = status.get("restarts", 0) - self.record["restarts_before"]
        self.record["state_at_heal"] = status["state"]
        log(f"  [{now - t0:5.1f}s] partition healed; {self.record['restarts_during']} restarts meanwhile, the job "
            f"is {status['state']}")
        return True


def rescale_target(current: int, highest: int, rng: random.Random) -> int:
    """A parallelism from 1 to `highest` other than `current` (`current` itself only if nothing else exists)."""
    choices = [p for p in range(1, max(1, highest) + 1) if p != current]
    return rng.choice(choices) if choices else current


async def rescale_job(cluster: LocalCluster, job_id: str, status: dict[str, Any], highest: int,
                      rng: random.Random, log: Callable[[str], None], t0: float) -> dict[str, Any] | None:
    """Rescale the running job as `sluice rescale` does; None when the coordinator refused (the job runs on)."""
    current = max((v["parallelism"] for v in status.get("vertices", [])), default=1)
    target = rescale_target(current, highest, rng)
    asked = time.monotonic()
    try:
        answer = await cluster.ask(p.Rescale(job_id, {"*": target}, timeout_s=120.0), timeout_s=180.0)
    except NetstackError as exc:
        log(f"  [{asked - t0:5.1f}s] rescale {current} -> {target} refused: {exc}")
        return None
    record = {"at_s": round(asked - t0, 2), "from": current, "to": target, "attempt": answer.attempt,
              "checkpoint_id": answer.checkpoint_id, "mode": answer.mode,
              "inflight_bytes": answer.inflight_bytes, "downtime_s": round(answer.downtime_s, 3),
              "took_s": round(time.monotonic() - asked, 2)}
    log(f"  [{asked - t0:5.1f}s] rescale {current} -> {target} from checkpoint #{record['checkpoint_id']} "
        f"({record['mode']}, {record['inflight_bytes'] or 0:,} bytes in flight): downtime "
        f"{record['downtime_s']:.3f}s, {record['took_s']:.2f}s in all")
    return record


def _submission_config(settings: ChaosSettings) -> dict[str, Any]:
    checkpoint = {"interval_s": settings.interval_s, "mode": settings.mode, "timeout_s": 30.0,
                  "tolerable_failures": 100}
    if settings.mode == "aligned_timeout":
        checkpoint["aligned_timeout_s"] = settings.aligned_timeout_s
    # a partition meets the default restart strategy, which must outlast it; otherwise quick fixed restarts
    config: dict[str, Any] = {"checkpoint": checkpoint}
    if not settings.partition_s:
        config["restart"] = {"kind": "fixed", "max_attempts": settings.kills + 5, "delay_s": 0.2}
    return config


JOB_ENDED = ("FINISHED", "FAILED", "CANCELLED")


@dataclass
class FaultLoop:
    """Watches one job and injects the faults of `plan` in order, each once the job runs and has completed a
    checkpoint since the last fault (of its current attempt), no link cut or partition is under way, and the
    fault's time has come. `FAULTS` maps a fault's kind to the method that injects it."""

    settings: ChaosSettings
    cluster: LocalCluster
    rng: random.Random
    log: Callable[[str], None]
    job_id: str
    t0: float
    plan: list[str]
    result: ChaosResult
    next_fault_at: float
    link_cut: LinkCutFault | None = None
    partition: PartitionFault | None = None
    seen_checkpoints: int = 0  # completed when the last fault came: the next one waits for a newer checkpoint
    attempt: int = 0

    async def watch(self) -> dict[str, Any]:
        """Until the job ends (or is cancelled at the run's timeout); the job's last status."""
        while True:
            status = (await self.cluster.ask(p.JobStatus(self.job_id))).to_wire()
            now = time.monotonic()
            if status["state"] in JOB_ENDED:
                return status
            if now - self.t0 > self.settings.job_timeout_s:
                await self.cluster.ask(p.Cancel(self.job_id))
                self.result.error = f"job did not finish within {self.settings.job_timeout_s}s"
                return status
            for line in await asyncio.to_thread(self.cluster.supervise):
                self.log(f"  [{now - self.t0:5.1f}s] {line}")
            self._observe(status, now)
            if self._fault_due(status, now):
                await FAULTS.get(self.plan[0], FaultLoop._kill_worker)(self, status, now)
            await asyncio.sleep(0.05)

    def _observe(self, status: dict[str, Any], now: float) -> None:
        if status.get("attempt", 0) != self.attempt:  # a new attempt: its own checkpoints count
            self.attempt, self.seen_checkpoints = status.get("attempt", 0), status.get("checkpoints_completed", 0)
        if self.link_cut is not None:
            self.link_cut.tick(status, now, self.t0, self.log)
        if self.partition is not None and self.partition.tick(status, now, self.t0, self.log):
            assert self.partition.record is not None
            self.result.partitions.append(self.partition.record)
            self.next_fault_at = now + self.rng.uniform(1.5, 3.5)

    def _fault_due(self, status: dict[str, Any], now: float) -> bool:
        busy = (self.link_cut is not None and self.link_cut.busy) or (self.partition is not None
                                                                       and self.partition.busy)
        return (bool(self.plan) and status["state"] == "RUNNING" and now >= self.next_fault_at
                and status.get("checkpoints_completed", 0) > self.seen_checkpoints and not busy)

    def _last_checkpoint(self, status: dict[str, Any]) -> int | None:
        return (status.get("last_checkpoint") or {}).get("checkpoint_id")

    async def _wipe(self, status: dict[str, Any], now: float) -> None:
        assert self.cluster.state_dir is not None
        held = await asyncio.to_thread(wipe_checkpoints, self.cluster.state_dir, self.job_id)
        last = self._last_checkpoint(status)
        self.result.wipes.append({"at_s": round(now - self.t0, 2), "deleted": held, "last_checkpoint": last})
        self.log(f"  [{now - self.t0:5.1f}s] wiped the checkpoint store of {self.job_id} "
                 f"({', '.join(held) or 'empty'}); last completed checkpoint #{last}")
        self.plan.pop(0)
        # the next fault waits for a checkpoint triggered after the wipe, so the kill's restart restores one
        # taken after it (one in flight during the wipe fails: its files are gone, storage.missing_files)
        self.seen_checkpoints = status.get("checkpoints_completed", 0) + 1

    async def _partition(self, status: dict[str, Any], now: float) -> None:
        assert self.partition is not None
        hosts = sink_workers(status) or sorted(set(status["placement"].values()))
        self.partition.start(self.rng.choice(hosts), status, now, self.t0, self.log)
        self.plan.pop(0)

    async def _rescale(self, status: dict[str, Any], now: float) -> None:
        record = await rescale_job(self.cluster, self.job_id, status, self.settings.max_rescale_parallelism,
                                   self.rng, self.log, self.t0)
        if record is None:  # refused: try again a little later
            self.result.rescales_refused += 1
            self.next_fault_at = time.monotonic() + 1.0
            return
        self.result.rescales.append(record)
        self.plan.pop(0)
        self.next_fault_at = time.monotonic() + self.rng.uniform(1.5, 3.5)

    async def _kill_coordinator(self, status: dict[str, Any], now: float) -> None:
        self.result.kills.append(await kill_coordinator(self.cluster, self.job_id, self.log, self.t0))
        self.plan.pop(0)
        self.attempt = -1  # the new coordinator counts checkpoints afresh: take its counts as the baseline
        self.next_fault_at = time.monotonic() + self.rng.uniform(1.5, 3.5)

    async def _kill_worker(self, status: dict[str, Any], now: float) -> None:
        """A worker kill of kind sink (a worker hosting a sink), in-flight (while a checkpoint is in flight:
        not yet, when none is) or random; victims host tasks of the job: an idle standby would test nothing."""
        kind = self.plan[0]
        hosts = sorted(set(status.get("placement", {}).values())) or [w.fields["id"]
                                                                       for w in self.cluster.worker_procs]
        victim_id = None
        if kind == "sink":
            victim_id = self.rng.choice(sink_workers(status) or hosts)
        elif kind == "in-flight":
            history = (await self.cluster.ask(p.Checkpoints(self.job_id))).history
            if history and history[-1]["status"] == "IN_PROGRESS":
                victim_id = self.rng.choice(hosts)
        else:
            victim_id = self.rng.choice(hosts)
        if victim_id is None:
            return
        victim = next(w for w in self.cluster.worker_procs if w.fields["id"] == victim_id)
        os.kill(victim.pid, signal.SIGKILL)
        self.plan.pop(0)
        self.result.kills.append({"at_s": round(now - self.t0, 2), "worker": victim_id, "kind": kind,
                                  "last_checkpoint": self._last_checkpoint(status)})
        self.log(f"  [{now - self.t0:5.1f}s] kill -9 {victim_id} (pid {victim.pid}; {kind}); "
                 f"last completed checkpoint #{self.result.kills[-1]['last_checkpoint']}")
        self.next_fault_at = now + self.rng.uniform(1.5, 3.5)
        self.seen_checkpoints = status.get("checkpoints_completed", 0)


FAULTS = {"wipe": FaultLoop._wipe, "partition": FaultLoop._partition, "rescale": FaultLoop._rescale,
          "coordinator": FaultLoop._kill_coordinator}  # any other kind is a worker kill


async def _run_job(settings: ChaosSettings, cluster: LocalCluster, rng: random.Random,
                   log: Callable[[str], None], lab: NetnsLab | None = None) -> ChaosResult:
    await cluster.wait_workers()
    name = f"chaos-{settings.entry.rsplit(':')[0].rsplit('.')[-1]}"
    submitted = await cluster.ask(p.Submit(settings.entry, name, _submission_config(settings), os.getcwd()))
    t0 = time.monotonic()
    plan = fault_plan(settings.kills, settings.coordinator_kills, settings.rescales, rng, wipes=settings.wipes,
                      partitions=1 if settings.partition_s else 0)
    partition = PartitionFault(lab, settings.partition_s) if lab is not None and settings.partition_s else None
    result = ChaosResult(ok=False, verify={}, state="RUNNING")
    next_fault_at = t0 + rng.uniform(1.0, 2.5)
    link_cut = (LinkCutFault(lab, settings.link_cuts, settings.link_timeout_s, rng, t0 + rng.uniform(1.0, 2.5))
                if lab is not None and settings.link_cuts else None)
    faults = FaultLoop(settings, cluster, rng, log, submitted.job_id, t0, plan, result, next_fault_at,
                       link_cut=link_cut, partition=partition)
    status = await faults.watch()
    result.job_s = time.monotonic() - t0
    history = (await cluster.ask(p.Checkpoints(faults.job_id))).history
    _record_end(result, status, history, link_cut)
    return result


def _record_end(result: ChaosResult, status: dict[str, Any], history: list[dict[str, Any]],
                link_cut: LinkCutFault | None) -> None:
    if link_cut is not None:
        result.link_cuts = link_cut.cuts
    result.state = status["state"]
    result.restarts = status.get("restarts", 0)
    result.restart_s = list(status.get("restart_s", []))
    if status["state"] != "FINISHED":
        result.error = result.error or status.get("error", "")
    completed = [h for h in history if h["status"] == "COMPLETED"]
    result.checkpoint_s = [h["duration_s"] for h in completed]
    result.inflight_bytes = [h["inflight_bytes"] for h in completed]
    result.checkpoints_completed = status.get("checkpoints_completed", 0)
    result.checkpoints_failed = status.get("checkpoints_failed", 0)


def _netns_for_link_cuts(settings: ChaosSettings, cluster: LocalCluster) -> NetnsLab | None:
    """For link cuts and partitions: one namespace per worker (raises NetnsUnavailable when this machine cannot)."""
    if not settings.link_cuts and not settings.partition_s:
        return None
    lab = NetnsLab(workers=settings.workers).create()
    cluster.coordinator_host = "0.0.0.0"  # reachable from every namespace over its uplink
    cluster.place_worker = lab.place
    return lab


def run_chaos(settings: ChaosSettings, *, log: Callable[[str], None] = print, seed: int | None = None,
              spark: Any = None) -> ChaosResult:
    """One chaos run; the result says whether the committed output verified exactly. Spark generates the input
    and verifies the output in `spark` when given (a session the caller keeps), else in `sluice data` commands."""
    rng = random.Random(seed)
    os.makedirs(settings.workdir, exist_ok=True)
    input_path = generate_input(settings, log, spark)
    output_path = os.path.join(settings.workdir, "out")
    shutil.rmtree(output_path, ignore_errors=True)
    state_dir = os.path.join(settings.workdir, "state")
    shutil.rmtree(state_dir, ignore_errors=True)
    late_path = os.path.join(settings.workdir, "late")
    shutil.rmtree(late_path, ignore_errors=True)
    os.environ.update({"SLUICE_INPUT": input_path, "SLUICE_OUTPUT": output_path,
                       "SLUICE_SINK_DELAY_S": str(settings.sink_delay_s),
                       "SLUICE_PARALLELISM": str(settings.parallelism),
                       # the windowed job's (runtime/examples/windowcount.py)
                       "SLUICE_LATE_OUTPUT": late_path, "SLUICE_WINDOW_MS": str(settings.window_ms),
                       "SLUICE_MAX_DELAY_MS": str(settings.max_delay_ms),
                       "SLUICE_ALLOWED_LATENESS_MS": str(settings.allowed_lateness_ms)})
    cluster = LocalCluster(workers=settings.workers, slots=2, log_dir=os.path.join(settings.workdir, "logs"),
                           state_dir=state_dir, link_timeout_s=settings.link_timeout_s)
    shutil.rmtree(cluster.log_dir or "", ignore_errors=True)
    lab = _netns_for_link_cuts(settings, cluster)
    try:
        cluster.start()
        result = run(_run_job(settings, cluster, rng, log, lab))
    finally:
        cluster.stop()
        if lab is not None:
            lab.teardown()
    log(f"job {result.state} after {result.job_s:.1f}s; {result.restarts} restarts, "
        f"{result.checkpoints_completed} checkpoints completed")
    if result.state != "FINISHED":
        return result
    started = time.monotonic()
    result.verify = verify_output(input_path, output_path, settings, late_path if settings.window_ms else None,
                                  spark)
    log(f"verified with Spark in {time.monotonic() - started:.1f}s: {result.verify.get('summary')}")
    result.ok = bool(result.verify.get("ok"))
    return result
