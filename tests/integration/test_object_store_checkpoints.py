"""Checkpoints in an S3-compatible object store (moto's server, a real HTTP server in its own process): the
coordinator writes `_metadata` there, workers upload their task files there, a failover restores from there
with exact output, retention deletes there, and a corrupt object makes failover fall back to the checkpoint
before, as with local files. Nothing lands in the local state directory's checkpoints/."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from coordinator.storage import METADATA_FILE
from runtime.cli.processes import child_env
from runtime.common import objectstore
from tests.support.cluster import Cluster, poll
from tests.support.failover import (
    assert_exact_output,
    fall_back_from_a_corrupt_latest_checkpoint,
    install,
    kill_once_and_recover,
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


def test_a_corrupt_object_in_the_latest_checkpoint_falls_back_to_the_one_before(cluster: Cluster,
                                                                               s3: S3Server) -> None:
    root = in_bucket(cluster, s3)
    setup = install(cluster, words=100_000, sink_delay=0.0003)  # ~15 s, sink-bound: runs on after ~30k
    start(cluster, 3, "--checkpoint-dir", root)
    job_id = setup.submit("wordcount", checkpoint={"interval_s": None})

    def corrupt(path: str) -> str:
        assert path.startswith(root), path
        state = sorted(n for n in objectstore.list_children(path) if n.endswith(".state"))[-1]
        key = f"{path}/{state}"
        data = objectstore.read(key)
        objectstore.write(key, data[: len(data) // 2] + bytes([data[len(data) // 2] ^ 1]) + data[len(data) // 2 + 1:])
        return state

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
