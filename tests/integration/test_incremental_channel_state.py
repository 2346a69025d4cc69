"""Incremental channel state in a real cluster: under sustained backpressure an unaligned checkpoint references
the buffers an earlier one already wrote (shared segments), a kill -9 restores from such a checkpoint with exact
output, and once the job ends the store holds exactly the segments its retained checkpoints list."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from runtime.common.retention import segment_writer
from tests.support.cluster import Cluster, poll
from tests.support.failover import (
    assert_exact_output,
    assert_recovered,
    install,
    kill_worker_running,
    restart_worker,
    start,
)
from tests.support.releasable_sink import release

pytestmark = pytest.mark.integration


def _completed(job_dir: Path) -> dict[int, dict[str, Any]]:
    out = {}
    for d in job_dir.glob("chk-*"):
        try:
            out[int(d.name[4:])] = json.loads((d / "_metadata").read_text())
        except (FileNotFoundError, ValueError):
            continue  # in progress, or being written or discarded right now
    return out


def _segments(meta: dict[str, Any]) -> set[str]:
    return {str(s[0]) for ack in meta["acks"].values() for s in (ack.get("state") or {}).get("segments") or ()}


def test_kill_under_backpressure_restores_shared_segments_exactly_and_leaves_no_orphans(cluster: Cluster) -> None:
    setup = install(cluster, words=40_000, sink_delay=0.0002)  # sink-bound: queues stay full across checkpoints
    start(cluster, 3)
    job_id = setup.submit("wordcount", checkpoint={"interval_s": 0.2, "retain": 2})
    job_dir = Path(cluster.local.state_dir or "") / "checkpoints" / job_id
    reused: dict[str, Any] = {}

    def a_checkpoint_references_an_earlier_ones_segment() -> bool:
        st = setup.status(job_id)
        assert st["state"] in ("CREATED", "DEPLOYING", "RUNNING"), f"{st}\n{setup.logs()}"
        for n, meta in _completed(job_dir).items():
            older = sorted(s for s in _segments(meta) if (segment_writer(s) or n) < n)
            if older:
                reused.update(checkpoint=n, segment=older[0], status=st)
                return True
        return False

    poll(a_checkpoint_references_an_earlier_ones_segment, 30, "a checkpoint referencing an earlier one's segment")
    victim = kill_worker_running(cluster, reused["status"], 0)
    restart_worker(cluster, victim)
    release(cluster)  # the restored attempt at full speed: the restore of shared segments is under test
    st = setup.wait_finished(job_id, 90)
    assert_recovered(st, 1)
    assert_exact_output(setup)

    def no_orphans() -> bool:  # retention of the last checkpoints may still run as the job ends
        listed = set().union(*map(_segments, _completed(job_dir).values()))
        present = {p.name for p in (job_dir / "shared").glob("chan-*")}
        reused["listed"], reused["present"] = listed, present
        return present == listed

    poll(no_orphans, 10, "the shared segments to be exactly those the retained checkpoints list")
    kept = _completed(job_dir)
    assert len(kept) <= 4, sorted(kept)  # retain 2, and the restored attempt's 2 from before the restart
    restored = kept.get(st["restored_checkpoint_id"])
    assert restored is None or _segments(restored), "the restored checkpoint held no shared segment"


def test_a_wiped_store_is_noticed_and_the_next_checkpoints_share_nothing_lost(cluster: Cluster) -> None:
    """The job's checkpoint store is wiped (a deleted bucket, a lifecycle rule) while incremental checkpoints
    reference earlier segments: a checkpoint naming a file that is gone must not complete, and the ones after
    it write everything anew, so a kill -9 later restores a checkpoint taken after the wipe with exact output
    (before the fix every later checkpoint referenced the wiped segments and every restore failed)."""
    setup = install(cluster, words=60_000, sink_delay=0.0002)
    start(cluster, 3)
    job_id = setup.submit("wordcount", checkpoint={"interval_s": 0.2, "retain": 2, "tolerable_failures": 10})
    job_dir = Path(cluster.local.state_dir or "") / "checkpoints" / job_id
    seen: dict[str, Any] = {}

    def sharing() -> bool:
        st = setup.status(job_id)
        assert st["state"] in ("CREATED", "DEPLOYING", "RUNNING"), f"{st}\n{setup.logs()}"
        return any(s for n, meta in _completed(job_dir).items() for s in _segments(meta)
                   if (segment_writer(s) or n) < n)

    poll(sharing, 30, "a checkpoint referencing an earlier one's segment")
    wiped_at = max(int(d.name[4:]) for d in job_dir.glob("chk-*"))  # the newest triggered so far
    # at once, as a deleted bucket: moved away whole (removing it in place races the workers' writes into it)
    wiped = job_dir.with_name(job_dir.name + ".wiped")
    job_dir.rename(wiped)
    shutil.rmtree(wiped, ignore_errors=True)

    def completed_after_the_wipe() -> bool:
        st = setup.status(job_id)
        assert st["state"] == "RUNNING", f"{st}\n{setup.logs()}"
        seen["status"] = st
        return any(n > wiped_at for n in _completed(job_dir))

    poll(completed_after_the_wipe, 30, "a checkpoint triggered after the wipe to complete")
    victim = kill_worker_running(cluster, seen["status"], 0)
    restart_worker(cluster, victim)
    release(cluster)
    st = setup.wait_finished(job_id, 90)
    assert_recovered(st, 1)
    assert st["restored_checkpoint_id"] > wiped_at, st
    assert "storage lost" in cluster.log("coordinator")  # a checkpoint naming a lost file was refused
    assert_exact_output(setup)
