"""Three hosts: network namespaces with their own addresses on one LAN (runtime/cli/netns.py HostLab); the
coordinator on host 0, a worker on each of hosts 1 and 2, checkpoints in an S3-compatible object store in the
root namespace that every host reaches. Every process binds 0.0.0.0: the coordinator advertises its LAN
address with --advertise, the workers find theirs (the one facing the coordinator). Host 2 is unplugged mid-
job; the coordinator declares its worker lost, a replacement worker starts on host 1, the job restores its
latest checkpoint from the object store, and the committed output is exact.

Skipped, with the reason, where namespaces cannot be made (not root, no `ip`, a sandbox that forbids it).
"""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Iterator
from typing import Any

import pytest

from runtime.cli.netns import HostLab, NetnsUnavailable
from runtime.cli.processes import start_process
from tests.support.cluster import Cluster, poll
from tests.support.failover import assert_exact_output, install
from tests.support.releasable_sink import release
from tests.support.s3_server import S3Server, S3ServerUnavailable, client_env

pytestmark = pytest.mark.integration

LINK_TIMEOUT_S = 2.0
HEARTBEAT_TIMEOUT_S = 4.0


@pytest.fixture
def lab() -> Iterator[HostLab]:
    lab = HostLab(hosts=3)
    try:
        lab.create()
    except NetnsUnavailable as exc:
        pytest.skip(f"network namespaces unavailable: {exc}")
    try:
        yield lab
    finally:
        lab.teardown()


@pytest.fixture
def s3(lab: HostLab) -> Iterator[S3Server]:
    try:
        server = S3Server.start(lab.gateway)  # the root namespace, on the LAN
    except S3ServerUnavailable as exc:
        pytest.skip(str(exc))
    try:
        with client_env(server):
            yield server
    finally:
        server.stop()


def start_worker(cluster: Cluster, lab: HostLab, host: int, wid: str, port: int) -> None:
    cluster.workers.append(start_process(
        "worker", ["--coordinator", f"{lab.address(0)}:{port}", "--host", "0.0.0.0", "--id", wid,
                   "--metrics-port", "0", "--heartbeat-interval", "0.25s", "--link-timeout", f"{LINK_TIMEOUT_S}s"],
        env=cluster.env, cwd=str(cluster.tmp_path), log_path=str(cluster.log_dir / f"{wid}.log"),
        prefix=lab.prefix(host)))


def test_three_hosts_one_unplugged_job_restores_from_the_object_store_and_output_is_exact(
        cluster: Cluster, lab: HostLab, s3: S3Server) -> None:
    bucket = f"sluice-{secrets.token_hex(4)}"
    s3.create_bucket(bucket)
    root = f"s3://{bucket}/cluster"
    cluster.local.env_overrides.update(s3.env)
    setup = install(cluster, words=300_000, sink_delay=0.00005)
    os.makedirs(cluster.log_dir, exist_ok=True)
    os.makedirs(cluster.local.state_dir or "", exist_ok=True)
    coordinator = start_process(
        "coordinator", ["--host", "0.0.0.0", "--advertise", lab.address(0), "--port", "0", "--metrics-port", "0",
                        "--state-dir", str(cluster.local.state_dir), "--checkpoint-dir", root,
                        "--heartbeat-timeout", f"{HEARTBEAT_TIMEOUT_S}s"],
        env=cluster.env, cwd=str(cluster.tmp_path), log_path=str(cluster.log_dir / "coordinator.log"),
        prefix=lab.prefix(0))
    cluster.local.coordinator = coordinator
    port = coordinator.address("rpc")[1]
    assert coordinator.fields["advertise"] == f"{lab.address(0)}:{port}", coordinator.fields
    coordinator.fields["rpc"] = coordinator.fields["advertise"]  # the tests dial it across the LAN, as users do
    start_worker(cluster, lab, 1, "worker-1", port)
    start_worker(cluster, lab, 2, "worker-2", port)
    cluster.wait_workers(2, timeout_s=60)
    data = {w["id"]: w["data"] for w in cluster.call("status")["workers"]}
    assert data["worker-1"].startswith(f"{lab.address(1)}:") and data["worker-2"].startswith(f"{lab.address(2)}:"), \
        data  # each worker advertised its own LAN address, found from the route to the coordinator

    job_id = setup.submit("wordcount", restart={"max_attempts": 5, "slot_wait_s": 120})

    def checkpointed_on_both() -> bool:
        st = setup.status(job_id)
        assert st["state"] in ("CREATED", "DEPLOYING", "RUNNING"), f"{st}\n{setup.logs()}"
        return st["last_checkpoint"] is not None and {t["worker"] for t in st["tasks"]} == {"worker-1", "worker-2"}

    poll(checkpointed_on_both, 90, "a completed checkpoint with tasks on both hosts")
    lab.cut(2)
    cut_at = time.monotonic()

    def lost() -> bool:
        return "worker-2" not in {w["id"] for w in cluster.call("status")["workers"]}

    poll(lost, HEARTBEAT_TIMEOUT_S + 20, "the coordinator to declare the unplugged host's worker lost")
    detected_s = time.monotonic() - cut_at
    start_worker(cluster, lab, 1, "worker-3", port)  # the replacement, on a host that is still up
    release(cluster)  # the restored attempt at full speed: the detection and the restore are under test

    st: dict[str, Any] = setup.wait_finished(job_id, timeout_s=240)
    assert st["restarts"] >= 1 and st["restored_checkpoint_id"] is not None, st
    assert {t["worker"] for t in st["tasks"]} <= {"worker-1", "worker-3"}, st
    assert detected_s < HEARTBEAT_TIMEOUT_S + 10, detected_s
    log = cluster.log("coordinator")
    assert f"restores checkpoint {root}/{job_id}/chk-" in log, log[-3000:]
    assert_exact_output(setup)
    assert not os.path.exists(os.path.join(cluster.local.state_dir or "", "checkpoints"))
