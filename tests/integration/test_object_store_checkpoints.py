"""Checkpoints in an S3-compatible object store (moto's server, a real HTTP server in its own process): the
coordinator writes `_metadata` there, workers upload their task files there, a failover restores from there
with exact output, retention deletes there, and a missing channel-state segment makes failover fall back to the
checkpoint before, as with local files; a paused server times checkpoints out but stops no task, and a wiped
bucket fails the job cleanly. Nothing lands in the local state directory's checkpoints/."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from coordinator.storage import METADATA_FILE
from runtime.cli.processes import child_env
from runtime.common import objectstore
from tests.support.cluster import Cluster, committed_output, poll
from tests.support.failover import (
    assert_exact_output,
    fall_back_from_a_corrupt_latest_checkpoint,
    install,
    kill_once_and_recover,
    kill_worker_running,
    own_segments,
    restart_worker,
    start,
    wait_first_checkpoint,
)
from tests.support.object_store import completed, in_bucket, running_s3
from tests.support.releasable_sink import release
from tests.support.s3_server import S3Server

pytestmark = pytest.mark.integration


@pytest.fixture
def s3() -> Iterator[S3Server]:
    with running_s3() as server:
        yield server


def test_worker_killed_job_restores_from_the_object_store_and_output_is_exact(cluster: Cluster, s3: S3Server) -> None:
    root = in_bucket(cluster, s3)
    setup = install(cluster, words=120_000)
    start(cluster, 3, "--checkpoint-dir", root)
    assert cluster.coordinator is not None and cluster.coordinator.fields["checkpoints"] == root
    job_id = setup.submit("wordcount", checkpoint={"retain": 2})
    st = kill_once_and_recover(setup, job_id)
    path = st["last_checkpoint"].get("path") or ""
    ids = completed(root, job_id)
    # retention deletes the older ones in the bucket: each attempt retains 2 of its own (a checkpoint from before
    # the restart is not the new attempt's to delete); how many were taken depends on the machine's speed
    restored = st["restored_checkpoint_id"]
    assert len([i for i in ids if i <= restored]) <= 2 and len([i for i in ids if i > restored]) <= 2, ids
    assert not path or path.startswith(f"{root}/{job_id}/chk-"), path  # not {root}/checkpoints/...
    # every retained checkpoint is complete; those taken while tasks ran hold their state files (a bounded job's
    # final checkpoint, taken when every task had finished, holds only _metadata)
    listed = {i: objectstore.list_children(f"{root}/{job_id}/chk-{i}") for i in ids}
    assert all(METADATA_FILE in files for files in listed.values()), listed
    assert any(f.endswith(".state") for files in listed.values() for f in files), listed
    assert not os.path.exists(os.path.join(cluster.local.state_dir or "", "checkpoints")), "local checkpoints"


def test_a_segment_deleted_under_the_latest_checkpoint_falls_back_to_the_one_before(cluster: Cluster,
                                                                                    s3: S3Server) -> None:
    """A shared channel-state segment the latest checkpoint wrote and lists is deleted from the bucket: failover
    skips that checkpoint for the one before, with exact output (test_checkpoint_integrity.py: one flipped)."""
    root = in_bucket(cluster, s3)
    setup = install(cluster, words=100_000, sink_delay=0.0003)  # ~15 s, sink-bound: runs on after ~30k
    start(cluster, 3, "--checkpoint-dir", root)
    job_id = setup.submit("wordcount", checkpoint={"interval_s": None})

    def corrupt(path: str) -> str:
        assert path.startswith(root), path
        metadata = json.loads(objectstore.read(f"{path}/{METADATA_FILE}"))
        segments = own_segments(metadata, metadata["checkpoint_id"])
        assert segments, f"the latest checkpoint (under backpressure) wrote no channel-state segment: {metadata}"
        objectstore.delete(f"{objectstore.dirname(path)}/shared/{segments[0]}")
        return segments[0]

    fall_back_from_a_corrupt_latest_checkpoint(setup, job_id, corrupt)


def test_a_savepoint_in_the_bucket_restores_a_cancelled_job_exactly(cluster: Cluster, s3: S3Server) -> None:
    root = in_bucket(cluster, s3)
    setup = install(cluster, words=90_000, sink_delay=0.0002)  # ~9 s: runs past the savepoint
    start(cluster, 2, "--checkpoint-dir", root)
    job_id = setup.submit("wordcount")
    wait_first_checkpoint(setup, job_id)
    sluice = [sys.executable, "-m", "runtime.cli.main"]
    address = "{}:{}".format(*cluster.rpc)
    taken = subprocess.run([*sluice, "savepoint", "--coordinator", address, job_id, "--state-dir",
                            str(cluster.local.state_dir), "--dir", f"{root}/savepoints/manual/"],
                           capture_output=True, text=True, timeout=120, env=cluster.env)
    assert taken.returncode == 0, taken.stderr
    path = taken.stdout.split(": ", 1)[1].strip()
    assert path.startswith(f"{root}/savepoints/manual/savepoint-{job_id}-"), taken.stdout
    refused = subprocess.run([*sluice, "savepoint", "--coordinator", address, job_id, "--state-dir",
                              str(cluster.local.state_dir), "--dir", f"{root}/../elsewhere"],
                             capture_output=True, text=True, timeout=120, env=cluster.env)
    assert refused.returncode == 1 and "not under a savepoint root" in refused.stderr, refused.stderr
    cluster.call("cancel", {"job_id": job_id})
    poll(lambda: setup.status(job_id)["state"] == "CANCELLED", 30, "the job to be cancelled")

    config = {"checkpoint": {"interval_s": 0.5, "mode": "unaligned"}}
    release(cluster)  # the restored job at full speed: the restore, not the data, is under test
    restored = cluster.call("submit", {"entry": "failjobs:wordcount", "config": config,
                                       "sys_path": str(cluster.tmp_path), "restore": path})["job_id"]
    st = setup.wait_finished(restored, 180)
    assert st["restored_checkpoint_id"] == int(path.rsplit("-", 1)[1]), st
    assert_exact_output(setup)


@pytest.mark.parametrize("problem", ["no such bucket", "no server"])
def test_a_checkpoint_dir_in_a_bucket_that_cannot_be_used_stops_the_coordinator_at_start_up(
        tmp_path: Path, s3: S3Server, problem: str) -> None:
    env = {**child_env("object-store-token", str(tmp_path)), **s3.env}
    if problem == "no server":
        s3.create_bucket("there")
        with socket.socket() as s:  # a port nothing listens on
            s.bind(("127.0.0.1", 0))
            env["AWS_ENDPOINT_URL"] = f"http://127.0.0.1:{s.getsockname()[1]}"
        root, reason = "s3://there/checkpoints", "Connection refused"
    else:
        root, reason = "s3://not-a-bucket/checkpoints", "NoSuchBucket"
    proc = subprocess.run([sys.executable, "-m", "runtime.cli", "coordinator", "--port", "0", "--state-dir",
                           str(tmp_path / "state"), "--checkpoint-dir", root], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "ready" not in proc.stdout, proc.stdout
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and len(lines[0]) < 200, proc.stderr
    assert lines[0].startswith(f"sluice coordinator: object store {root}: ") and reason in lines[0], lines[0]


def test_a_paused_server_times_checkpoints_out_while_records_flow_and_a_wiped_bucket_fails_the_job_cleanly(
        cluster: Cluster, s3: S3Server) -> None:
    """The S3 server stopped (SIGSTOP: it holds its connections and answers nothing) right after a checkpoint
    completed: the next checkpoint times out while the tasks go on processing records, and once the server goes on
    checkpoints complete again. Then the bucket's checkpoints are wiped and a worker killed: the restart finds
    nothing of what the job's record names, fails the job in one line saying so, and no count is committed
    twice (test_missing_checkpoints.py, local files, the same)."""
    root = in_bucket(cluster, s3)
    setup = install(cluster, words=120_000, sink_delay=0.0002)  # sink-bound ~12 s: runs past every step
    start(cluster, 2, "--checkpoint-dir", root)
    job_id = setup.submit("wordcount", checkpoint={"timeout_s": 1.5, "tolerable_failures": 100},
                          restart={"delay_s": 1.0})
    wait_first_checkpoint(setup, job_id)

    def failed() -> list[dict[str, Any]]:  # `checkpoints` also lists the bucket: only once it answers again
        return [h for h in cluster.call("checkpoints", {"job_id": job_id})["history"] if h["status"] == "FAILED"]

    def records_in() -> int:
        return sum(t["records_in"] for t in setup.status(job_id)["tasks"])

    completed_before = setup.status(job_id)["checkpoints_completed"]
    poll(lambda: setup.status(job_id)["checkpoints_completed"] > completed_before, 30, "a checkpoint to complete",
         interval_s=0.02)
    s3.pause()  # the next trigger is an interval (0.5 s) away: nothing is writing `_metadata` now
    try:
        flowing = records_in()
        poll(lambda: setup.status(job_id)["checkpoints_failed"] > 0, 30,
             "a checkpoint to fail while the store answers nothing")
        st = setup.status(job_id)
        assert st["state"] == "RUNNING" and st["restarts"] == 0, st
        assert st["checkpoints_completed"] == completed_before + 1, st
        assert records_in() > flowing, "the tasks stopped processing while the object store hung"
    finally:
        s3.resume()
    timed_out = failed()
    assert timed_out and all(h["failure_reason"] == "timeout after 1.5 s" for h in timed_out), timed_out
    last_failed = max(h["checkpoint_id"] for h in timed_out)
    poll(lambda: (setup.status(job_id)["last_checkpoint"] or {}).get("checkpoint_id", 0) > last_failed, 60,
         "a checkpoint to complete once the store answers again")

    st = setup.status(job_id)
    victim = kill_worker_running(cluster, st, 0)
    objectstore.remove_tree(f"{root}/{job_id}")  # the bucket wiped (or its objects expired) under the job
    assert completed(root, job_id) == []
    restart_worker(cluster, victim)
    st = cluster.wait_job(job_id, 60)
    assert st["state"] == "FAILED", f"{st}\n{setup.logs()}"
    recorded = st["last_checkpoint"]
    assert "\n" not in st["error"] and "missing" in st["error"], st["error"]
    assert f"checkpoint {recorded['checkpoint_id']}" in st["error"] and recorded["path"] in st["error"], st
    counts, _ = committed_output(setup.out)
    duplicated = {k: [n for n, m in Counter(v).items() if m > 1] for k, v in counts.items()}
    assert not any(duplicated.values()), {k: v[:5] for k, v in duplicated.items() if v}
