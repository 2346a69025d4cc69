"""How a job ends, on a real cluster: failover started by failing checkpoints (a full disk under the state
directory, injected at the `_metadata` write with SLUICE_FAULT_METADATA_FAILS) restarts the job or fails it with
its cause; checkpoints go on after some tasks finished; and the end of a bounded job is its final checkpoint,
committed exactly once even when a worker dies while the sinks publish it."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from tests.integration.conftest import Cluster
from tests.integration.test_failover import WORKER_ARGS, assert_exact_output, install

pytestmark = pytest.mark.integration


def start_with_env(cluster: Cluster, workers: int, coordinator_env: dict[str, str]) -> None:
    """A coordinator that sees `coordinator_env` (fault hooks), and workers that do not."""
    plain = dict(cluster.env)
    cluster.env.update(coordinator_env)
    cluster.start_coordinator()
    cluster.env.clear()
    cluster.env.update(plain)
    for i in range(workers):
        cluster.start_worker(*WORKER_ARGS, worker_id=f"worker-{i + 1}")
    cluster.wait_workers(workers)


# -- 1: too many failed checkpoints ------------------------------------------------------------------------------


def test_failed_checkpoints_restart_the_job_and_output_is_exact(cluster: Cluster) -> None:
    # the first two _metadata writes fail with ENOSPC; one is tolerated, the second fails the attempt
    setup = install(cluster, words=120_000)
    start_with_env(cluster, 2, {"SLUICE_FAULT_METADATA_FAILS": "2"})
    job_id = setup.submit("wordcount", checkpoint={"interval_s": 0.3, "tolerable_failures": 1})
    st = setup.wait_finished(job_id, 120)
    assert st["restarts"] == 1 and st["attempt"] == 1, st
    assert "checkpoints failing" in st["failures"][0] and "No space left" in st["failures"][0], st
    assert st["error"] == "", st
    assert "restarting in" in cluster.log("coordinator")
    assert_exact_output(setup)


def test_failed_checkpoints_after_the_last_restart_fail_the_job_and_submit_wait_returns(cluster: Cluster) -> None:
    install(cluster, words=400_000)
    start_with_env(cluster, 2, {"SLUICE_FAULT_METADATA_FAILS": "-1"})
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
    assert all(p.proc.poll() is None for p in [*cluster.workers, cluster.coordinator])
