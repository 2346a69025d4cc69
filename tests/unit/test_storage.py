"""LocalCheckpointStorage on real files in tmp_path."""

from __future__ import annotations

import json
import os

import pytest

from coordinator.storage import METADATA_FILE, CheckpointStorage, CorruptCheckpoint, LocalCheckpointStorage
from runtime.common.checkpoint_metadata import encode_metadata
from runtime.graph.checkpoint_metadata import CheckpointMetadata


def meta(n: int) -> dict:
    return {"checkpoint_id": n, "savepoint": False, "mode": "aligned", "started_at": 1.0, "completed_at": 2.0,
            "acks": {"map-0": {"state": {"file": "op-0"}, "figures": {"state_bytes": 10}}}}


@pytest.fixture
def storage(tmp_path) -> LocalCheckpointStorage:
    return LocalCheckpointStorage(str(tmp_path / "state"))


def complete(storage: LocalCheckpointStorage, job_id: str, n: int) -> str:
    path = storage.checkpoint_dir(job_id, n)
    storage.write_metadata(path, meta(n))
    return path


def test_is_a_checkpoint_storage(storage):
    s: CheckpointStorage = storage
    assert s is storage


def test_layout(storage, tmp_path):
    path = storage.checkpoint_dir("job-a", 7)
    assert path == str(tmp_path / "state" / "checkpoints" / "job-a" / "chk-7")
    assert os.path.isdir(path)
    sp = storage.savepoint_dir(str(tmp_path / "backups"), "job-a", 3)
    assert sp == str(tmp_path / "backups" / "savepoint-job-a-3")
    assert os.path.isdir(sp)


@pytest.mark.parametrize("job_id", ["", "..", "a/b"])
def test_job_ids_that_are_not_directory_names_are_rejected(storage, job_id):
    with pytest.raises(ValueError, match="cannot name a directory"):
        storage.checkpoint_dir(job_id, 1)


def test_round_trip_with_format_version(storage):
    path = storage.checkpoint_dir("job-a", 1)
    written = storage.write_metadata(path, meta(1))
    assert written == os.path.join(path, METADATA_FILE)
    assert storage.read_metadata(path) == CheckpointMetadata.from_document(meta(1))
    assert storage.read_metadata(written) == CheckpointMetadata.from_document(meta(1))


def test_atomic_write_leaves_no_temp_files_and_replaces(storage):
    path = storage.checkpoint_dir("job-a", 1)
    storage.write_metadata(path, meta(1))
    storage.write_metadata(path, {**meta(1), "mode": "unaligned"})
    assert os.listdir(path) == [METADATA_FILE]
    assert storage.read_metadata(path).mode == "unaligned"


def test_unserialisable_metadata_writes_nothing(storage):
    path = storage.checkpoint_dir("job-a", 1)
    with pytest.raises(TypeError):
        storage.write_metadata(path, {**meta(1), "acks": {"t": {"state": object()}}})
    assert os.listdir(path) == []


def test_wrong_shape_is_refused_on_write(storage):
    path = storage.checkpoint_dir("job-a", 1)
    with pytest.raises(ValueError, match="checkpoint_id"):
        storage.write_metadata(path, {"acks": {}})
    with pytest.raises(ValueError, match="unsupported metadata format 1"):
        storage.write_metadata(path, {**meta(1), "format": 1})
    assert os.listdir(path) == []


@pytest.mark.parametrize(("content", "message"), [
    (b"", "empty"),
    (b"  \n", "empty"),
    (b'{"format": 1, "checkpoint_id": 1, "acks": {"t": {"st', "truncated or not JSON"),
    (b"\xff\xfe garbage", "truncated or not JSON"),
    (b"[1, 2]", "expected a JSON object, got list"),
    (b'{"checkpoint_id": 1, "acks": {}}', "no 'format' version field"),
    (b'{"format": 1, "checkpoint_id": 1, "acks": {}}', "unsupported metadata format 1"),
    (b'{"format": 2, "checkpoint_id": 1, "acks": {}}', "no usable checksum"),
    # intact files (their checksum holds) whose fields CheckpointMetadata refuses
    (encode_metadata({"format": 2, "checkpoint_id": "1", "acks": {}}), "'checkpoint_id' must be an integer"),
    (encode_metadata({"format": 2, "checkpoint_id": 1, "acks": []}), "'acks' must be an object"),
    (encode_metadata({"format": 2, "checkpoint_id": 1, "acks": {}, "attempt": "2"}), "'attempt' must be a number"),
    (encode_metadata({"format": 2, "checkpoint_id": 1, "acks": {}, "vertices": {}}), "'vertices' must be a list"),
])
def test_corrupt_metadata_names_the_path(storage, content, message):
    path = storage.checkpoint_dir("job-a", 1)
    metadata = os.path.join(path, METADATA_FILE)
    with open(metadata, "wb") as f:
        f.write(content)
    for given in (path, metadata):
        with pytest.raises(CorruptCheckpoint, match=message) as info:
            storage.read_metadata(given)
        assert metadata in str(info.value)


def test_truncated_copy_of_a_real_file_is_corrupt(storage):
    path = complete(storage, "job-a", 1)
    metadata = os.path.join(path, METADATA_FILE)
    with open(metadata, "rb") as f:
        data = f.read()
    with open(metadata, "wb") as f:
        f.write(data[: len(data) // 2])
    with pytest.raises(CorruptCheckpoint, match="truncated"):
        storage.read_metadata(path)


def test_missing_metadata(storage, tmp_path):
    path = storage.checkpoint_dir("job-a", 1)
    with pytest.raises(CorruptCheckpoint, match="not a completed checkpoint") as info:
        storage.read_metadata(path)
    assert path in str(info.value)
    gone = str(tmp_path / "nowhere" / METADATA_FILE)
    with pytest.raises(CorruptCheckpoint, match="missing") as info:
        storage.read_metadata(gone)
    assert gone in str(info.value)
    assert issubclass(CorruptCheckpoint, ValueError)


def test_list_completed_ignores_incomplete_dirs_and_stray_files(storage):
    assert storage.list_completed("job-a") == []
    assert storage.latest("job-a") is None
    c2 = complete(storage, "job-a", 2)
    c10 = complete(storage, "job-a", 10)
    storage.checkpoint_dir("job-a", 11)  # in progress or crashed: no _metadata
    job_dir = os.path.dirname(c2)
    os.makedirs(os.path.join(job_dir, "chk-x"))
    os.makedirs(os.path.join(job_dir, "shared"))
    with open(os.path.join(job_dir, "chk-12"), "w") as f:  # a file, not a directory
        f.write("stray")
    with open(os.path.join(job_dir, "notes.txt"), "w") as f:
        f.write("stray")
    complete(storage, "job-b", 99)
    assert storage.list_completed("job-a") == [(2, c2), (10, c10)]  # numeric, not lexical, order
    assert storage.latest("job-a") == (10, c10)


def test_discard_removes_the_tree_and_tolerates_missing(storage, tmp_path):
    path = complete(storage, "job-a", 1)
    os.makedirs(os.path.join(path, "op-0"))
    with open(os.path.join(path, "op-0", "state.bin"), "wb") as f:
        f.write(b"x" * 100)
    storage.discard(path)
    assert not os.path.exists(path)
    assert storage.list_completed("job-a") == []
    storage.discard(path)  # already gone
    sp = storage.savepoint_dir(str(tmp_path / "backups"), "job-a", 2)
    storage.write_metadata(sp, meta(2))
    storage.discard(sp)
    assert os.listdir(tmp_path / "backups") == []


def test_discard_refuses_paths_it_did_not_name(storage, tmp_path):
    victim = tmp_path / "important"
    victim.mkdir()
    with pytest.raises(ValueError, match="refusing to discard"):
        storage.discard(str(victim))
    assert victim.exists()


def test_metadata_is_readable_json_with_format_first_class(storage):
    path = complete(storage, "job-a", 1)
    with open(os.path.join(path, METADATA_FILE)) as f:
        assert json.load(f)["format"] == 2


def test_a_flipped_bit_in_metadata_or_a_task_file_is_found_and_named(storage):
    """Every byte of a checkpoint is covered: the metadata by its own checksum, task files by theirs."""
    from runtime.common.checksums import checksum

    path = storage.checkpoint_dir("job-a", 1)
    state = b"\x81\xa6format\x01" * 10
    with open(os.path.join(path, "1-0.state"), "wb") as f:
        f.write(state)
    acks = {"1:0": {"state": {"state": "1-0.state", "checksums": {"1-0.state": checksum(state)}}, "figures": {}}}
    storage.write_metadata(path, {"checkpoint_id": 1, "acks": acks})
    storage.verify(path, storage.read_metadata(path))  # intact
    flipped = bytearray(state)
    flipped[7] ^= 0x10
    with open(os.path.join(path, "1-0.state"), "wb") as f:
        f.write(bytes(flipped))
    with pytest.raises(CorruptCheckpoint, match=r"1-0\.state.*CRC-32"):
        storage.verify(path, storage.read_metadata(path))
    metadata = os.path.join(path, METADATA_FILE)
    with open(metadata, "rb") as f:
        data = bytearray(f.read())
    data[data.index(b'"checkpoint_id": 1') + len('"checkpoint_id": ')] ^= 0x02  # 1 -> 3: still valid JSON
    with open(metadata, "wb") as f:
        f.write(bytes(data))
    with pytest.raises(CorruptCheckpoint, match="metadata is corrupt"):
        storage.read_metadata(path)


def _metadata_with_shared(n, names):
    backend = {"backend": "rocksdb", "checkpoint_id": n, "key_groups": [0, 128], "private_files": [],
               "shared_files": [[f"{x}.sst", x, 1] for x in names], "store": "job"}
    return {"checkpoint_id": n, "acks": {"1:0": {"state": {"state": "1-0.state", "backend": backend}}}}


def test_discarding_a_checkpoint_deletes_the_shared_files_no_retained_one_references(storage):
    """Incremental RocksDB checkpoints share SST files: retention deletes one only when its last reference
    goes."""
    job_dir = storage.job_dir("job")
    shared = os.path.join(job_dir, "shared")
    os.makedirs(shared)
    for name in ("a", "b", "c", "d"):
        with open(os.path.join(shared, name), "w") as f:
            f.write(name)
    storage.write_metadata(storage.checkpoint_dir("job", 1), _metadata_with_shared(1, ["a", "b"]))
    storage.write_metadata(storage.checkpoint_dir("job", 2), _metadata_with_shared(2, ["b", "c"]))
    storage.checkpoint_dir("job", 3)  # in progress, no _metadata: its files ("d") are nobody's to delete yet
    storage.discard(os.path.join(job_dir, "chk-1"))
    assert sorted(os.listdir(shared)) == ["b", "c", "d"]
    storage.discard(os.path.join(job_dir, "chk-2"))
    assert sorted(os.listdir(shared)) == ["d"]


def test_verify_finds_a_missing_or_truncated_shared_state_file(storage):
    job_dir = storage.job_dir("job")
    os.makedirs(os.path.join(job_dir, "shared"))
    with open(os.path.join(job_dir, "shared", "a"), "w") as f:
        f.write("x")
    path = storage.checkpoint_dir("job", 1)
    metadata = _metadata_with_shared(1, ["a"])
    metadata["acks"]["1:0"]["state"].pop("state")  # no operator state file in this test: only the backend's
    storage.write_metadata(path, metadata)
    storage.verify(path, storage.read_metadata(path))  # intact
    with open(os.path.join(job_dir, "shared", "a"), "w") as f:
        f.write("xy")
    with pytest.raises(CorruptCheckpoint, match="shared state file of task 1:0 is 2 bytes, not 1"):
        storage.verify(path, storage.read_metadata(path))
    os.unlink(os.path.join(job_dir, "shared", "a"))
    with pytest.raises(CorruptCheckpoint, match="is missing"):
        storage.verify(path, storage.read_metadata(path))


@pytest.mark.parametrize(("doc", "message"), [
    ({"format": 2, "acks": {}}, "'checkpoint_id' must be an integer, got None"),
    ({"format": 2, "checkpoint_id": 1, "acks": {"0:0": "files"}}, "'acks' must be an object of task -> object"),
    ({"format": 2, "checkpoint_id": 1, "acks": {}, "operators": [3]}, "'operators' must be a list of objects"),
    ({"format": 2, "checkpoint_id": 1, "acks": {}, "duration_s": "slow"}, "'duration_s' must be a number, got 'slow'"),
    ({"format": 3, "checkpoint_id": 1, "acks": {}}, "unsupported metadata format 3"),
])
def test_the_coordinator_and_the_state_processor_refuse_a_bad_field_with_one_line_naming_the_file(
        storage, doc, message):
    from runtime.data.checkpoint_state import open_checkpoint
    from runtime.data.spark import DataError

    path = storage.checkpoint_dir("job-a", 1)
    metadata = os.path.join(path, METADATA_FILE)
    with open(metadata, "wb") as f:
        f.write(encode_metadata(doc))
    with pytest.raises(CorruptCheckpoint) as coordinator:
        storage.read_metadata(path)
    with pytest.raises(DataError) as state_processor:
        open_checkpoint(path)
    assert str(coordinator.value) == str(state_processor.value) == f"{metadata}: {message}" + (
        " (this version reads format 2)" if "format" in message else "")
