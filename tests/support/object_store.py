"""Checkpoints in a bucket of the test S3 server, for integration tests: a fresh bucket the cluster's processes
can reach, and the completed checkpoints found there."""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Iterator

import pytest

from coordinator.storage import METADATA_FILE
from runtime.common import objectstore
from tests.support.cluster import Cluster
from tests.support.s3_server import S3Server, S3ServerUnavailable, client_env


@contextlib.contextmanager
def running_s3() -> Iterator[S3Server]:
    """A test S3 server with this process's client pointed at it (the test is skipped without moto); stopped
    on exit. For a fixture: `with running_s3() as s3: yield s3`."""
    try:
        server = S3Server.start()
    except S3ServerUnavailable as exc:
        pytest.skip(str(exc))
    try:
        with client_env(server):
            objectstore.forget_clients()
            yield server
    finally:
        objectstore.forget_clients()
        server.stop()


def in_bucket(cluster: Cluster, s3: S3Server) -> str:
    """A fresh bucket; the cluster's processes get the server's address and credentials. Returns the root URL."""
    bucket = f"sluice-{secrets.token_hex(4)}"
    s3.create_bucket(bucket)
    cluster.local.env_overrides.update(s3.env)
    return f"s3://{bucket}/prod"


def completed(root: str, job_id: str) -> list[int]:
    """Ids of the job's checkpoints under `root` that have a `_metadata`."""
    job_dir = f"{root}/{job_id}"  # the job directories are in --checkpoint-dir itself
    return sorted(int(name[4:]) for name in objectstore.list_children(job_dir)
                  if name.startswith("chk-") and objectstore.exists(f"{job_dir}/{name}/{METADATA_FILE}"))
