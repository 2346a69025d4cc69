"""How a job ends, on a real cluster: failover started by failing checkpoints (a full disk under the state
directory, injected at the `_metadata` write by tests/support/faulty_coordinator.py) restarts the job or fails it with
its cause; checkpoints go on after some tasks finished; and the end of a bounded job is its final checkpoint,
committed exactly once even when a worker dies while the sinks publish it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from tests.support.cluster import Cluster, poll
from tests.support.failover import CHANNELS, KEYS, SEED, WORKER_ARGS, assert_exact_output, install
from tests.support.faulty_coordinator import launcher
from tests.support.releasable_sink import RELEASABLE_SINK, release, release_path

pytestmark = pytest.mark.integration


def exact_output(*, out: Path, words: int) -> None:
    """test_failover's check (every count once, in order; nothing hidden) for an output directory of our own."""
    assert_exact_output(cast(Any, SimpleNamespace(out=out, words=words)))


def start_faulty(cluster: Cluster, workers: int, *, metadata_fails: int = 0) -> None:
    """A coordinator whose first `metadata_fails` `_metadata` writes fail with ENOSPC (-1: all), and workers."""
    cluster.start_coordinator(prefix=launcher(metadata_fails=metadata_fails) if metadata_fails else None)
    for i in range(workers):
        cluster.start_worker(*WORKER_ARGS, worker_id=f"worker-{i + 1}")
    cluster.wait_workers(workers)


# -- 1: too many failed checkpoints ------------------------------------------------------------------------------


def test_failed_checkpoints_restart_the_job_and_output_is_exact(cluster: Cluster) -> None:
    # the first two _metadata writes fail with ENOSPC; one is tolerated, the second fails the attempt
    setup = install(cluster, words=120_000)
    start_faulty(cluster, 2, metadata_fails=2)
    job_id = setup.submit("wordcount", checkpoint={"interval_s": 0.3, "tolerable_failures": 1})
    st = setup.wait_finished(job_id, 120)
    assert st["restarts"] == 1 and st["attempt"] == 1, st
    assert "checkpoints failing" in st["failures"][0] and "No space left" in st["failures"][0], st
    assert st["error"] == "", st
    assert "restarting in" in cluster.log("coordinator")
    assert_exact_output(setup)


def test_failed_checkpoints_after_the_last_restart_fail_the_job_and_submit_wait_returns(cluster: Cluster) -> None:
    install(cluster, words=400_000)
    start_faulty(cluster, 2, metadata_fails=-1)
    host, port = cluster.rpc
    t0 = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "runtime.cli", "submit", "--coordinator", f"{host}:{port}", "failjobs:wordcount",
         "--wait", "--checkpoint-interval", "0.3s", "--tolerable-failures", "0", "--restart-attempts", "1",
         "--restart-delay", "0.2s", "--checkpoint-mode", "unaligned"],
        env=cluster.env, cwd=str(cluster.tmp_path), capture_output=True, text=True, timeout=120)
    assert done.returncode != 0, done
    assert time.monotonic() - t0 < 100
    jobs = cluster.call("status")["jobs"]
    assert len(jobs) == 1, jobs
    st = cluster.call("status", {"job_id": jobs[0]["job_id"]})
    assert st["state"] == "FAILED", st
    assert st["restarts"] == 1 and st["attempt"] == 1, st
    assert "checkpoints failing" in st["error"] and "No space left" in st["error"], st
    assert "exhausted" in st["error"], st
    assert len(st["failures"]) == 2, st
    # nothing of the job runs on the workers any more, and they are alive
    assert cluster.coordinator is not None and cluster.coordinator.proc.poll() is None
    assert all(p.proc.poll() is None for p in cluster.workers)


# -- 3: checkpoints after tasks finished -------------------------------------------------------------------------

# Two pipelines in one job: a short one, whose three tasks finish early, and a long one.
TWO_PIPELINES = """
from runtime.api import FileSink, GeneratorSource, Job
from runtime.examples.wordcount import Count

KEYS, SEED = {keys}, {seed}
RELEASE = {release!r}
""" + RELEASABLE_SINK + """


def short_and_long(job: Job) -> None:
    (job.source(GeneratorSource(count={short}, keys=KEYS, seed=SEED), parallelism=1, name="short")
        .key_by(lambda r: r[0]).process(Count(), parallelism=2).sink(FileSink({short_out!r})))
    (job.source(GeneratorSource(count={long}, keys=KEYS, seed=SEED), parallelism=2, name="long")
        .key_by(lambda r: r[0]).process(Count(), parallelism=2)
        .sink(ReleasableSink({long_out!r}, delay_per_record_s=0.00005)))
"""


def test_checkpoints_go_on_after_tasks_finished_and_restore_treats_them_as_finished(cluster: Cluster) -> None:
    short_out, long_out = cluster.tmp_path / "short", cluster.tmp_path / "long"
    short, long = 5_000, 400_000
    (cluster.tmp_path / "twojobs.py").write_text(TWO_PIPELINES.format(
        keys=KEYS, seed=SEED, short=short, long=long, short_out=str(short_out), long_out=str(long_out),
        release=release_path(cluster)))
    start_faulty(cluster, 2)
    config = {**CHANNELS, "checkpoint": {"interval_s": 0.3, "mode": "aligned", "timeout_s": 20},
              "restart": {"kind": "fixed", "max_attempts": 2, "delay_s": 0.2, "slot_wait_s": 60}}
    job_id = cluster.submit("twojobs:short_and_long", config)

    def status() -> dict[str, Any]:
        return dict(cluster.call("status", {"job_id": job_id}))

    def short_finished() -> bool:
        st = status()
        assert st["state"] in ("CREATED", "DEPLOYING", "RUNNING"), st
        return st["tasks_finished"] >= 3

    poll(short_finished, 90, "the short pipeline's three tasks to finish")
    st = status()
    finished = {t["task"] for t in st["tasks"] if t["state"] == "finished"}
    assert any("short" in t["name"] for t in st["tasks"] if t["state"] == "finished"), st
    done_then = st["checkpoints_completed"]
    # periodic checkpoints keep completing, and so does a manual one
    poll(lambda: status()["checkpoints_completed"] >= done_then + 2, 60, "two more periodic checkpoints")
    manual = cluster.call("checkpoint", {"job_id": job_id})
    assert manual["status"] == "COMPLETED", manual
    assert status()["state"] == "RUNNING", "the long pipeline must still run for this test"

    # a worker dies: the restored job must not run the short pipeline again (its source would re-emit)
    kill_and_replace(cluster, cluster.workers[0])

    # and again, after a checkpoint of the restored attempt (which records the restored short tasks as finished)
    def restored_and_checkpointed() -> bool:
        st = status()
        assert st["state"] in ("RESTARTING", "DEPLOYING", "RUNNING"), st
        newest = (st["last_checkpoint"] or {}).get("checkpoint_id", 0)
        restored = st["restored_checkpoint_id"] or 0
        return bool(st["attempt"] == 1 and st["state"] == "RUNNING" and restored and newest > restored)

    poll(restored_and_checkpointed, 90, "a checkpoint of the restored attempt")
    kill_and_replace(cluster, cluster.workers[1])
    release(cluster)  # the rest of the long pipeline's input at full speed
    st = cluster.wait_job(job_id, 180)
    assert st["state"] == "FINISHED", st
    assert st["restarts"] == 2, st
    assert st["restored_checkpoint_id"] >= manual["checkpoint_id"], st
    assert st["final_checkpoint_id"] is not None and st["final_checkpoint_id"] > manual["checkpoint_id"], st
    assert finished, st
    exact_output(out=short_out, words=short)
    exact_output(out=long_out, words=long)


def kill_and_replace(cluster: Cluster, victim: Any) -> None:
    os.kill(victim.pid, signal.SIGKILL)
    victim.proc.wait(10)
    cluster.start_worker(*WORKER_ARGS, worker_id=str(victim.fields["id"]))


# -- 2: a worker dies while the sinks publish the end of a bounded job ---------------------------------------------

HOLDING_JOB = """
import json
import json
import os
import time

from runtime.api import FileSink, GeneratorSource, Job
from runtime.examples.wordcount import Count

MARKERS = {markers!r}


class HoldingSink(FileSink):
    \"\"\"Subtask 0, once: its first commit after the end of input (the job's last commit) holds before publishing
    anything, until the test creates MARKERS/release: a slow final commit, without a clock.\"\"\"

    def open(self, subtask_index, parallelism, attempt):
        super().open(subtask_index, parallelism, attempt)
        self._ended = False

    def finish(self):
        super().finish()
        self._ended = True

    def commit(self, checkpoint_id):
        due = [p for p in self._pending if p[0] <= checkpoint_id]
        if self._ended and self.subtask_index == 0 and due:
            try:
                fd = os.open(os.path.join(MARKERS, "holding"), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                fd = None
            if fd is not None:
                with os.fdopen(fd, "w") as f:
                    f.write(json.dumps({{"pid": os.getpid(), "checkpoint_id": checkpoint_id}}))
                deadline = time.monotonic() + 60
                while not os.path.exists(os.path.join(MARKERS, "release")) and time.monotonic() < deadline:
                    time.sleep(0.01)
        super().commit(checkpoint_id)


def holding(job: Job) -> None:
    (job.source(GeneratorSource(count={words}, keys={keys}, seed={seed}), parallelism=2)
        .key_by(lambda r: r[0]).process(Count(), parallelism=2).sink(HoldingSink({out!r})))
"""


def test_worker_killed_during_the_final_commit_output_is_exact(cluster: Cluster) -> None:
    words = 60_000
    out, markers = cluster.tmp_path / "out", cluster.tmp_path / "markers"
    markers.mkdir()
    (cluster.tmp_path / "holdjobs.py").write_text(HOLDING_JOB.format(
        markers=str(markers), words=words, keys=KEYS, seed=SEED, out=str(out)))
    start_faulty(cluster, 2)
    config = {**CHANNELS, "checkpoint": {"interval_s": 0.5, "mode": "aligned", "timeout_s": 20},
              "restart": {"kind": "fixed", "max_attempts": 2, "delay_s": 0.2, "slot_wait_s": 60}}
    job_id = cluster.submit("holdjobs:holding", config)
    holding = markers / "holding"
    # the sink creates the marker, then writes it: wait for the whole document, not the name (a busy run read '')
    poll(lambda: holding.exists() and holding.read_text().endswith("}"), 120,
         "sink subtask 0 to hold in its final commit")
    held = json.loads(holding.read_text())
    holder_pid = held["pid"]
    victim = next(w for w in cluster.workers if w.pid != holder_pid)
    os.kill(victim.pid, signal.SIGKILL)
    victim.proc.wait(10)
    (markers / "release").write_text("")
    cluster.start_worker(*WORKER_ARGS, worker_id=str(victim.fields["id"]))
    st = cluster.wait_job(job_id, 180)
    assert st["state"] == "FINISHED", st
    assert st["restarts"] == 1, st
    exact_output(out=out, words=words)
    # the restart restored the checkpoint being committed or a later one (on a busy machine the next periodic
    # checkpoint can complete while the finished sink still holds in this commit): its commit was redone, not its
    # records, and the job ended with a checkpoint of its own after that
    assert st["restored_checkpoint_id"] is not None and st["restored_checkpoint_id"] >= held["checkpoint_id"], (
        st, held)
    assert st["final_checkpoint_id"] is not None and st["final_checkpoint_id"] > st["restored_checkpoint_id"], st
