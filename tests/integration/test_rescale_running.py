"""`sluice rescale` of a running job on a real cluster (two workers, two slots each).

A backpressured keyed count with unaligned checkpoints every 500 ms is rescaled 2 -> 3 -> 1 -> 2 with the
command while it runs: each rescale takes an unaligned checkpoint (data in flight, no draining), stops the
attempt and redeploys the same job at the new parallelism from it. The committed output is exact. A rescale
that needs more slots than the cluster has is refused in one line and the job goes on to an exact end."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from runtime.graph.enums import JobState
from tests.integration.conftest import Cluster, assert_running_counts, generator_counts, poll, write_module
from tests.integration.test_checkpoints import history_entry, logs
from tests.support.faulty_coordinator import launcher

JOBS = """
from runtime.api import FileSink, GeneratorSource, Job
from runtime.examples.wordcount import Count


def wordcount(job: Job) -> None:
    (job.source(GeneratorSource(count={words}, keys={keys}, seed={seed}), parallelism=2)
        .key_by(lambda r: r[0])
        .process(Count(), parallelism=2)
        .sink(FileSink({out!r}, delay_per_record_s=0.0002)))
"""
WORDS, KEYS, SEED = 300_000, 200, 13  # long enough that no source subtask finishes before the last rescale
ONE_RESCALE_WORDS = 200_000  # a test that rescales once, early, ends sooner
NO_RESCALE_WORDS = 150_000
CHANNELS = {"buffer_bytes": 32 * 1024, "buffers_per_channel": 4, "inflight_target_s": 0}
CONFIG = {"checkpoint": {"interval_s": 0.5, "mode": "unaligned", "timeout_s": 30.0, "min_pause_s": 0,
                         "tolerable_failures": 3, "retain": 3}, **CHANNELS}
CLI_TIMEOUT_S = 120.0


def submit(cluster: Cluster, config: dict[str, Any] = CONFIG, words: int = WORDS) -> tuple[str, Path]:
    out = cluster.tmp_path / "out"
    write_module(cluster.tmp_path, "runningjobs", JOBS.format(out=str(out), words=words, keys=KEYS, seed=SEED))
    result = cluster.call("submit", {"entry": "runningjobs:wordcount", "name": "wordcount", "config": config,
                                     "sys_path": str(cluster.tmp_path)})
    return str(result["job_id"]), out


def sluice(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    host, port = cluster.rpc
    command = [sys.executable, "-m", "runtime.cli", args[0], "--coordinator", f"{host}:{port}", *args[1:]]
    proc = subprocess.Popen(command, cwd=cluster.tmp_path, env=cluster.env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=CLI_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.terminate()
        try:
            out, err = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        raise AssertionError(f"sluice {' '.join(args)} still running after {CLI_TIMEOUT_S}s: {out!r} {err!r}") from None
    return subprocess.CompletedProcess(command, proc.returncode, out, err)


def wait_backpressured(cluster: Cluster, job_id: str, tasks: int) -> None:
    def running() -> bool:
        st = cluster.call("status", {"job_id": job_id})
        assert st["state"] in (JobState.DEPLOYING, JobState.RESTARTING, JobState.RUNNING), (st, logs(cluster))
        return st["state"] == JobState.RUNNING and len(st["tasks"]) == tasks

    poll(running, 60, f"job {job_id} to run its {tasks} tasks")
    poll(lambda: sum(t["backpressured_s"] for t in cluster.call("status", {"job_id": job_id})["tasks"]) >= 0.5,
         60, f"job {job_id} to be backpressured")


def rescale(cluster: Cluster, job_id: str, parallelism: int) -> float:
    """`sluice rescale` to `parallelism`; checks what it printed and that the checkpoint it used had data in
    flight; returns the downtime it printed."""
    before = cluster.call("status", {"job_id": job_id})["attempt"]
    proc = sluice(cluster, "rescale", job_id, "--parallelism", str(parallelism))
    assert proc.returncode == 0, (proc.stdout, proc.stderr, logs(cluster))
    m = re.search(r"rescaled to (.*) \(attempt (\d+)\) from checkpoint (\d+).*downtime ([\d.]+)s", proc.stdout)
    assert m is not None, proc.stdout
    assert m.group(1) == f"GeneratorSource={parallelism}, Count -> FileSink={parallelism}", proc.stdout
    assert int(m.group(2)) == before + 1, (proc.stdout, before)
    used = history_entry(cluster, job_id, int(m.group(3)))
    assert used["status"] == "COMPLETED" and used["mode"] == "unaligned" and used["inflight_bytes"] > 0, used
    st = cluster.call("status", {"job_id": job_id})
    assert st["state"] == JobState.RUNNING and st["attempt"] == before + 1, st
    assert [v["parallelism"] for v in st["vertices"]] == [parallelism, parallelism], st
    assert st["restored_checkpoint_id"] == int(m.group(3)) and st["restarts"] == 0, st  # no failure counted
    shown = sluice(cluster, "status", job_id)
    assert re.search(rf"Count -> FileSink\s+parallelism {parallelism}", shown.stdout), shown.stdout
    return float(m.group(4))


@pytest.mark.integration
@pytest.mark.timeout(600)
def test_running_job_rescaled_2_3_1_2_with_the_cli_gives_exact_output(running_cluster: Cluster) -> None:
    cluster = running_cluster
    job_id, out = submit(cluster)
    downtimes = []
    for before, after in ((2, 3), (3, 1), (1, 2)):
        wait_backpressured(cluster, job_id, 2 * before)
        downtimes.append(rescale(cluster, job_id, after))
    print(f"rescale downtimes (stop -> running): {', '.join(f'{d:.3f}s' for d in downtimes)}")
    # a cancelled task that waited for its outputs to drain used to run on for the worker's 10 s cancel limit
    assert max(downtimes) < 5.0, (downtimes, logs(cluster))
    final = cluster.wait_job(job_id, timeout_s=240)
    assert final["state"] == JobState.FINISHED, (final, logs(cluster))
    assert final["attempt"] == 3 and final["restarts"] == 0 and len(final["rescale_s"]) == 3, final
    assert_running_counts(out, generator_counts(WORDS, KEYS, SEED))


@pytest.mark.integration
@pytest.mark.timeout(600)
def test_rescale_needing_more_slots_is_refused_and_the_job_goes_on(running_cluster: Cluster) -> None:
    cluster = running_cluster
    job_id, out = submit(cluster, words=NO_RESCALE_WORDS)
    wait_backpressured(cluster, job_id, 4)
    proc = sluice(cluster, "rescale", job_id, "--parallelism", "5")
    assert proc.returncode == 1 and proc.stdout == "", (proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "needs 5 slots" in lines[0] and "4" in lines[0], proc.stderr
    proc = sluice(cluster, "rescale", job_id, "--parallelism", "Nope=2")
    assert proc.returncode == 1 and len(proc.stderr.strip().splitlines()) == 1 and "Nope" in proc.stderr, proc
    st = cluster.call("status", {"job_id": job_id})
    assert st["state"] == JobState.RUNNING and st["attempt"] == 0 and st["restarts"] == 0, st
    assert [v["parallelism"] for v in st["vertices"]] == [2, 2], st
    final = cluster.wait_job(job_id, timeout_s=240)
    assert final["state"] == JobState.FINISHED and final["attempt"] == 0, (final, logs(cluster))
    assert_running_counts(out, generator_counts(NO_RESCALE_WORDS, KEYS, SEED))
    # a job that is no longer running is refused in one line too
    proc = sluice(cluster, "rescale", job_id, "--parallelism", "1")
    assert proc.returncode == 1 and proc.stderr.strip().count("\n") == 0 and "not RUNNING" in proc.stderr, proc


@pytest.mark.integration
@pytest.mark.timeout(600)
def test_rescale_whose_checkpoint_fails_is_refused_and_the_job_goes_on(cluster: Cluster) -> None:
    """The coordinator's first `_metadata` write fails as on a full disk (its fault hook): the rescale's
    checkpoint does not complete, so nothing is stopped; the next rescale works and the output is exact."""
    cluster.start_coordinator(prefix=launcher(metadata_fails=1))
    cluster.start_worker()
    cluster.start_worker()
    cluster.wait_workers(2)
    manual_only = {**CONFIG, "checkpoint": {**CONFIG["checkpoint"], "interval_s": None}}  # the fault hits ours
    job_id, out = submit(cluster, manual_only, words=ONE_RESCALE_WORDS)
    wait_backpressured(cluster, job_id, 4)
    proc = sluice(cluster, "rescale", job_id, "--parallelism", "3")
    assert proc.returncode == 1 and proc.stdout == "", (proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "checkpoint 1 did not complete" in lines[0] and "unchanged" in lines[0], lines
    st = cluster.call("status", {"job_id": job_id})
    assert st["state"] == JobState.RUNNING and st["attempt"] == 0, st
    assert [v["parallelism"] for v in st["vertices"]] == [2, 2], st
    rescale(cluster, job_id, 3)
    final = cluster.wait_job(job_id, timeout_s=240)
    assert final["state"] == JobState.FINISHED and final["attempt"] == 1, (final, logs(cluster))
    assert_running_counts(out, generator_counts(ONE_RESCALE_WORDS, KEYS, SEED))
