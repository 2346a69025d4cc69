"""A cut worker-to-worker link, in network namespaces: detected by the link timeout, the job restarts from its
latest checkpoint once the link is back, and the committed output is exact.

Each worker runs in its own namespace (runtime/cli/netns.py); the two are joined by one veth pair that carries
their data link, and each has its own uplink to the root namespace where the coordinator listens. Setting the
pair down makes the data path go dark without an error on any socket (the kernel just retransmits), which
before the link timeout stalled the job until the path came back.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from runtime.cli.netns import NetnsLab, NetnsUnavailable
from runtime.cli.processes import start_process
from tests.support.cluster import Cluster, poll
from tests.support.failover import assert_exact_output, install
from tests.support.releasable_sink import release

pytestmark = pytest.mark.integration

LINK_TIMEOUT_S = 2.0


@pytest.fixture
def lab() -> Any:
    lab = NetnsLab(workers=2)
    try:
        lab.create()
    except NetnsUnavailable as exc:
        pytest.skip(f"network namespaces unavailable: {exc}")
    try:
        yield lab
    finally:
        lab.teardown()


def start_in_namespaces(cluster: Cluster, lab: NetnsLab) -> None:
    cluster.start_coordinator("--host", "0.0.0.0")
    port = cluster.rpc[1]
    for i in range(lab.workers):
        place, wid = lab.place(i), f"worker-{i + 1}"
        cluster.workers.append(start_process(
            "worker", ["--coordinator", f"{place.coordinator_host}:{port}", "--host", place.host, "--id", wid,
                       "--metrics-port", "0", "--heartbeat-interval", "0.25s", "--link-timeout", f"{LINK_TIMEOUT_S}s"],
            env=cluster.env, cwd=str(cluster.tmp_path), log_path=str(cluster.log_dir / f"{wid}.log"),
            prefix=place.prefix))
    cluster.wait_workers(lab.workers)


def test_cut_link_times_out_job_restarts_and_output_is_exact(cluster: Cluster, lab: NetnsLab) -> None:
    setup = install(cluster, words=400_000, sink_delay=0.00005)
    start_in_namespaces(cluster, lab)
    job_id = setup.submit("wordcount", restart={"max_attempts": 5})

    def checkpointed_and_crossing() -> bool:
        st = setup.status(job_id)
        assert st["state"] in ("CREATED", "DEPLOYING", "RUNNING"), f"{st}\n{setup.logs()}"
        return st["last_checkpoint"] is not None and len({t["worker"] for t in st["tasks"]}) == 2

    poll(checkpointed_and_crossing, 60, "a completed checkpoint with tasks on both workers")
    lab.cut(0, 1)
    cut_at = time.monotonic()

    def detected() -> bool:
        return any("nothing heard" in cluster.log(f"worker-{i + 1}") for i in range(2))

    try:
        poll(detected, LINK_TIMEOUT_S + 10, "a worker to time the silent link out", interval_s=0.05)
    finally:
        healed_after = lab.heal(0, 1)
    detection_s = time.monotonic() - cut_at
    release(cluster)  # the rest at full speed: the detection and the restart are under test, not the data
    # silence is counted from the last byte heard, and a ping goes out after a third of the timeout of
    # silence: the link may already have been quiet that long when it was cut
    assert healed_after >= LINK_TIMEOUT_S * 2 / 3 - 0.2 and detection_s < LINK_TIMEOUT_S + 3, detection_s

    st = setup.wait_finished(job_id, timeout_s=180)
    assert st["restarts"] >= 1, st
    assert any("lost data connection" in f and "nothing heard" in f for f in st["failures"]), st
    assert st["restored_checkpoint_id"] is not None, st
    assert_exact_output(setup)
    print(f"link cut: detected after {detection_s:.2f}s (timeout {LINK_TIMEOUT_S}s), healed after {healed_after:.2f}s, "
          f"{st['restarts']} restart(s), last restart {st['last_restart_s']:.2f}s, restored checkpoint "
          f"#{st['restored_checkpoint_id']}, {setup.words:,} words exact")
