"""A job whose completed checkpoints vanished from the checkpoint store (a deleted directory, a wiped or expired
bucket) is never started again from scratch on top of its committed output: the restart fails the job with one
line naming what is missing, and the sink holds no duplicate."""

from __future__ import annotations

import shutil
from collections import Counter

import pytest

from tests.support.cluster import Cluster, committed_output
from tests.support.failover import install, kill_worker_running, restart_worker, start, wait_first_checkpoint

pytestmark = pytest.mark.integration


def test_checkpoints_deleted_then_a_worker_killed_fails_the_job_without_duplicates(cluster: Cluster) -> None:
    setup = install(cluster, words=120_000)
    start(cluster)
    job_id = setup.submit("wordcount", restart={"delay_s": 1.0})
    st = wait_first_checkpoint(setup, job_id)
    # kill first, then wipe: no checkpoint can complete without the dead worker's ack, so the restart finds the
    # store empty although the job's record names completed checkpoints whose output is committed
    victim = kill_worker_running(cluster, st, 0)
    shutil.rmtree(cluster.tmp_path / "state" / "checkpoints" / job_id)
    restart_worker(cluster, victim)

    st = cluster.wait_job(job_id, 60)
    assert st["state"] == "FAILED", f"{st}\n{setup.logs()}"
    error = st["error"]
    assert "\n" not in error, error
    recorded = st["last_checkpoint"]
    assert f"checkpoint {recorded['checkpoint_id']}" in error and recorded["path"] in error, (error, recorded)
    assert "missing" in error, error
    assert len(st["failures"]) == 2, st  # the kill, then the missing checkpoint: no further restart is tried
    assert error in cluster.log("coordinator"), "the coordinator's log names what is missing"

    counts, _ = committed_output(setup.out)
    duplicated = {k: [n for n, m in Counter(v).items() if m > 1] for k, v in counts.items()}
    assert not any(duplicated.values()), {k: v[:5] for k, v in duplicated.items() if v}
