"""Failover on a real cluster: a worker killed with SIGKILL, a task that raises, restarts that run out, a worker
that stops heartbeating (SIGSTOP), a worker killed while an aligned checkpoint waits behind backpressure, and
crashes of the two-phase file sink at exact points: after pre-committing for a checkpoint that is still in
flight, and between a checkpoint's completion and its commit. Every job that recovers must commit each count
exactly once: for every key exactly (k, 1) .. (k, n_k), in order, and no hidden file left behind."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import Cluster, generator_counts, poll, write_module

pytestmark = pytest.mark.integration

# Count is chained with its sink (same parallelism, forward), so the vertex "Count -> <sink>" hosts both.
# `once(name)` is true exactly once per test, across processes and attempts (O_EXCL on a marker file), which is
# how a job fails "only in the first attempt" without knowing its attempt.
JOBS = '''
import json
import os
import signal

from runtime.api import FileSink, GeneratorSource, Job, KeyedProcessFunction

OUT = {out!r}
MARKERS = {markers!r}
WORDS, KEYS, SEED = {words}, {keys}, {seed}
SINK_DELAY = {sink_delay}
FAIL_SEQ = {fail_seq}


def once(name, content=""):
    try:
        fd = os.open(os.path.join(MARKERS, name), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as f:
        f.write(content)
        f.flush()
        os.fsync(f.fileno())
    return True


from runtime.examples.wordcount import Count  # the README's keyed word count


class FailOnce(Count):
    def process(self, record, ctx):
        if record[1] == FAIL_SEQ and once("raised"):
            raise RuntimeError(f"injected failure at record {{FAIL_SEQ}}")
        super().process(record, ctx)


class AlwaysFail(Count):
    def process(self, record, ctx):
        if record[1] == FAIL_SEQ:
            raise RuntimeError("injected permanent failure")
        super().process(record, ctx)


class CrashingSink(FileSink):
    """Kills its own worker at two precise points of the two-phase protocol.

    in flight: attempt 0, subtask 1, at the first pre-commit after a checkpoint has completed: the files are
    pending for a checkpoint that can never complete (this task never acknowledges it).
    before commit: attempt 1, subtask 0, when told that a checkpoint with pending files completed, before
    publishing any of them: the restore must redo that commit.
    """

    def open(self, subtask_index, parallelism, attempt):
        super().open(subtask_index, parallelism, attempt)
        self._committed = False

    def snapshot_state(self, checkpoint_id):
        state = super().snapshot_state(checkpoint_id)
        if (self.attempt == 0 and self.subtask_index == 1 and self._committed
                and any(p[0] == checkpoint_id for p in self._pending)
                and once("crash-in-flight", json.dumps({{"checkpoint_id": checkpoint_id, "pid": os.getpid()}}))):
            os.kill(os.getpid(), signal.SIGKILL)
        return state

    def commit(self, checkpoint_id):
        due = [p for p in self._pending if p[0] <= checkpoint_id]
        if (self.attempt == 1 and self.subtask_index == 0 and due
                and once("crash-before-commit", json.dumps({{"checkpoint_id": checkpoint_id, "pid": os.getpid(),
                                                            "files": [p[2] for p in due]}}))):
            os.kill(os.getpid(), signal.SIGKILL)
        self._committed = True
        super().commit(checkpoint_id)


def _pipeline(job, count, sink):
    (job.source(GeneratorSource(count=WORDS, keys=KEYS, seed=SEED), parallelism=2)
        .key_by(lambda r: r[0])
        .process(count, parallelism=2)
        .sink(sink))


def wordcount(job: Job) -> None:
    _pipeline(job, Count(), FileSink(OUT, delay_per_record_s=SINK_DELAY))


def fail_once(job: Job) -> None:
    _pipeline(job, FailOnce(), FileSink(OUT, delay_per_record_s=SINK_DELAY))


def always_fail(job: Job) -> None:
    _pipeline(job, AlwaysFail(), FileSink(OUT, delay_per_record_s=SINK_DELAY))


def crashing_sink(job: Job) -> None:
    _pipeline(job, Count(), CrashingSink(OUT, delay_per_record_s=SINK_DELAY))
'''

KEYS, SEED = 100, 3
CHANNELS = {"buffer_bytes": 32 * 1024, "buffers_per_channel": 4}
WORKER_ARGS = ("--heartbeat-interval", "0.25s")


class Setup:
    def __init__(self, cluster: Cluster, words: int) -> None:
        self.cluster = cluster
        self.words = words
        self.out = cluster.tmp_path / "out"
        self.markers = cluster.tmp_path / "markers"
        self.markers.mkdir()
        self.replaced: set[int] = set()

    def submit(self, entry: str, *, checkpoint: dict[str, Any] | None = None,
               restart: dict[str, Any] | None = None) -> str:
        config: dict[str, Any] = {**CHANNELS}
        config["checkpoint"] = {"interval_s": 0.5, "mode": "unaligned", "timeout_s": 10, "tolerable_failures": 3,
                                **(checkpoint or {})}
        config["restart"] = {"kind": "fixed", "max_attempts": 3, "delay_s": 0.5, "slot_wait_s": 60,
                             **(restart or {})}
        return self.cluster.submit(f"failjobs:{entry}", config)

    def status(self, job_id: str) -> dict[str, Any]:
        return dict(self.cluster.call("status", {"job_id": job_id}))

    def logs(self) -> str:
        names = ["coordinator", *sorted({worker_id_of(w) for w in self.cluster.workers})]
        return "\n".join(f"--- {n}\n{self.cluster.log(n)[-4000:]}" for n in names)

    def replace_dead_workers(self) -> list[str]:
        """Start a worker with the same id for every worker process that died (once each)."""
        started = []
        for w in list(self.cluster.workers):
            if w.proc.poll() is not None and w.pid not in self.replaced:
                self.replaced.add(w.pid)
                wid = worker_id_of(w)
                self.cluster.start_worker(*WORKER_ARGS, worker_id=wid)
                started.append(wid)
        return started

    def wait_finished(self, job_id: str, timeout_s: float = 90.0) -> dict[str, Any]:
        try:
            st = self.cluster.wait_job(job_id, timeout_s)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\nstatus {self.status(job_id)}\n{self.logs()}") from None
        assert st["state"] == "FINISHED", f"{st}\n{self.logs()}"
        return st


def worker_id_of(w: Any) -> str:
    """The id a managed worker process announced in its readiness line."""
    return str(w.fields["id"])


def install(cluster: Cluster, *, words: int, sink_delay: float = 0.00005, fail_seq: int = -1) -> Setup:
    setup = Setup(cluster, words)
    write_module(cluster.tmp_path, "failjobs",
                 JOBS.format(out=str(setup.out), markers=str(setup.markers), words=words, keys=KEYS, seed=SEED,
                             sink_delay=sink_delay, fail_seq=fail_seq))
    return setup


def start(cluster: Cluster, workers: int = 3, *coordinator_args: str) -> None:
    cluster.start_coordinator(*coordinator_args)
    for i in range(workers):
        cluster.start_worker(*WORKER_ARGS, worker_id=f"worker-{i + 1}")
    cluster.wait_workers(workers)


def expected_counts(words: int) -> Counter[str]:
    counts = generator_counts(words, KEYS, SEED)
    assert sum(counts.values()) == words
    return counts


def part_order(path: Path) -> tuple[int, int]:
    # part-<subtask>-<checkpoint>-<attempt>-<n>.jsonl: n counts on over the subtask's files, in write order
    _, subtask, _checkpoint, _attempt, n = path.name.split(".")[0].split("-")
    return int(subtask), int(n)


def assert_exact_output(setup: Setup) -> None:
    """Committed output counts every input record exactly once; nothing hidden is left behind."""
    files = sorted(setup.out.iterdir()) if setup.out.exists() else []
    hidden = [p.name for p in files if p.name.startswith((".", "_"))]
    assert hidden == [], f"uncommitted files left behind: {hidden}"
    counts: dict[str, list[int]] = defaultdict(list)
    for path in sorted(files, key=part_order):
        for line in path.read_text().splitlines():
            key, n = json.loads(line)
            counts[key].append(n)
    expected = expected_counts(setup.words)
    assert set(counts) == set(expected), sorted(set(counts) ^ set(expected))
    wrong = {}
    for key, n in expected.items():
        if counts[key] != list(range(1, n + 1)):
            got = Counter(counts[key])
            wrong[key] = {"expected": n, "got": len(counts[key]),
                          "duplicated": sorted(c for c, m in got.items() if m > 1)[:10],
                          "missing": sorted(set(range(1, n + 1)) - set(got))[:10],
                          "in_order": counts[key] == sorted(counts[key])}
    assert not wrong, f"{len(wrong)} keys wrong, e.g. {dict(list(wrong.items())[:3])}"
    assert sum(len(v) for v in counts.values()) == setup.words


def sink_placement(status: dict[str, Any]) -> dict[int, str]:
    """Subtask index of the sink vertex -> the worker that reported it."""
    out = {}
    for t in status["tasks"]:
        if "Sink" in t["name"]:
            out[int(t["task"].rsplit(":", 1)[1])] = t["worker"]
    return out


def wait_first_checkpoint(setup: Setup, job_id: str, timeout_s: float = 60.0) -> dict[str, Any]:
    found: dict[str, Any] = {}

    def done() -> bool:
        st = setup.status(job_id)
        assert st["state"] in ("CREATED", "DEPLOYING", "RUNNING"), f"{st}\n{setup.logs()}"
        found.update(st)
        return st["last_checkpoint"] is not None and len(sink_placement(st)) == 2

    poll(done, timeout_s, "a completed checkpoint and sink statistics")
    return found


def assert_recovered(st: dict[str, Any], restarts: int) -> None:
    assert st["restarts"] == restarts, st
    assert st["attempt"] == restarts, st
    assert st["error"] == "", st
    assert st["last_restart_s"] is not None and 0 < st["last_restart_s"] < 60, st
    assert len(st["failures"]) == restarts, st


# -- 1: a worker killed with SIGKILL ---------------------------------------------------------------------------


def test_worker_killed_job_restores_and_output_is_exact(cluster: Cluster) -> None:
    setup = install(cluster, words=120_000)
    start(cluster)
    job_id = setup.submit("wordcount")
    st = wait_first_checkpoint(setup, job_id)
    victim_id = sink_placement(st)[0]
    victim = next(w for w in cluster.workers if worker_id_of(w) == victim_id)
    os.kill(victim.pid, signal.SIGKILL)
    victim.proc.wait(10)
    killed_after = st["last_checkpoint"]["checkpoint_id"]

    cluster.start_worker(*WORKER_ARGS, worker_id=victim_id)
    st = setup.wait_finished(job_id)
    assert_recovered(st, 1)
    assert victim_id in st["failures"][0], st
    assert st["restored_checkpoint_id"] is not None and st["restored_checkpoint_id"] >= killed_after, st
    assert_exact_output(setup)


# -- 2: a task raises once -------------------------------------------------------------------------------------


def test_task_exception_restarts_once_and_output_is_exact(cluster: Cluster) -> None:
    setup = install(cluster, words=60_000, fail_seq=40_000)
    start(cluster, 2)
    job_id = setup.submit("fail_once")
    st = setup.wait_finished(job_id)
    assert (setup.markers / "raised").exists()
    assert_recovered(st, 1)
    assert "injected failure at record 40000" in st["failures"][0], st
    assert "RuntimeError" in st["failures"][0], st
    assert_exact_output(setup)


# -- 3: restarts run out ---------------------------------------------------------------------------------------


def test_restarts_exhausted_fail_the_job_and_the_cluster_lives_on(cluster: Cluster) -> None:
    setup = install(cluster, words=20_000, fail_seq=5_000, sink_delay=0.0)
    start(cluster, 2)
    job_id = setup.submit("always_fail", restart={"kind": "fixed", "max_attempts": 2, "delay_s": 0.2})
    st = cluster.wait_job(job_id, 90)
    assert st["state"] == "FAILED", f"{st}\n{setup.logs()}"
    assert st["restarts"] == 2 and st["attempt"] == 2, st
    assert "injected permanent failure" in st["error"], st
    assert "exhausted" in st["error"], st
    assert len(st["failures"]) == 3 and all("injected permanent failure" in f for f in st["failures"]), st
    assert st["ended_at"] is not None, st

    # the cluster is unharmed: every process runs, both workers are registered, and the next job finishes
    assert all(p.proc.poll() is None for p in [*cluster.workers, cluster.coordinator]), setup.logs()
    overview = cluster.call("status")
    assert sorted(w["id"] for w in overview["workers"]) == ["worker-1", "worker-2"], overview
    assert [j["state"] for j in overview["jobs"] if j["job_id"] == job_id] == ["FAILED"], overview
    next_job = setup.submit("wordcount")
    assert setup.wait_finished(next_job, 60)["restarts"] == 0


# -- 4: a worker stops heartbeating ------------------------------------------------------------------------------


def test_heartbeat_timeout_moves_the_job_to_a_spare_worker(cluster: Cluster) -> None:
    setup = install(cluster, words=120_000)
    start(cluster, 3, "--heartbeat-timeout", "2s")
    job_id = setup.submit("wordcount")
    st = wait_first_checkpoint(setup, job_id)
    stopped_id = sink_placement(st)[1]
    stopped = next(w for w in cluster.workers if worker_id_of(w) == stopped_id)
    os.kill(stopped.pid, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        poll(lambda: setup.status(job_id)["failures"], 30, "the stopped worker to be noticed")
        detected_s = time.monotonic() - t0
        st = setup.wait_finished(job_id)
        assert_recovered(st, 1)
        assert "heartbeat" in st["failures"][0] and stopped_id in st["failures"][0], st
        assert 1.5 < detected_s < 10, detected_s
        used = {t["worker"] for t in st["tasks"]}
        assert stopped_id not in used and len(used) == 2, st["tasks"]
        assert stopped_id not in [w["id"] for w in cluster.call("status")["workers"]]
        assert_exact_output(setup)
    finally:
        if stopped.proc.poll() is None:
            os.kill(stopped.pid, signal.SIGCONT)

    # the stale worker wakes up, finds its links gone and registers again: the committed output must not change
    committed = {p.name: p.read_bytes() for p in setup.out.iterdir() if not p.name.startswith(".")}
    poll(lambda: stopped_id in [w["id"] for w in cluster.call("status")["workers"]], 30,
         "the continued worker to register again")
    time.sleep(1.0)
    assert {p.name: p.read_bytes() for p in setup.out.iterdir() if not p.name.startswith(".")} == committed


# -- 5: the two-phase sink crashes mid-protocol ------------------------------------------------------------------


def test_sink_crashes_in_flight_and_before_commit_output_is_exact(cluster: Cluster) -> None:
    setup = install(cluster, words=150_000)
    start(cluster)
    job_id = setup.submit("crashing_sink")
    in_flight = setup.markers / "crash-in-flight"
    before_commit = setup.markers / "crash-before-commit"

    poll(in_flight.exists, 60, "the sink to crash in flight")
    crash1 = json.loads(in_flight.read_text())
    poll(lambda: len(setup.replace_dead_workers()) == 1, 10, "the crashed worker to die")
    poll(before_commit.exists, 60, "the sink to crash before its commit")
    crash2 = json.loads(before_commit.read_text())
    poll(lambda: len(setup.replace_dead_workers()) == 1, 10, "the second crashed worker to die")

    st = setup.wait_finished(job_id)
    assert_recovered(st, 2)
    # the first restart could not use the checkpoint that was in flight; the second restored exactly the
    # checkpoint whose commit the crash interrupted
    assert st["restored_checkpoint_id"] == crash2["checkpoint_id"], (st, crash1, crash2)
    assert crash1["checkpoint_id"] < crash2["checkpoint_id"]
    chk = cluster.tmp_path / "state" / "checkpoints" / job_id
    assert not (chk / f"chk-{crash1['checkpoint_id']}" / "_metadata").exists()
    for f in crash2["files"]:
        assert Path(f).exists(), f"the restore did not publish {f}"
    assert_exact_output(setup)


# -- 6: a worker killed while an aligned checkpoint waits behind backpressure -------------------------------------


def test_worker_killed_during_aligned_checkpoint_output_is_exact(cluster: Cluster) -> None:
    setup = install(cluster, words=100_000, sink_delay=0.0001)
    start(cluster)
    job_id = setup.submit("wordcount", checkpoint={"interval_s": None, "mode": "aligned", "timeout_s": 30})
    poll(lambda: setup.status(job_id)["state"] == "RUNNING" and len(sink_placement(setup.status(job_id))) == 2,
         60, "the job to run")
    first = cluster.call("checkpoint", {"job_id": job_id, "timeout_s": 60})
    assert first["status"] == "COMPLETED", first
    # queues refill (the tasks are blocked again for a while): the next aligned barrier waits behind them
    blocked = sum(t["backpressured_s"] for t in setup.status(job_id)["tasks"])
    poll(lambda: sum(t["backpressured_s"] for t in setup.status(job_id)["tasks"]) >= blocked + 1.0, 30,
         "the queues to fill again")

    results: list[Any] = []
    thread = threading.Thread(target=lambda: results.append(_call(cluster, job_id)), daemon=True)
    thread.start()
    poll(lambda: any(h["status"] == "IN_PROGRESS" for h in cluster.call("checkpoints", {"job_id": job_id})["history"]),
         10, "the aligned checkpoint to start")
    time.sleep(0.3)
    st = setup.status(job_id)
    assert st["last_checkpoint"]["checkpoint_id"] == first["checkpoint_id"], "the aligned checkpoint was too quick"
    victim_id = sink_placement(st)[1]
    victim = next(w for w in cluster.workers if worker_id_of(w) == victim_id)
    os.kill(victim.pid, signal.SIGKILL)
    victim.proc.wait(10)
    thread.join(30)
    assert results and results[0].get("status") == "ABORTED", results
    cluster.start_worker(*WORKER_ARGS, worker_id=victim_id)

    st = setup.wait_finished(job_id)
    assert_recovered(st, 1)
    assert st["restored_checkpoint_id"] == first["checkpoint_id"], st
    assert_exact_output(setup)


def _call(cluster: Cluster, job_id: str) -> Any:
    try:
        return cluster.call("checkpoint", {"job_id": job_id, "timeout_s": 60})
    except Exception as exc:  # the RPC may fail with the job instead of reporting the abort
        return {"status": "ERROR", "error": repr(exc)}
