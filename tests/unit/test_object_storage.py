"""Checkpoint storage on a real S3-compatible server (moto's, in its own process): the same interface and
guarantees as on local files, `_metadata` created once and never overwritten, CRC checks on every file."""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator

import pytest

from coordinator.storage import METADATA_FILE, CorruptCheckpoint, LocalCheckpointStorage
from coordinator.trust import TrustError, TrustPolicy
from runtime.checkpointing.snapshots import CorruptState, read_task_file
from runtime.checkpointing.writer import CheckpointWriter
from runtime.common import objectstore
from runtime.common.checksums import checksum
from tests.support.s3_server import S3Server, S3ServerUnavailable, client_env


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Server]:
    try:
        server = S3Server.start()
    except S3ServerUnavailable as exc:
        pytest.skip(str(exc))
    try:
        with client_env(server):
            yield server
    finally:
        server.stop()


@pytest.fixture
def bucket(s3: S3Server) -> str:
    name = f"ckpt-{secrets.token_hex(4)}"
    s3.create_bucket(name)
    return name


def meta(n: int, acks: dict | None = None) -> dict:
    return {"checkpoint_id": n, "savepoint": False, "mode": "aligned",
            "acks": acks if acks is not None else {"0:0": {"state": {}}}}


def with_task_files(directory: str) -> dict:
    """Two task files uploaded as a worker does, and the acks that name them with their checksums."""
    state, channel = b"operator state \x00\x01", b"in-flight buffers" * 100
    objectstore.write(objectstore.join(directory, "0-0.state"), state)
    objectstore.write(objectstore.join(directory, "1-0.in"), channel)
    return {"0:0": {"state": {"state": "0-0.state", "checksums": {"0-0.state": checksum(state)}}},
            "1:0": {"state": {"in": "1-0.in", "checksums": {"1-0.in": checksum(channel)}}}}


def test_a_checkpoint_written_to_the_bucket_reads_back_lists_and_verifies(bucket: str) -> None:
    storage = LocalCheckpointStorage(f"s3://{bucket}/team/prod/")
    assert storage.root == f"s3://{bucket}/team/prod"
    for n in (1, 2, 3):
        path = storage.checkpoint_dir("job-a", n)
        assert path == f"s3://{bucket}/team/prod/checkpoints/job-a/chk-{n}"
        acks = with_task_files(path)
        written = storage.write_metadata(path, meta(n, acks))
        assert written == f"{path}/{METADATA_FILE}"
    storage.checkpoint_dir("job-a", 4)  # started, never completed: task files but no _metadata
    with_task_files(storage.checkpoint_dir("job-a", 4))
    assert storage.list_completed("job-a") == [(n, f"s3://{bucket}/team/prod/checkpoints/job-a/chk-{n}")
                                                for n in (1, 2, 3)]
    n, path = storage.latest("job-a") or (0, "")
    assert n == 3
    for given in (path, f"{path}/{METADATA_FILE}"):
        doc = storage.read_metadata(given)
        assert doc.checkpoint_id == 3 and set(doc.acks) == {"0:0", "1:0"}
        storage.verify(given, doc)
    assert storage.list_completed("job-b") == []


def test_metadata_is_created_once_and_never_overwritten(bucket: str) -> None:
    storage = LocalCheckpointStorage(f"s3://{bucket}")
    path = storage.checkpoint_dir("j", 7)
    storage.write_metadata(path, meta(7))
    before = objectstore.read(f"{path}/{METADATA_FILE}")
    with pytest.raises(FileExistsError):
        storage.write_metadata(path, {**meta(7), "mode": "unaligned"})
    assert objectstore.read(f"{path}/{METADATA_FILE}") == before


def test_a_corrupt_or_missing_object_is_named_by_verify_and_by_a_restore(bucket: str) -> None:
    storage = LocalCheckpointStorage(f"s3://{bucket}/p")
    path = storage.checkpoint_dir("j", 1)
    storage.write_metadata(path, meta(1, with_task_files(path)))
    doc = storage.read_metadata(path)

    state = objectstore.join(path, "0-0.state")
    good = objectstore.read(state)
    objectstore.write(state, bytes([good[0] ^ 1]) + good[1:])
    with pytest.raises(CorruptCheckpoint, match=r"0-0\.state: checkpoint file of task 0:0 is corrupt: CRC-32"):
        storage.verify(path, doc)
    objectstore.write(state, good)

    objectstore.remove_tree(path, first="1-0.in")  # removes the lot; put _metadata and the state back
    objectstore.write(state, good)
    storage.write_metadata(path, meta(1, dict(doc.acks)))
    with pytest.raises(CorruptCheckpoint, match=r"1-0\.in: cannot read checkpoint file of task 1:0"):
        storage.verify(path, storage.read_metadata(path))
    with pytest.raises(CorruptState, match=r"1-0\.in: cannot read"):
        read_task_file(path, "1-0.in", doc.task_states()["1:0"]["checksums"]["1-0.in"])
    assert read_task_file(path, "0-0.state", doc.task_states()["0:0"]["checksums"]["0-0.state"]) == good

    meta_key = f"{path}/{METADATA_FILE}"
    body = objectstore.read(meta_key)
    objectstore.remove_tree(path, first=METADATA_FILE)
    with pytest.raises(CorruptCheckpoint, match="not a completed checkpoint"):
        storage.read_metadata(path)
    objectstore.write(meta_key, body.replace(b'"aligned"', b'"unalignd"'))
    with pytest.raises(CorruptCheckpoint, match="checkpoint metadata is corrupt"):
        storage.read_metadata(path)
    objectstore.write(meta_key, body[: len(body) // 2])
    with pytest.raises(CorruptCheckpoint, match="truncated or not JSON"):
        storage.read_metadata(meta_key)


def test_discard_deletes_every_object_of_a_checkpoint_and_nothing_else(bucket: str) -> None:
    storage = LocalCheckpointStorage(f"s3://{bucket}/p")
    keep, drop = storage.checkpoint_dir("j", 1), storage.checkpoint_dir("j", 11)
    for path, n in ((keep, 1), (drop, 11)):
        storage.write_metadata(path, meta(n, with_task_files(path)))
    storage.discard(drop)
    storage.discard(drop)  # a missing one is fine
    assert storage.list_completed("j") == [(1, keep)]
    assert objectstore.list_children(drop) == []
    assert sorted(objectstore.list_children(keep)) == ["0-0.state", "1-0.in", METADATA_FILE]
    with pytest.raises(ValueError, match="not a checkpoint or savepoint"):
        storage.discard(f"s3://{bucket}/p/checkpoints/j")


def test_savepoints_go_under_an_s3_root_the_trust_policy_allows(bucket: str) -> None:
    root = f"s3://{bucket}/savepoints"
    policy = TrustPolicy(("/srv/jobs",), (root,))
    assert policy.check_savepoint_dir(None) == root
    assert policy.check_savepoint_dir(f"{root}/nightly/") == f"{root}/nightly"
    for outside in (f"s3://{bucket}/savepointsx", f"{root}/../checkpoints", "s3://other/savepoints", "/tmp/sp"):
        with pytest.raises(TrustError):
            policy.check_savepoint_dir(outside)
    storage = LocalCheckpointStorage(f"s3://{bucket}")
    path = storage.savepoint_dir(f"{root}/nightly", "job-a", 5)
    assert path == f"{root}/nightly/savepoint-job-a-5"
    storage.write_metadata(path, {**meta(5), "savepoint": True})
    assert storage.read_metadata(path).savepoint is True


async def test_the_worker_checkpoint_writer_uploads_to_the_bucket(bucket: str) -> None:
    writer = CheckpointWriter()
    try:
        path = f"s3://{bucket}/c/checkpoints/j/chk-1/2-1.state"
        written = await writer.write(path, lambda: b"x" * 1000)
    finally:
        writer.close()
    assert written.checksum == checksum(b"x" * 1000) and writer.files_written == 1
    assert objectstore.read(path) == b"x" * 1000


def test_a_bucket_that_does_not_exist_fails_in_one_line(s3: S3Server) -> None:
    with pytest.raises(OSError) as info:
        objectstore.write("s3://no-such-bucket-here/x", b"1")
    assert "\n" not in str(info.value) and "no-such-bucket-here" in str(info.value)
    with pytest.raises(FileNotFoundError):
        objectstore.read(f"s3://no-such-bucket-here/{json.dumps('x')}")
