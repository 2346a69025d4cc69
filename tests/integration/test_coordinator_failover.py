"""Coordinator failover with real processes: kill -9 the coordinator of a backpressured job with unaligned
checkpoints and start it again on the same state directory and port; kill -9 a leader with a standby beside it.
In both the job carries on from its latest completed checkpoint with no user action (no resubmission, no
--restore) and its committed output is exact: every key's counts 1..n, each once."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from netstack.errors import ConnectionLost
from runtime.cli.client import call_leader
from runtime.cli.processes import Managed, start_process, stop_process
from tests.support.cluster import Cluster, assert_running_counts, generator_counts, poll, write_module
from tests.support.releasable_sink import RELEASABLE_SINK, release, release_path

pytestmark = pytest.mark.integration

WORDS, KEYS, SEED = 90_000, 50, 11  # long enough for two checkpoints before the end on a loaded machine
JOB = '''
from runtime.api import FileSink, GeneratorSource, Job
from runtime.examples.wordcount import Count

RELEASE = {release!r}
''' + RELEASABLE_SINK + f'''

def wordcount(job: Job) -> None:
    (job.source(GeneratorSource(count={WORDS}, keys={KEYS}, seed={SEED}), parallelism=2)
        .key_by(lambda r: r[0])
        .process(Count(), parallelism=2)
        .sink(ReleasableSink({{out!r}}, delay_per_record_s=0.00015)))
'''
WORKER_ARGS = ("--heartbeat-interval", "0.25s")
# small buffers: the slow sink backpressures the whole job, and unaligned checkpoints persist in-flight data
JOB_FLAGS = ["--buffer-bytes", "4096", "--buffers-per-channel", "2", "--checkpoint-interval", "300ms",
             "--checkpoint-mode", "unaligned", "--restart-delay", "200ms"]


def install(cluster: Cluster) -> Path:
    out = cluster.tmp_path / "out"
    write_module(cluster.tmp_path, "failover_jobs", JOB.format(out=str(out), release=release_path(cluster)))
    return out


def leader_call(addresses: list[tuple[str, int]], token: str, method: str, args: dict[str, Any]) -> Any:
    return asyncio.run(call_leader(addresses, token, method, args, retry_s=30.0))


def wait_running_with_checkpoint(addresses: list[tuple[str, int]], token: str, job_id: str) -> dict[str, Any]:
    seen: dict[str, Any] = {}

    def ready() -> bool:
        seen.update(leader_call(addresses, token, "status", {"job_id": job_id}))
        assert seen["state"] not in ("FAILED", "CANCELLED", "FINISHED"), seen
        return seen["state"] == "RUNNING" and (seen["last_checkpoint"] or {}).get("checkpoint_id", 0) >= 2

    poll(ready, 90, "the job running with two completed checkpoints", interval_s=0.1)
    return seen


def kill9(proc: Managed) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.proc.wait(10)


def test_restarted_coordinator_recovers_a_running_job(cluster: Cluster) -> None:
    out = install(cluster)
    cluster.start_coordinator()
    address = cluster.rpc
    for i in range(2):
        cluster.start_worker(*WORKER_ARGS, worker_id=f"worker-{i + 1}")
    cluster.wait_workers(2)
    # the user's command: `submit --wait` must ride out the coordinator's death and report the end
    submit = subprocess.Popen(
        [sys.executable, "-m", "runtime.cli", "submit", "--coordinator", f"{address[0]}:{address[1]}",
         "failover_jobs:wordcount", "--wait", "--state-dir", str(cluster.tmp_path / "state"), *JOB_FLAGS],
        cwd=cluster.tmp_path, env=cluster.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert submit.stdout is not None
        first = submit.stdout.readline()
        assert first.startswith("submitted job-"), first
        job_id = first.split()[1]
        before = wait_running_with_checkpoint([address], cluster.token, job_id)
        assert cluster.coordinator is not None
        kill9(cluster.coordinator)
        killed_at = time.monotonic()
        cluster.start_coordinator("--port", str(address[1]))  # same state directory and port; nothing resubmitted
        assert cluster.rpc[1] == address[1]
        cluster.wait_workers(2, timeout_s=60)  # the workers found it on their own

        def recovered() -> bool:
            st = cluster.call("status", {"job_id": job_id})
            return st["state"] == "FINISHED" or (st["state"] == "RUNNING" and st["attempt"] > before["attempt"]
                                                 and st["checkpoints_completed"] > before["checkpoints_completed"])

        poll(recovered, 120, "the recovered job to complete a checkpoint")
        release(cluster)  # the rest of the input at full speed
        try:
            output, _ = submit.communicate(timeout=240)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"submit --wait did not end\n{cluster.log('coordinator')[-4000:]}") from None
        assert submit.returncode == 0, output
        assert f"job {job_id}  FINISHED" in output, output
    finally:
        if submit.poll() is None:
            submit.kill()
            submit.wait(10)
    st = cluster.call("status", {"job_id": job_id})
    assert st["state"] == "FINISHED", st
    assert st["attempt"] > before["attempt"], (before["attempt"], st)
    assert "coordinator failover" in st["failures"], st
    assert st["restored_checkpoint_id"] is not None and st["restored_checkpoint_id"] >= 2, st
    assert st["restarts"] == 0, st  # a recovery is not a restart of the job's strategy
    assert cluster.call("status")["coordinator"]["recovered_jobs"] == 1
    assert time.monotonic() - killed_at < 240
    assert_running_counts(out, generator_counts(WORDS, KEYS, SEED))

    # the job's past survived with its record: the first coordinator's checkpoints are in the history and counted
    first_id = before["last_checkpoint"]["checkpoint_id"]
    history = cluster.call("checkpoints", {"job_id": job_id})["history"]
    assert any(h["checkpoint_id"] == first_id and h["status"] == "COMPLETED" for h in history), history
    assert st["checkpoints_completed"] >= before["checkpoints_completed"] + 1, (before, st)
    # and a coordinator that finds the job ended shows its page as it ended: vertices, counters, exceptions
    kill9(cluster.coordinator)
    cluster.start_coordinator("--port", str(address[1]))
    http = cluster.coordinator.fields["http"]
    job = rest_get(http, f"/api/v1/jobs/{job_id}")
    assert (job["state"], job["checkpoints_completed"]) == ("FINISHED", st["checkpoints_completed"]), job
    graph = rest_get(http, f"/api/v1/jobs/{job_id}/graph")
    assert [(v["name"].split(" ")[0], v["parallelism"]) for v in graph["vertices"]] == [("GeneratorSource", 2),
                                                                                        ("Count", 2)], graph
    assert graph["vertices"][0]["records_out"] > 0 and len(graph["edges"]) == 1
    [failover] = rest_get(http, f"/api/v1/jobs/{job_id}/exceptions")["exceptions"]
    assert (failover["cause"], failover["outcome"], failover["restored_checkpoint_id"]) == (
        "coordinator failover", "restarted", st["restored_checkpoint_id"]), failover


def rest_get(http: str, path: str) -> Any:
    with urllib.request.urlopen(f"http://{http}{path}", timeout=10) as resp:
        return json.loads(resp.read())


def test_standby_takes_over_when_the_leader_dies(cluster: Cluster) -> None:
    out = install(cluster)
    leader = cluster.start_coordinator("--lease-timeout", "2s")
    state_dir = str(cluster.tmp_path / "state")
    standby = start_process(
        "coordinator", ["--host", "127.0.0.1", "--port", "0", "--metrics-port", "0", "--state-dir", state_dir,
                        "--standby", "--lease-timeout", "2s"],
        env=cluster.env, cwd=str(cluster.tmp_path), log_path=str(cluster.log_dir / "standby.log"))
    try:
        assert standby.fields["role"] == "standby"
        addresses = [leader.address("rpc"), standby.address("rpc")]
        both = ",".join(f"{h}:{p}" for h, p in addresses)
        for i in range(2):
            cluster.start_worker(*WORKER_ARGS, "--coordinator", both, worker_id=f"worker-{i + 1}")
        cluster.wait_workers(2)
        # the standby serves nothing but the leader's address
        with pytest.raises(ConnectionLost, match=f"not the leader; the leader is 127.0.0.1:{addresses[0][1]}"):
            asyncio.run(call_leader([addresses[1]], cluster.token, "status", {}, retry_s=0.0))
        job_id = leader_call(addresses, cluster.token, "submit", {
            "entry": "failover_jobs:wordcount", "sys_path": str(cluster.tmp_path),
            "config": {"buffer_bytes": 4096, "buffers_per_channel": 2,
                       "checkpoint": {"interval_s": 0.3, "mode": "unaligned"},
                       "restart": {"kind": "fixed", "max_attempts": 3, "delay_s": 0.2}}})["job_id"]
        before = wait_running_with_checkpoint(addresses, cluster.token, job_id)
        kill9(leader)
        # the workers and our calls find the new leader in the list; the job ends with no user action
        result: dict[str, Any] = {}

        def ended() -> bool:
            result.update(leader_call(addresses, cluster.token, "status", {"job_id": job_id}))
            if (result["state"] == "RUNNING" and result["attempt"] > before["attempt"]
                    and result["checkpoints_completed"] > before["checkpoints_completed"]):
                release(cluster)  # the new leader runs the job and checkpoints it: the rest at full speed
            return result["state"] in ("FINISHED", "FAILED", "CANCELLED")

        try:
            poll(ended, 240, f"job {job_id} to end on the new leader", interval_s=0.25)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{Path(cluster.log_dir / 'standby.log').read_text()[-4000:]}") from None
        assert result["state"] == "FINISHED", result
        assert "coordinator failover" in result["failures"], result
        # the new leader counts the old leader's checkpoints too (they came with the job's record)
        assert result["checkpoints_completed"] > before["checkpoints_completed"] >= 2, (before, result)
        history = leader_call(addresses, cluster.token, "checkpoints", {"job_id": job_id})["history"]
        old_id = before["last_checkpoint"]["checkpoint_id"]
        assert any(h["checkpoint_id"] == old_id and h["status"] == "COMPLETED" for h in history), history
        overview = asyncio.run(call_leader([addresses[1]], cluster.token, "status", {}, retry_s=0.0))
        assert overview["coordinator"]["epoch"] == 2, overview
        assert overview["coordinator"]["recovered_jobs"] == 1, overview
        assert_running_counts(out, generator_counts(WORDS, KEYS, SEED))
    finally:
        stop_process(standby)


def test_a_paused_leader_is_fenced_off_when_it_resumes(cluster: Cluster) -> None:
    """SIGSTOP the leader: its process lives, so the standby waits the lease out, then takes over and finishes
    the job; the workers move to it within a few seconds of the takeover, while the old leader is still paused.
    Resumed, the old leader finds the newer lease epoch and exits (status 1) without touching a job."""
    install(cluster)
    leader = cluster.start_coordinator("--lease-timeout", "2s")
    state_dir = cluster.tmp_path / "state"
    standby = start_process(
        "coordinator", ["--host", "127.0.0.1", "--port", "0", "--metrics-port", "0", "--state-dir", str(state_dir),
                        "--standby", "--lease-timeout", "2s"],
        env=cluster.env, cwd=str(cluster.tmp_path), log_path=str(cluster.log_dir / "standby.log"))
    try:
        addresses = [leader.address("rpc"), standby.address("rpc")]
        both = ",".join(f"{h}:{p}" for h, p in addresses)
        for i in range(2):
            cluster.start_worker(*WORKER_ARGS, "--coordinator", both, worker_id=f"worker-{i + 1}")
        cluster.wait_workers(2)
        job_id = leader_call(addresses, cluster.token, "submit", {
            "entry": "failover_jobs:wordcount", "sys_path": str(cluster.tmp_path),
            "config": {"checkpoint": {"interval_s": 0.3, "mode": "unaligned"}}})["job_id"]
        wait_running_with_checkpoint(addresses, cluster.token, job_id)
        os.kill(leader.pid, signal.SIGSTOP)
        paused_at = time.monotonic()
        try:
            poll(lambda: (state_dir / "leader" / "epoch-2").exists(), 60, "the standby to take lease epoch 2",
                 interval_s=0.05)
            took_over = time.monotonic()
            assert took_over - paused_at >= 1.5  # the lease was waited out: the holder's process lived
            # the workers follow the lease while the old leader is still paused (its links open, its port
            # accepting): they must not wait out their own heartbeat call (10 s) nor a dial to it
            poll(lambda: len(leader_call([addresses[1]], cluster.token, "status", {})["workers"]) == 2, 30,
                 "the workers to register with the new leader", interval_s=0.05)
            moved_s = time.monotonic() - took_over
            record = (state_dir / "jobs" / f"{job_id}.json").read_bytes()
        finally:
            os.kill(leader.pid, signal.SIGCONT)
        assert moved_s < 4.0, f"the workers moved {moved_s:.1f}s after the new leader took the lease"
        assert leader.wait(30) == 1  # and its log complete
        assert "lost leadership (lease epoch 2 was taken by another coordinator)" in cluster.log("coordinator")
        result: dict[str, Any] = {}

        def ended() -> bool:
            result.update(leader_call([addresses[1]], cluster.token, "status", {"job_id": job_id}))
            return result["state"] in ("FINISHED", "FAILED", "CANCELLED")

        poll(ended, 240, f"job {job_id} to end on the new leader", interval_s=0.25)
        assert result["state"] == "FINISHED", result
        assert (state_dir / "jobs" / f"{job_id}.json").read_bytes() != record  # the new leader's, not the old's
        # the record is written behind the state change (coordinator/job_store.py batches its writes)
        poll(lambda: b'"state": "FINISHED"' in (state_dir / "jobs" / f"{job_id}.json").read_bytes(), 10,
             "the new leader to write the job's record as FINISHED")
    finally:
        stop_process(standby)


def test_a_second_coordinator_on_a_led_state_dir_exits_with_one_line(cluster: Cluster) -> None:
    leader = cluster.start_coordinator()
    proc = subprocess.run(
        [sys.executable, "-m", "runtime.cli", "coordinator", "--port", "0", "--no-metrics", "--state-dir",
         str(cluster.tmp_path / "state")], cwd=cluster.tmp_path, env=cluster.env, capture_output=True, text=True,
        timeout=60)
    assert proc.returncode == 1, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("sluice coordinator: coordinator c-") and "--standby" in last, proc.stderr
    assert f"at {leader.fields['rpc']} leads state directory" in last, last
    assert leader.proc.poll() is None  # the leader goes on
    assert cluster.call("status")["coordinator"]["epoch"] == 1
