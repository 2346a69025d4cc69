"""Trust: a token holder cannot import code from, or write savepoints to, paths the operator did not allow;
and with TLS a job runs exactly, while a client without the right certificate is refused."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from netstack.errors import RpcError
from tests.integration.conftest import Cluster, poll, write_module

JOB = '''
from runtime.api import DiscardSink, GeneratorSource, Job

def endless(job: Job) -> None:
    (job.source(GeneratorSource(count=None, keys=10, seed=1, records_per_second=500), parallelism=1)
        .sink(DiscardSink()))
'''

EVIL = '''
open({marker!r}, "w").write("imported")

def build(job):
    raise SystemExit("never")
'''


def _wait_running(cluster: Cluster, job_id: str) -> None:
    def running() -> bool:
        st = cluster.call("status", {"job_id": job_id})
        assert st["state"] in ("CREATED", "DEPLOYING", "RUNNING"), st
        return bool(st["state"] == "RUNNING")

    poll(running, 60, f"job {job_id} to run")


@pytest.mark.integration
def test_job_path_outside_the_allowed_paths_is_refused_and_not_imported(
        running_cluster: Cluster, tmp_path_factory: Any) -> None:
    cluster = running_cluster
    elsewhere = tmp_path_factory.mktemp("elsewhere")  # not under the coordinator's working directory
    marker = elsewhere / "imported.txt"
    write_module(elsewhere, "evil", EVIL.format(marker=str(marker)))
    with pytest.raises(RpcError) as err:
        cluster.call("submit", {"entry": "evil:build", "config": {}, "sys_path": str(elsewhere)})
    assert str(elsewhere) in str(err.value) and "--allowed-job-path" in str(err.value), err.value
    assert not marker.exists(), "the coordinator imported a module from a path it was not allowed"
    assert cluster.call("status")["jobs"] == []


@pytest.mark.integration
def test_allowed_job_path_option_admits_another_directory(cluster: Cluster, tmp_path_factory: Any) -> None:
    jobs = tmp_path_factory.mktemp("jobs")
    write_module(jobs, "allowedjob", JOB)
    cluster.start_coordinator("--allowed-job-path", str(jobs))
    cluster.start_worker()
    cluster.wait_workers(1)
    job_id = cluster.call("submit", {"entry": "allowedjob:endless", "config": {}, "sys_path": str(jobs)})["job_id"]
    _wait_running(cluster, job_id)
    # the working directory is no longer allowed once paths are given explicitly
    write_module(cluster.tmp_path, "cwdjob", JOB)
    with pytest.raises(RpcError, match="--allowed-job-path"):
        cluster.submit("cwdjob:endless")
    cluster.call("cancel", {"job_id": job_id})


@pytest.mark.integration
def test_savepoint_outside_the_roots_is_refused_and_default_root_is_used(
        running_cluster: Cluster, tmp_path_factory: Any) -> None:
    cluster = running_cluster
    write_module(cluster.tmp_path, "trustjob", JOB)
    job_id = cluster.submit("trustjob:endless")
    _wait_running(cluster, job_id)
    outside = tmp_path_factory.mktemp("outside")
    with pytest.raises(RpcError) as err:
        cluster.call("checkpoint", {"job_id": job_id, "savepoint": True, "directory": str(outside / "sp")})
    assert str(outside / "sp") in str(err.value) and "--savepoint-root" in str(err.value), err.value
    assert not (outside / "sp").exists()
    # a symlink inside the root that leads out of it is judged by its target
    root = cluster.tmp_path / "state" / "savepoints"
    root.mkdir(parents=True, exist_ok=True)
    (root / "link").symlink_to(outside)
    with pytest.raises(RpcError, match="--savepoint-root"):
        cluster.call("checkpoint", {"job_id": job_id, "savepoint": True, "directory": str(root / "link")})
    assert list(outside.iterdir()) == []
    # no directory: the default root, <state-dir>/savepoints
    result = cluster.call("checkpoint", {"job_id": job_id, "savepoint": True})
    assert result["status"] == "COMPLETED", result
    assert Path(result["path"]).parent == root.resolve(), result
    assert cluster.call("status", {"job_id": job_id})["state"] == "RUNNING"
    cluster.call("cancel", {"job_id": job_id})
