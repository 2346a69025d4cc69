"""The coordinator's RPC surface with real processes: wait_job, `submit --wait`, unknown methods, metrics."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from netstack.errors import RpcError
from runtime.cli.client import call_coordinator, wait_job
from tests.support.cluster import Cluster, poll, reaped_cluster, write_module

pytestmark = pytest.mark.integration

JOBS = '''
from runtime.api import DiscardSink, GeneratorSource

from runtime.examples.wordcount import Count


def endless(job):
    (job.source(GeneratorSource(count=None, keys=10, records_per_second=500), parallelism=2)
        .key_by(lambda r: r[0])
        .process(Count(), parallelism=2)
        .sink(DiscardSink(), parallelism=2))


def bounded(job):
    (job.source(GeneratorSource(count=2000, keys=10), parallelism=2)
        .key_by(lambda r: r[0])
        .process(Count(), parallelism=2)
        .sink(DiscardSink(), parallelism=2))
'''


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """One running cluster for the module (overrides the function-scoped fixture of tests/conftest.py)."""
    with reaped_cluster(tmp_path_factory.mktemp("coordinator_rpc")) as c:
        c.start(2)
        write_module(c.tmp_path, "rpcjobs", JOBS)
        yield c


def run(cluster: Cluster, coro_fn: Any) -> Any:
    host, port = cluster.rpc
    return asyncio.run(coro_fn(host, port, cluster.token))


def running(cluster: Cluster, job_id: str) -> None:
    poll(lambda: cluster.call("status", {"job_id": job_id})["state"] == "RUNNING", 60, f"job {job_id} to run")


def cancel(cluster: Cluster, job_id: str) -> None:
    assert cluster.call("cancel", {"job_id": job_id})["state"] == "CANCELLED"


def test_wait_job_returns_the_summary_when_a_bounded_job_finishes(cluster: Cluster) -> None:
    job_id = cluster.submit("rpcjobs:bounded")
    summary = run(cluster, lambda h, p, t: call_coordinator(h, p, t, "wait_job", {"job_id": job_id, "timeout_s": 120},
                                                             timeout_s=150))
    assert summary["job_id"] == job_id
    assert summary["state"] == "FINISHED", summary
    assert summary["tasks_finished"] == summary["tasks_total"] > 0


def test_wait_job_on_a_running_job_returns_after_its_timeout_with_the_job_still_running(cluster: Cluster) -> None:
    job_id = cluster.submit("rpcjobs:endless")
    running(cluster, job_id)
    t0 = time.monotonic()
    summary = run(cluster, lambda h, p, t: call_coordinator(h, p, t, "wait_job", {"job_id": job_id, "timeout_s": 1.0}))
    elapsed = time.monotonic() - t0
    try:
        assert summary["state"] == "RUNNING"
        assert 1.0 <= elapsed < 15.0, elapsed
    finally:
        cancel(cluster, job_id)


def test_wait_job_returns_as_soon_as_the_job_is_cancelled(cluster: Cluster) -> None:
    job_id = cluster.submit("rpcjobs:endless")
    running(cluster, job_id)

    async def scenario(host: str, port: int, token: str) -> tuple[dict[str, Any], float]:
        waiting = asyncio.create_task(wait_job(host, port, token, job_id, timeout_s=120.0))
        # the wait is under way on its own connection while the job keeps running
        status = await call_coordinator(host, port, token, "status", {"job_id": job_id})
        assert status["state"] == "RUNNING" and not waiting.done()
        t0 = time.monotonic()
        assert (await call_coordinator(host, port, token, "cancel", {"job_id": job_id}))["state"] == "CANCELLED"
        summary = await asyncio.wait_for(waiting, 60.0)
        return summary, time.monotonic() - t0

    summary, after_cancel_s = run(cluster, scenario)
    assert summary["state"] == "CANCELLED"
    assert after_cancel_s < 15.0, after_cancel_s  # not the 120 s timeout


def test_wait_job_of_an_unknown_job_or_with_a_bad_timeout_is_one_clear_error(cluster: Cluster) -> None:
    with pytest.raises(RpcError, match="no job job-nope") as exc:
        cluster.call("wait_job", {"job_id": "job-nope"})
    assert exc.value.remote_type == "UnknownJob"
    job_id = cluster.submit("rpcjobs:bounded")
    with pytest.raises(RpcError, match=r"wait_job: 'timeout_s': .*'soon'"):  # the field and the value refused
        cluster.call("wait_job", {"job_id": job_id, "timeout_s": "soon"})
    assert run(cluster, lambda h, p, t: wait_job(h, p, t, job_id, timeout_s=120.0))["state"] == "FINISHED"


def test_unknown_method_is_named_and_the_coordinator_keeps_serving(cluster: Cluster) -> None:
    with pytest.raises(RpcError, match="unknown method 'no_such_method'") as exc:
        cluster.call("no_such_method", {})
    assert exc.value.remote_type == "UnknownMethod"
    assert len(cluster.call("status")["workers"]) == 2


def cli(cluster: Cluster, *args: str, timeout_s: float = 180.0) -> subprocess.CompletedProcess[str]:
    assert cluster.coordinator is not None
    return subprocess.run([sys.executable, "-m", "runtime.cli", "submit", "--coordinator",
                           cluster.coordinator.fields["rpc"], *args], env=cluster.env, cwd=str(cluster.tmp_path),
                          capture_output=True, text=True, timeout=timeout_s)


def test_cli_submit_wait_exits_zero_when_the_job_finishes(cluster: Cluster) -> None:
    result = cli(cluster, "rpcjobs:bounded", "--wait")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "FINISHED" in result.stdout


def test_cli_submit_wait_timeout_gives_up_with_one_line_and_leaves_the_job_running(cluster: Cluster) -> None:
    t0 = time.monotonic()
    result = cli(cluster, "rpcjobs:endless", "--wait", "--wait-timeout", "2s")
    elapsed = time.monotonic() - t0
    job_id = result.stdout.split()[1]  # "submitted job-... (N tasks)"
    try:
        assert result.returncode == 1, result.stdout + result.stderr
        assert "Traceback" not in result.stderr
        last = result.stderr.strip().splitlines()[-1]
        assert re.fullmatch(f"sluice submit: job {job_id} is still (DEPLOYING|RUNNING) after --wait-timeout 2s",
                            last), result.stderr
        assert elapsed < 60.0
        assert cluster.call("status", {"job_id": job_id})["state"] in ("DEPLOYING", "RUNNING")
    finally:
        cancel(cluster, job_id)


def test_coordinator_metrics_count_the_registered_workers_and_their_slots(cluster: Cluster) -> None:
    assert cluster.coordinator is not None
    # a finished job of its own: a CI run once gave this test, the module's last, a cluster of its own (the
    # module fixture set up again in another pytest-xdist process), where no earlier test had finished one
    assert cluster.wait_job(cluster.submit("rpcjobs:bounded"), 120)["state"] == "FINISHED"
    url = f"http://{cluster.coordinator.fields['metrics']}/metrics"
    with urllib.request.urlopen(url, timeout=10) as resp:
        text = resp.read().decode()
    lines = set(text.splitlines())
    assert "sluice_workers_registered 2.0" in lines
    assert "sluice_slots_total 4.0" in lines
    assert any(line.startswith('sluice_jobs{state="FINISHED"}') for line in lines), text
