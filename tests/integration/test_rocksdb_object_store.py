"""RocksDB checkpoints in an S3-compatible object store (moto's server, its own process): a RocksDB keyed count
under unaligned checkpoints survives kill -9 of a worker with exact output; its SST files are uploaded
incrementally into the bucket's `<job>/shared/`, and retention left there exactly the files the retained
`_metadata` reference. Nothing lands in the local state directory's checkpoints/."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

import pytest

from coordinator.storage import METADATA_FILE, shared_files
from runtime.common import objectstore
from runtime.graph.checkpoint_metadata import CheckpointMetadata
from runtime.state.rocksdb import available
from tests.support.checkpoints import backend_handles, taken_while_running
from tests.support.cluster import Cluster, poll
from tests.support.failover import install, kill_once_and_recover, start
from tests.support.object_store import completed, in_bucket, running_s3
from tests.support.s3_server import S3Server

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(not available(), reason="the rocksdb extra (rocksdict) is not installed")]


@pytest.fixture
def s3() -> Iterator[S3Server]:
    with running_s3() as server:
        yield server


@pytest.mark.timeout(300)
def test_rocksdb_checkpoints_in_the_bucket_survive_kill_9_with_unaligned_checkpoints(cluster: Cluster,
                                                                                    s3: S3Server) -> None:
    root = in_bucket(cluster, s3)
    setup = install(cluster, words=120_000)
    start(cluster, 3, "--checkpoint-dir", root)
    job_id = setup.submit("wordcount", checkpoint={"retain": 2},
                          extra={"state": {"backend": "rocksdb", "work_dir": str(cluster.tmp_path / "local-state")}})
    kill_once_and_recover(setup, job_id)  # the killed worker hosts a Count subtask: its RocksDB dies with it

    job_dir = f"{root}/{job_id}"  # --checkpoint-dir holds the job directories itself
    ids = completed(root, job_id)
    retained = [json.loads(objectstore.read(f"{job_dir}/chk-{n}/{METADATA_FILE}")) for n in ids]
    assert retained, "no retained checkpoint in the bucket"
    for metadata in taken_while_running(retained):
        handles = backend_handles(metadata)
        assert len(handles) == 2 and all(h["backend"] == "rocksdb" and h["store"] == "job" for h in handles), \
            metadata["acks"]
    # the SST files and the channel-state segments (incremental channel state) of the retained checkpoints
    referenced = {relative.split("/", 1)[1] for m in retained
                  for relative in shared_files(CheckpointMetadata.from_document(m))}
    present = set(objectstore.list_children(f"{job_dir}/shared"))
    assert referenced and referenced <= present, sorted(referenced - present)[:5]
    # none of a discarded or an aborted checkpoint remains once the job ended (the end-of-job sweep)
    poll(lambda: set(objectstore.list_children(f"{job_dir}/shared")) == referenced, 20,
         "the end-of-job sweep of unreferenced shared files")
    record = json.loads(objectstore.read(f"{job_dir}/_retained"))
    assert set(record["retained"]) <= set(ids), (record, ids)
    assert not os.path.exists(os.path.join(cluster.local.state_dir or "", "checkpoints")), "local checkpoints"
