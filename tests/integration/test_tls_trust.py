"""Trust: a token holder cannot import code from, or write savepoints to, paths the operator did not allow;
and with TLS a job runs exactly, while a client without the right certificate is refused."""

from __future__ import annotations

import asyncio
import http.client
import socket
import ssl
import subprocess
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from netstack.errors import RpcError
from netstack.tls import TlsFiles
from runtime.cli.client import call_coordinator
from runtime.cli.processes import sluice_command
from tests.support.cluster import Cluster, poll, write_module
from tests.support.tls_certs import make_ca

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
    cluster.start(1, "--allowed-job-path", str(jobs))
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


# -- TLS ------------------------------------------------------------------------------------------------------

BOUNDED = '''
from runtime.api import DiscardSink, GeneratorSource
from runtime.examples.wordcount import Count


def build(job):
    """Hash-partitioned between two workers: the data links carry it."""
    (job.source(GeneratorSource(count=20000, keys=50), parallelism=2)
        .key_by(lambda r: r[0])
        .process(Count(), parallelism=2)
        .sink(DiscardSink(), parallelism=2))
'''


def _cli(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(sluice_command(*args), env=cluster.env, cwd=str(cluster.tmp_path), capture_output=True,
                          text=True, timeout=60)


@pytest.mark.integration
def test_job_runs_exactly_over_mutual_tls_and_clients_without_the_cert_are_refused(cluster: Cluster) -> None:
    ca = make_ca(cluster.tmp_path / "pki", "cluster")
    rogue = make_ca(cluster.tmp_path / "pki", "rogue")
    tls = TlsFiles(ca.node.cert, ca.node.key, ca.ca)
    cluster.start_coordinator(*tls.as_args())
    cluster.start_worker(*tls.as_args(), worker_id="worker-1")
    cluster.start_worker(*tls.as_args(), worker_id="worker-2")
    rpc_host, rpc_port = cluster.rpc

    def call(method: str, args: dict[str, Any] | None = None) -> Any:
        return asyncio.run(call_coordinator(rpc_host, rpc_port, cluster.token, method, args, tls=tls))

    poll(lambda: len(call("status")["workers"]) == 2, 30, "2 workers to register over TLS")
    write_module(cluster.tmp_path, "tlsjob", BOUNDED)
    job_id = call("submit", {"entry": "tlsjob:build", "config": {}, "sys_path": str(cluster.tmp_path)})["job_id"]
    result: dict[str, Any] = {}

    def ended() -> bool:
        result.update(call("status", {"job_id": job_id}))
        return result["state"] in ("FINISHED", "FAILED", "CANCELLED")

    poll(ended, 120, f"job {job_id} to end", interval_s=0.25)
    assert result["state"] == "FINISHED", result
    assert {t["worker"] for t in result["tasks"]} == {"worker-1", "worker-2"}, result["tasks"]
    sinks = [t for t in result["tasks"] if "Discard" in t["name"]]
    assert sum(t["records_in"] for t in sinks) == 20000, result["tasks"]

    # the CLI with the right files works ...
    ok = _cli(cluster, "status", "--coordinator", f"{rpc_host}:{rpc_port}", *tls.as_args())
    assert ok.returncode == 0 and "workers: 2" in ok.stdout, ok.stderr
    # ... and without them it is refused with one clear line
    refused = {
        "no certificate": ["--tls-ca", ca.ca],
        "a certificate of another CA": ["--tls-cert", rogue.node.cert, "--tls-key", rogue.node.key, "--tls-ca", ca.ca],
    }
    for what, args in refused.items():
        bad = _cli(cluster, "status", "--coordinator", f"{rpc_host}:{rpc_port}", *args)
        assert bad.returncode == 1, (what, bad.stdout, bad.stderr)
        assert bad.stderr.startswith("sluice status: TLS:") and "certificate" in bad.stderr, (what, bad.stderr)
        assert "Traceback" not in bad.stderr and len(bad.stderr.strip().splitlines()) == 1, bad.stderr
    plain = _cli(cluster, "status", "--coordinator", f"{rpc_host}:{rpc_port}")  # no TLS at all
    assert plain.returncode == 1 and "Traceback" not in plain.stderr, plain.stderr
    # a client that does not trust the cluster's CA refuses the coordinator
    distrust = _cli(cluster, "status", "--coordinator", f"{rpc_host}:{rpc_port}", "--tls-cert", ca.node.cert,
                    "--tls-key", ca.node.key, "--tls-ca", rogue.ca)
    assert distrust.returncode == 1 and "certificate verify failed" in distrust.stderr, distrust.stderr
    # the data port speaks only TLS too: a plaintext hello gets no answer in our protocol
    data_host, data_port = cluster.workers[1].address("data")
    with socket.create_connection((data_host, data_port), timeout=10) as s:
        s.sendall(b"SL" + b"\0" * 30)
        reply = s.recv(64)
    assert not reply.startswith(b"SL"), reply
    assert call("status")["workers"], "the cluster kept serving"
    # REST and every metrics endpoint are HTTPS with the cluster's certificate: no plain-text port is left
    trusting = ssl.create_default_context(cafile=ca.ca)
    trusting.check_hostname = False
    assert cluster.coordinator is not None
    endpoints = [f"https://{cluster.coordinator.fields['http']}/api/v1/jobs/{job_id}/checkpoints?limit=2",
                 *(f"https://{p.fields['metrics']}/metrics" for p in (cluster.coordinator, *cluster.workers))]
    for url in endpoints:
        with urllib.request.urlopen(url, context=trusting, timeout=10) as response:
            assert response.status == 200 and response.read(), url
        with pytest.raises((urllib.error.URLError, ConnectionError, http.client.HTTPException)):
            urllib.request.urlopen(url.replace("https://", "http://"), timeout=10).read()
    for name in ("coordinator", "worker-1", "worker-2"):
        assert "Traceback" not in cluster.log(name), cluster.log(name)
