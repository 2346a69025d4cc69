"""Thousands of idle connections to every listener must not take the cluster down (issue 8, item 6).

Each of the five listeners (coordinator RPC, coordinator metrics and REST/UI, a worker's data port, its metrics port)
gets FLOOD idle TCP connections that never say a word and are held open while a job runs. The processes
are started with the usual soft open-files limit of 1024 (their hard limit stays), which is what a
thousand idle metrics connections used up before: the coordinator's RPC port then refused everyone.
Now RPC answers, the job's data crosses the flooded data port, both metrics ports still scrape and the
REST API still answers.
"""

from __future__ import annotations

import errno
import json
import resource
import select
import socket
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.cluster import Cluster, write_module

FLOOD = 2000
LISTENERS = 5
CHILD_SOFT_NOFILE = 1024

JOB = '''
from runtime.api import DiscardSink, GeneratorSource
from runtime.examples.wordcount import Count


def build(job):
    """Two sources hash-partitioned into two counters: channels cross between the two workers."""
    (job.source(GeneratorSource(count=20000, keys=50), parallelism=2)
        .key_by(lambda r: r[0])
        .process(Count(), parallelism=2)
        .sink(DiscardSink(), parallelism=2))
'''


@pytest.fixture
def own_nofile() -> Iterator[int]:
    """Room for the flood in this process; restored afterwards."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = FLOOD * LISTENERS + 512
    if hard != resource.RLIM_INFINITY and hard < need:
        pytest.skip(f"the hard open-files limit {hard} is below the {need} this test holds")
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    try:
        yield hard
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def start_with_soft_limit(start: Any, *args: str, **kwargs: Any) -> Any:
    """Start a child with the usual soft limit of 1024 (children inherit ours), then take ours back."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (CHILD_SOFT_NOFILE, hard))
    try:
        return start(*args, **kwargs)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def open_idle(address: tuple[str, int], n: int) -> list[socket.socket]:
    """`n` connections to `address` that never send anything; waits (with a deadline) until each is
    connected or refused, so the listener has seen them all before the test goes on."""
    socks = []
    for _ in range(n):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        err = s.connect_ex(address)
        assert err in (0, errno.EINPROGRESS), errno.errorcode.get(err, err)
        socks.append(s)
    waiting = {s.fileno(): s for s in socks}
    poller = select.poll()
    for fd in waiting:
        poller.register(fd, select.POLLOUT)
    deadline = time.monotonic() + 30
    while waiting and time.monotonic() < deadline:
        for fd, _ in poller.poll(500):
            poller.unregister(fd)
            waiting.pop(fd)
    return socks


def scrape(address: str) -> str:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as response:
        return str(response.read().decode())


@pytest.mark.integration
def test_idle_connection_flood_on_every_listener(cluster: Cluster, own_nofile: int) -> None:
    coordinator = start_with_soft_limit(cluster.start_coordinator)
    start_with_soft_limit(cluster.start_worker, worker_id="worker-1")
    target = start_with_soft_limit(cluster.start_worker, worker_id="worker-2")  # worker-1 dials worker-2
    cluster.wait_workers(2)
    write_module(cluster.tmp_path, "floodjob", JOB)

    flood: list[socket.socket] = []
    try:
        started = time.monotonic()
        # metrics first: idle metrics connections used to hold the descriptors the RPC port then lacked
        for address in (coordinator.address("metrics"), coordinator.address("http"), cluster.rpc,
                        target.address("metrics"), target.address("data")):
            flood += open_idle(address, FLOOD)
        flood_s = time.monotonic() - started

        started = time.monotonic()
        status = cluster.call("status")
        rpc_s = time.monotonic() - started
        assert len(status["workers"]) == 2, status
        # promptly, not once the flood's handshake timeouts (10 s) happen to free some descriptors
        assert rpc_s < 5.0, f"status took {rpc_s:.1f}s under the flood"

        job_id = cluster.submit("floodjob:build")
        result = cluster.wait_job(job_id, timeout_s=120)
        assert result["state"] == "FINISHED", result
        assert {t["worker"] for t in result["tasks"]} == {"worker-1", "worker-2"}, result["tasks"]
        sinks = [t for t in result["tasks"] if "Discard" in t["name"] or "sink" in t["name"].lower()]
        assert sum(t["records_in"] for t in sinks) == 20000, result["tasks"]

        coordinator_metrics = scrape(coordinator.fields["metrics"])
        assert "sluice_workers" in coordinator_metrics
        with urllib.request.urlopen(f"http://{coordinator.fields['http']}/api/v1/jobs", timeout=10) as response:
            assert json.loads(response.read())["jobs"][0]["state"] == "FINISHED"  # the REST port still answers
        worker_metrics = scrape(target.fields["metrics"])
        assert "sluice_connections_shed_total" in worker_metrics
        shed = [line for line in coordinator_metrics.splitlines() if line.startswith("sluice_connections_shed")]
        print(f"flooded {len(flood)} connections in {flood_s:.1f}s; status RPC took {rpc_s * 1000:.0f} ms "
              f"under the flood; coordinator {shed}")
    finally:
        for s in flood:
            s.close()
    for proc in [coordinator, *cluster.workers]:
        assert proc.proc.poll() is None, f"{proc.role} {proc.pid} died under the flood"
    assert "Traceback" not in cluster.log("coordinator") + cluster.log("worker-2")
