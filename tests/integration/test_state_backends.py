"""Keyed state on RocksDB on a real cluster: kill -9 under unaligned checkpoints, rescaling a running job, and
state five times larger than the worker's memory limit. Every job must commit each count exactly once."""

from __future__ import annotations

import operator
import os
import sys
from typing import Any

import pytest

from coordinator.storage import shared_files
from runtime.cli.processes import Managed, start_process
from runtime.graph.checkpoint_metadata import CheckpointMetadata
from runtime.graph.enums import JobState
from runtime.state.rocksdb import available
from tests.support.checkpoints import backend_handles, checkpoint_metadata, taken_while_running
from tests.support.cluster import Cluster, assert_running_counts, generator_counts, poll, write_module
from tests.support.failover import (
    install,
    kill_once_and_recover,
    start,
)

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(not available(), reason="the rocksdb extra (rocksdict) is not installed")]


def rocksdb(cluster: Cluster) -> dict[str, Any]:
    return {"state": {"backend": "rocksdb", "work_dir": str(cluster.tmp_path / "local-state")}}


def assert_shared_files_are_those_referenced(cluster: Cluster, job_id: str) -> None:
    """After the job ended, retention and the end-of-job sweep left exactly the shared files (SST files and
    channel-state segments) the retained checkpoints reference: none of a discarded or an aborted checkpoint."""
    job_dir = cluster.tmp_path / "state" / "checkpoints" / job_id

    def listing() -> tuple[set[str], set[str]]:
        referenced = {f.split("/", 1)[1] for m in checkpoint_metadata(cluster, job_id)
                      for f in shared_files(CheckpointMetadata.from_document(m))}
        return referenced, set(os.listdir(job_dir / "shared"))

    referenced, present = listing()
    assert referenced <= present, sorted(referenced - present)[:5]
    poll(lambda: operator.eq(*listing()), 20, "the end-of-job sweep of unreferenced shared files")


# -- kill -9 of a worker ---------------------------------------------------------------------------------------


@pytest.mark.timeout(300)
def test_rocksdb_keyed_count_survives_kill_9_with_unaligned_checkpoints(cluster: Cluster) -> None:
    setup = install(cluster, words=120_000)
    start(cluster)
    job_id = setup.submit("wordcount", extra=rocksdb(cluster))
    kill_once_and_recover(setup, job_id)  # the killed worker hosts a Count subtask: its RocksDB dies with it

    retained = taken_while_running(checkpoint_metadata(cluster, job_id))
    assert retained, "no retained checkpoint taken while the job ran"
    for metadata in retained:
        handles = backend_handles(metadata)
        assert len(handles) == 2 and all(h["backend"] == "rocksdb" for h in handles), metadata["acks"]
        # timers stay in the operator state file, keyed state does not: the state files are small
        for ack in metadata["acks"].values():
            figures = ack["figures"]
            if "backend_sync_s" in figures:
                assert figures["backend_sync_s"] < 1.0, figures
    assert_shared_files_are_those_referenced(cluster, job_id)


# -- rescaling -------------------------------------------------------------------------------------------------
#
# Restores of a backend at other parallelisms (split and merged key-group ranges, RocksDB and remote, and across
# backends) are unit tests (tests/unit/test_state_restore.py, tests/unit/test_remote_state.py); a running job
# rescaled through the CLI is tests/integration/test_rescale_running.py (memory) and test_async_state.py
# (asynchronous state with captured records). Integration runs of the same rescale on RocksDB and the remote
# backend took 70 and 200 s of the suite for paths those cover between them.


# -- state larger than memory ----------------------------------------------------------------------------------

# Each record rewrites its key's 64 KiB blob of random (incompressible) bytes after checking that the blob read
# back is the one written for the previous count: the output is the running count per key (exact), and a
# wrong or lost read fails the job.
BIG_JOB = '''
import random

from runtime.api import FileSink, GeneratorSource, Job, KeyedProcessFunction

VALUE_BYTES = {value_bytes}
_noise = random.Random().randbytes


def blob(key, n):
    head = f"{{key}}:{{n}}:".encode()
    return head + _noise(VALUE_BYTES - len(head))


class BigCount(KeyedProcessFunction):
    def open(self, ctx):
        self.count = ctx.value_state("count", default=0)
        self.blob = ctx.value_state("blob")

    def process(self, record, ctx):
        key = record[0]
        n = self.count.value()
        stored = self.blob.value()
        expected = f"{{key}}:{{n}}:".encode()
        if (n == 0) != (stored is None) or (stored is not None and not stored.startswith(expected)):
            raise RuntimeError(f"state of {{key!r}} is wrong: count {{n}}, blob {{stored[:40] if stored else None!r}}")
        self.count.update(n + 1)
        self.blob.update(blob(key, n + 1))
        ctx.emit((key, n + 1))


def build(job: Job) -> None:
    (job.source(GeneratorSource(count={words}, keys={keys}, seed={seed}), parallelism=1)
        .key_by(lambda r: r[0])
        .process(BigCount(), parallelism=1)
        .sink(FileSink({out!r})))
'''
LIMIT_BYTES = 200 << 20  # the worker's RLIMIT_DATA: its heap and private mappings (thread stacks included)
VALUE_BYTES = 64 * 1024
BIG_KEYS, BIG_WORDS, BIG_SEED = 21_500, 32_000, 5
# RLIMIT_AS would count the whole address space, hundreds of MiB of reservations (thread stacks, allocator
# arenas) before any state; RLIMIT_DATA with small thread stacks bounds what the worker can really allocate
LIMITED = ("import os, resource, sys; "
           "resource.setrlimit(resource.RLIMIT_DATA, ({limit}, {limit})); "
           "resource.setrlimit(resource.RLIMIT_STACK, (2 << 20, 2 << 20)); "
           "os.environ['MALLOC_ARENA_MAX'] = '2'; "
           "os.execvp(sys.argv[1], sys.argv[1:])")


def start_limited_worker(cluster: Cluster, worker_id: str) -> Managed:
    """A worker under RLIMIT_DATA, started like LocalCluster starts workers and reaped with them."""
    assert cluster.coordinator is not None
    prefix = [sys.executable, "-c", LIMITED.format(limit=LIMIT_BYTES)]
    worker = start_process("worker", ["--coordinator", cluster.coordinator.fields["rpc"], "--slots", "2",
                                      "--data-port", "0", "--metrics-port", "0", "--id", worker_id],
                           env=cluster.env, cwd=str(cluster.tmp_path),
                           log_path=str(cluster.log_dir / f"{worker_id}.log"), prefix=prefix)
    cluster.local.worker_procs.append(worker)
    return worker


@pytest.mark.timeout(600)
def test_state_five_times_the_workers_memory_limit_finishes_exactly(cluster: Cluster) -> None:
    if not hasattr(os, "fork") or sys.platform != "linux":
        pytest.skip("RLIMIT_DATA bounds private mappings on Linux only")
    counts = generator_counts(BIG_WORDS, BIG_KEYS, BIG_SEED)
    live_state = len(counts) * VALUE_BYTES
    assert live_state >= 5 * LIMIT_BYTES, (live_state, LIMIT_BYTES)  # the input makes the state 5x the limit

    out = cluster.tmp_path / "out"
    write_module(cluster.tmp_path, "bigstate", BIG_JOB.format(value_bytes=VALUE_BYTES, words=BIG_WORDS,
                                                               keys=BIG_KEYS, seed=BIG_SEED, out=str(out)))
    cluster.start_coordinator()
    worker = start_limited_worker(cluster, "small-worker")
    cluster.wait_workers(1)
    config = {"checkpoint": {"interval_s": 2.0, "mode": "unaligned", "timeout_s": 120, "tolerable_failures": 5},
              "restart": {"kind": "none"}, **rocksdb(cluster)}
    job_id = cluster.submit("bigstate:build", config)
    final = cluster.wait_job(job_id, timeout_s=400)
    log = cluster.log("small-worker")[-3000:]
    assert final["state"] == JobState.FINISHED and final["restarts"] == 0, (final, log)
    assert worker.proc.poll() is None, log  # the worker lived through it, under its limit
    assert_running_counts(out, counts)
    # what a checkpoint held: RocksDB's files for state well over the limit (the last checkpoint saw it all)
    sizes = [h["total_bytes"] for m in checkpoint_metadata(cluster, job_id) for h in backend_handles(m)]
    assert sizes and max(sizes) >= 5 * LIMIT_BYTES, (sizes, LIMIT_BYTES)


def test_the_input_of_the_big_state_test_is_what_it_claims() -> None:
    """Cheap guard on the arithmetic above: the keys that occur times the blob size."""
    counts = generator_counts(BIG_WORDS, BIG_KEYS, BIG_SEED)
    assert sum(counts.values()) == BIG_WORDS
    assert len(counts) * VALUE_BYTES >= 5 * LIMIT_BYTES
