"""Checkpoint integrity on a real cluster: a flipped bit in a state file, a channel-state file or `_metadata`
makes `--restore` refuse with the file named, and failover skips a latest checkpoint whose shared channel-state
segment is corrupt for the one before it, with exact output."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from netstack.errors import RpcError
from tests.support.checkpoints import (
    cancel,
    checkpoint_config,
    install_jobs,
    read_metadata,
    start_backpressured,
    submit,
    wait_running,
)
from tests.support.cluster import Cluster, poll
from tests.support.failover import (
    CHANNELS,
    Setup,
    assert_exact_output,
    committed_by,
    fall_back_from_a_corrupt_latest_checkpoint,
    install,
    own_segments,
    start,
)

pytestmark = pytest.mark.integration


def flip_bit(path: Path, offset: int, bit: int = 0) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 1 << bit
    path.write_bytes(bytes(data))


def test_a_flipped_bit_anywhere_in_a_checkpoint_refuses_the_restore_naming_the_file(
        running_cluster: Cluster) -> None:
    cluster = running_cluster
    install_jobs(cluster)
    config = checkpoint_config("unaligned", timeout_s=30.0)
    job_id = start_backpressured(cluster, "cpjobs:slow", config, blocked_s=0.5)
    result = cluster.call("checkpoint", {"job_id": job_id})
    assert result["status"] == "COMPLETED", result
    cancel(cluster, job_id)
    good = Path(result["path"])
    files = sorted(p.name for p in good.iterdir())
    state = next(n for n in files if n.endswith(".state"))
    channel = next((n for n in files if n.endswith((".in", ".out"))), None)
    assert channel is not None, f"the checkpoint under backpressure carries no channel state: {files}"

    metadata_text = (good / "_metadata").read_text()
    duration = metadata_text.index('"duration_s": ') + len('"duration_s": ')
    # a digit of duration_s: flipping its low bit keeps valid JSON, so only a checksum can tell
    corruptions = {state: len((good / state).read_bytes()) // 2, channel: len((good / channel).read_bytes()) - 3,
                   "_metadata": duration}
    for name, offset in corruptions.items():
        copy = cluster.tmp_path / f"corrupt-{name.replace('.', '_')}" / good.name
        shutil.copytree(good, copy)
        flip_bit(copy / name, offset)
        with pytest.raises(RpcError) as err:
            submit(cluster, "cpjobs:slow", config, restore=str(copy))
        assert str(copy / name) in str(err.value) and "corrupt" in str(err.value), (name, err.value)

    assert read_metadata(good)["format"] == 2
    restored = submit(cluster, "cpjobs:slow", config, restore=str(good))  # the intact one still restores
    wait_running(cluster, restored)
    cancel(cluster, restored)


# -- a restore deletes what was committed after its checkpoint -------------------------------------------------


def resubmit(setup: Setup, restore: str) -> str:
    config: dict[str, Any] = {**CHANNELS, "checkpoint": {"interval_s": None, "mode": "unaligned", "timeout_s": 10}}
    return str(setup.cluster.call("submit", {"entry": "failjobs:wordcount", "config": config,
                                              "sys_path": str(setup.cluster.tmp_path), "restore": restore})["job_id"])


def test_restoring_the_last_or_an_older_retained_checkpoint_of_a_finished_job_is_exact(cluster: Cluster) -> None:
    setup = install(cluster, words=120_000, sink_delay=0.0001)
    start(cluster, 2)
    job_id = setup.submit("wordcount", checkpoint={"interval_s": 0.3, "retain": 3})
    setup.wait_finished(job_id, 120)
    assert_exact_output(setup)
    # retention discards in the background: the oldest may still be on its way out when the job has finished
    poll(lambda: len(cluster.call("checkpoints", {"job_id": job_id})["retained"]) == 3, 15,
         "retention to keep 3 checkpoints")
    retained = cluster.call("checkpoints", {"job_id": job_id})["retained"]
    oldest, last = retained[0], retained[-1]
    assert any(c > oldest["checkpoint_id"] for c in committed_by(setup)), (
        f"nothing was committed after the oldest retained checkpoint {oldest}: {committed_by(setup)}")

    # the last checkpoint of the finished job: nothing to redo, nothing doubled
    again = resubmit(setup, last["path"])
    setup.wait_finished(again, 120)
    assert_exact_output(setup)

    # the oldest: what the later checkpoints committed is deleted and produced once more
    older = resubmit(setup, oldest["path"])
    st = setup.wait_finished(older, 120)
    assert st["restored_checkpoint_id"] == oldest["checkpoint_id"], st
    assert_exact_output(setup)


def test_failover_skips_a_latest_checkpoint_with_a_flipped_channel_segment_and_output_is_exact(
        cluster: Cluster) -> None:
    """A bit flipped in a shared channel-state segment (incremental channel state, `shared/chan-...`) that the
    latest checkpoint wrote and lists: failover skips it for the checkpoint before. (A flipped state file:
    test_object_store_checkpoints.py's twin deletes a segment instead; a state file is refused above.)"""
    setup = install(cluster, words=100_000, sink_delay=0.0003)  # ~15 s, sink-bound: runs on after ~30k
    start(cluster, 3)
    job_id = setup.submit("wordcount", checkpoint={"interval_s": None})

    def corrupt(path: str) -> str:
        metadata = read_metadata(path)
        segments = own_segments(metadata, metadata["checkpoint_id"])
        assert segments, f"the latest checkpoint (under backpressure) wrote no channel-state segment: {metadata}"
        segment = Path(path).parent / "shared" / segments[0]
        flip_bit(segment, len(segment.read_bytes()) // 2)
        return segments[0]

    fall_back_from_a_corrupt_latest_checkpoint(setup, job_id, corrupt)


# -- an unwritable checkpoint directory --------------------------------------------------------------------------


def test_an_unwritable_checkpoint_directory_declines_checkpoints_in_one_line_and_the_job_goes_on(
        cluster: Cluster) -> None:
    setup = install(cluster, words=10_000_000)  # runs for longer than the test
    state_dir = cluster.tmp_path / "state"
    state_dir.mkdir(parents=True, exist_ok=True)
    (state_dir / "checkpoints").write_text("a file where the checkpoint directory should be\n")  # root-proof
    start(cluster, 2)
    job_id = setup.submit("wordcount", checkpoint={"interval_s": 0.3, "tolerable_failures": 1_000_000})

    def records() -> int:
        st = setup.status(job_id)
        assert st["state"] in ("CREATED", "DEPLOYING", "RUNNING"), st
        return sum(t["records_in"] for t in st["tasks"])

    # each declined at once (the checkpoint timeout, 10 s, is not what ends them)
    poll(lambda: setup.status(job_id)["checkpoints_failed"] >= 5, 20, "five declined checkpoints")
    before = records()
    poll(lambda: records() > before + 10_000, 30, "the job to go on processing")
    st = setup.status(job_id)
    assert st["checkpoints_completed"] == 0 and st["restarts"] == 0 and st["state"] == "RUNNING", st
    assert cluster.call("cancel", {"job_id": job_id})["state"] == "CANCELLED"
    log = cluster.log("coordinator")
    assert "never retrieved" not in log and "Traceback" not in log, log[-3000:]
    declined = [line for line in log.splitlines() if "cannot create its directory" in line]
    assert declined and str(state_dir / "checkpoints") in declined[0], log[-3000:]
