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
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.support.cluster import Cluster, holds_for, poll
from tests.support.failover import (
    WORKER_ARGS,
    assert_exact_output,
    assert_recovered,
    install,
    kill_once_and_recover,
    sink_placement,
    start,
    wait_first_checkpoint,
    worker_id_of,
)
from tests.support.releasable_sink import release

pytestmark = pytest.mark.integration

# -- 1: a worker killed with SIGKILL ---------------------------------------------------------------------------


def test_worker_killed_job_restores_and_output_is_exact(cluster: Cluster) -> None:
    """With the count in a slot sharing group of its own (the other kill tests run the default placement): its
    subtasks take slots 2 and 3 of the 3 workers' interleaved slots, so count 0 runs apart from source 0."""
    setup = install(cluster, words=120_000)
    start(cluster)
    job_id = setup.submit("wordcount_grouped")
    placement = wait_first_checkpoint(setup, job_id)["placement"]
    assert placement["0:0"] != placement["1:0"] and len(set(placement.values())) == 3, placement
    kill_once_and_recover(setup, job_id)


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
    # the web UI's exception history: each failure with the task's traceback and what it caused
    assert cluster.coordinator is not None
    http = cluster.coordinator.fields["http"]
    with urllib.request.urlopen(f"http://{http}/api/v1/jobs/{job_id}/exceptions", timeout=10) as resp:
        history = json.loads(resp.read())["exceptions"]  # newest first
    assert [e["outcome"] for e in history] == ["failed", "restarted", "restarted"], history
    assert [e["restarted_attempt"] for e in history] == [None, 2, 1], history
    for e in history:
        assert e["task"] and e["worker"] in ("worker-1", "worker-2"), e
        assert e["traceback"].startswith("Traceback") and "injected permanent failure" in e["traceback"], e

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
    holds_for(lambda: {p.name: p.read_bytes() for p in setup.out.iterdir() if not p.name.startswith(".")} == committed,
              1.0, "the committed output")


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
    setup = install(cluster, words=150_000, sink_delay=0.0001)  # still blocked after the first checkpoint
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
    # the sources have acknowledged (they snapshot as they emit the barrier): the barriers are in the queues
    poll(lambda: any(h["status"] == "IN_PROGRESS" and h["state_bytes"] > 0
                     for h in cluster.call("checkpoints", {"job_id": job_id})["history"]),
         10, "the aligned checkpoint's barriers to leave the sources")
    st = setup.status(job_id)
    assert st["last_checkpoint"]["checkpoint_id"] == first["checkpoint_id"], "the aligned checkpoint was too quick"
    victim_id = sink_placement(st)[1]
    victim = next(w for w in cluster.workers if worker_id_of(w) == victim_id)
    os.kill(victim.pid, signal.SIGKILL)
    victim.proc.wait(10)
    thread.join(30)
    assert results and results[0].get("status") == "ABORTED", results
    cluster.start_worker(*WORKER_ARGS, worker_id=victim_id)
    release(cluster)  # the restored attempt at full speed: the abort and the restore are under test

    st = setup.wait_finished(job_id)
    assert_recovered(st, 1)
    assert st["restored_checkpoint_id"] == first["checkpoint_id"], st
    assert_exact_output(setup)


def _call(cluster: Cluster, job_id: str) -> Any:
    try:
        return cluster.call("checkpoint", {"job_id": job_id, "timeout_s": 60})
    except Exception as exc:  # the RPC may fail with the job instead of reporting the abort
        return {"status": "ERROR", "error": repr(exc)}
