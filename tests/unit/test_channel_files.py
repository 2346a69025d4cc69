"""Channel-state files with shared segments on a real directory: what a restore reads, what `verify` and a
missing or corrupt segment say, and what retention deletes (coordinator/storage.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from coordinator.storage import CorruptCheckpoint, LocalCheckpointStorage
from netstack.credit import Buffer
from runtime.checkpointing.channel_files import ChannelStateFiles, output_capture
from runtime.checkpointing.snapshots import CorruptState, read_channel_state
from runtime.checkpointing.writer import CheckpointWriter


def _buffers(*tags: int) -> list[Buffer]:
    return [Buffer(bytes([0xC4, 3, t, t, t]), 0) for t in tags]


def _checkpoint(storage: LocalCheckpointStorage, files: ChannelStateFiles, n: int, queue: list[Buffer], *,
                savepoint: bool = False) -> tuple[str, dict[str, Any]]:
    """Checkpoint `n` of one task whose output channel holds `queue`: its `.out` file and `_metadata`."""
    directory = storage.savepoint_dir(str(Path(storage.root) / "sp"), "job", n) if savepoint \
        else storage.checkpoint_dir("job", n)
    files.begin(n, savepoint=savepoint)
    capture = output_capture(queue)
    assert capture is not None
    writer = CheckpointWriter()
    try:
        written = asyncio.run(writer.write(f"{directory}/1-0.out", files.produce(directory, n, "out",
                                                                                 {"1:0:0": capture})))
    finally:
        writer.close()
    state: dict[str, Any] = {"out": "1-0.out", "checksums": {"1-0.out": written.checksum}}
    if files.segments(n):
        state["segments"] = files.segments(n)
    storage.write_metadata(directory, {"checkpoint_id": n, "acks": {"1:0": {"state": state}}})
    files.completed(n)
    return directory, state


def _shared(storage: LocalCheckpointStorage) -> set[str]:
    return {p.name for p in (Path(storage.job_dir("job")) / "shared").glob("chan-*")}


def test_a_later_checkpoint_references_and_retention_keeps_what_is_listed(tmp_path: Path) -> None:
    storage = LocalCheckpointStorage(str(tmp_path))
    files = ChannelStateFiles("1:0")
    queue = _buffers(1, 2, 3)
    d1, s1 = _checkpoint(storage, files, 1, queue)
    queue = [*queue[1:], *_buffers(4)]
    d2, s2 = _checkpoint(storage, files, 2, queue)
    assert read_channel_state(d1, "1-0.out", s1["checksums"]["1-0.out"]) == {
        "1:0:0": b"".join(b.data for b in _buffers(1, 2, 3))}
    assert read_channel_state(d2, "1-0.out", s2["checksums"]["1-0.out"]) == {
        "1:0:0": b"".join(b.data for b in _buffers(2, 3, 4))}
    first = {s[0] for s in s1["segments"]}
    assert first < {s[0] for s in s2["segments"]}  # 2 and 3 are referenced, not written again
    assert s2["segments"][-1][1] == 5  # only buffer 4 is new
    storage.verify(d2, storage.read_metadata(d2))
    queue = _buffers(5)
    d3, _ = _checkpoint(storage, files, 3, queue)
    storage.discard(d1)  # checkpoint 2 still lists the segment checkpoint 1 wrote
    assert first <= _shared(storage)
    storage.discard(d2)  # now nothing does
    assert _shared(storage) == {s[0] for s in storage.read_metadata(d3).task_states()["1:0"]["segments"]}


def test_a_discard_sweeps_an_aborted_checkpoints_segments(tmp_path: Path) -> None:
    storage = LocalCheckpointStorage(str(tmp_path))
    files = ChannelStateFiles("1:0")
    directory = storage.checkpoint_dir("job", 1)
    files.begin(1, savepoint=False)
    capture = output_capture(_buffers(1))
    assert capture is not None
    files.produce(directory, 1, "out", {"1:0:0": capture})()  # written, never completed
    assert len(_shared(storage)) == 1
    storage.discard(directory)
    assert _shared(storage) == set()


def test_savepoints_are_self_contained(tmp_path: Path) -> None:
    storage = LocalCheckpointStorage(str(tmp_path))
    files = ChannelStateFiles("1:0")
    queue = _buffers(1, 2)
    _checkpoint(storage, files, 1, queue)
    sp, state = _checkpoint(storage, files, 2, queue, savepoint=True)
    assert "segments" not in state
    assert read_channel_state(sp, "1-0.out", state["checksums"]["1-0.out"]) == {
        "1:0:0": b"".join(b.data for b in queue)}


@pytest.mark.parametrize("damage", ["flip", "delete"])
def test_a_missing_or_corrupt_segment_is_one_clear_error(tmp_path: Path, damage: str) -> None:
    storage = LocalCheckpointStorage(str(tmp_path))
    files = ChannelStateFiles("1:0")
    directory, state = _checkpoint(storage, files, 1, _buffers(1, 2))
    segment = Path(storage.job_dir("job")) / "shared" / state["segments"][0][0]
    if damage == "flip":
        data = bytearray(segment.read_bytes())
        data[3] ^= 1
        segment.write_bytes(bytes(data))
    else:
        segment.unlink()
    with pytest.raises(CorruptState, match=segment.name):
        read_channel_state(directory, "1-0.out", state["checksums"]["1-0.out"])
    with pytest.raises(CorruptCheckpoint, match=f"{segment.name}: (cannot read )?channel state segment of task 1:0"):
        storage.verify(directory, storage.read_metadata(directory))


def test_the_switch_is_a_job_setting() -> None:
    from runtime.graph.job_config import JobConfig, JobConfigError

    assert JobConfig.from_document({}).channels.incremental_channel_state is True
    off = JobConfig.from_document({"incremental_channel_state": False})
    assert JobConfig.from_wire(off.to_wire()).channels.incremental_channel_state is False
    with pytest.raises(JobConfigError, match="incremental_channel_state must be true or false"):
        JobConfig.from_document({"incremental_channel_state": "no"})


def test_the_end_of_job_sweep_deletes_only_what_no_completed_checkpoint_references(tmp_path: Path) -> None:
    storage = LocalCheckpointStorage(str(tmp_path))
    files = ChannelStateFiles("1:0")
    queue = _buffers(1, 2, 3)
    _checkpoint(storage, files, 1, queue)
    _, s2 = _checkpoint(storage, files, 2, [*queue[1:], *_buffers(4)])
    storage.discard(storage.checkpoint_dir("job", 1))
    shared = Path(storage.job_dir("job")) / "shared"
    listed = {s[0] for s in s2["segments"]}
    assert _shared(storage) == listed
    # what discards cannot know: an aborted checkpoint's new SST file and a segment written after its discard
    (shared / "a5c1efdd6104-000023.sst").write_bytes(b"sst")
    (shared / "chan-3-1-0-0-deadbeef-out.seg").write_bytes(b"late")
    Path(storage.checkpoint_dir("job", 3))  # aborted: a directory without _metadata
    assert storage.sweep_shared("job") == 2
    assert {p.name for p in shared.iterdir()} == listed
    assert read_channel_state(str(Path(storage.job_dir("job")) / "chk-2"), "1-0.out", s2["checksums"]["1-0.out"]) == {
        "1:0:0": b"".join(b.data for b in _buffers(2, 3, 4))}
    # unsure means keep: with a completed checkpoint's metadata unreadable nothing is deleted
    (shared / "b-000001.sst").write_bytes(b"sst")
    (Path(storage.job_dir("job")) / "chk-2" / "_metadata").write_text("{")
    assert storage.sweep_shared("job") == 0 and (shared / "b-000001.sst").exists()
