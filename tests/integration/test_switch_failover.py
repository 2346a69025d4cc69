"""Per-channel switching under a kill -9: an aligned job whose channels switch to unaligned behind
backpressure (channel_timeout_s) completes checkpoints that say how many channels switched, and the
figure is true (those checkpoints hold channel state); a worker killed under backpressure restores
with exact output."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.cluster import Cluster, poll
from tests.support.failover import (
    assert_exact_output,
    assert_recovered,
    install,
    kill_worker_running,
    restart_worker,
    start,
)

pytestmark = pytest.mark.integration


def test_kill_under_backpressure_with_switched_channels_restores_exactly(cluster: Cluster) -> None:
    setup = install(cluster, words=40_000, sink_delay=0.0002)  # sink-bound: barriers wait behind data
    start(cluster, 3)
    job_id = setup.submit("wordcount", checkpoint={"interval_s": 0.2, "mode": "aligned", "channel_timeout_s": 0.01,
                                                   "max_inflight_bytes": 8 << 20})
    job_dir = Path(cluster.local.state_dir or "") / "checkpoints" / job_id
    seen: dict[str, Any] = {}

    def a_completed_checkpoint_switched_channels() -> bool:
        st = setup.status(job_id)
        assert st["state"] in ("CREATED", "DEPLOYING", "RUNNING"), f"{st}\n{setup.logs()}"
        history = cluster.call("checkpoints", {"job_id": job_id})["history"]
        for h in history:
            switched = h.get("switched_channels") or 0
            if h["status"] == "COMPLETED" and switched:
                seen.update(entry=h, switched=switched, status=st)
                return True
        return False

    poll(a_completed_checkpoint_switched_channels, 30, "a completed checkpoint that switched channels")
    entry = seen["entry"]
    assert entry["mode"] == "aligned", entry
    # the claim against ground truth: a checkpoint that switched channels persisted channel state
    assert entry["inflight_bytes"] > 0, entry
    meta_path = job_dir / f"chk-{entry['checkpoint_id']}" / "_metadata"
    if meta_path.exists():  # retention may have dropped it since (checkpoints every 0.2 s)
        meta = json.loads(meta_path.read_text())
        figures = [a["figures"] for a in meta["acks"].values()]
        assert sum(f.get("switched_channels") or 0 for f in figures) == seen["switched"], figures
        files = {name for a in meta["acks"].values() for kind, name in (a.get("state") or {}).items()
                 if kind in ("in", "out")}
        assert files, meta["acks"]
    victim = kill_worker_running(cluster, seen["status"], 0)
    restart_worker(cluster, victim)
    st = setup.wait_finished(job_id, 90)
    assert_recovered(st, 1)
    assert_exact_output(setup)
