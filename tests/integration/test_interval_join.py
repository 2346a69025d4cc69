"""An interval join on a real cluster: two event-time sources (parallelism 2 each) joined by key into a slow
two-phase file sink (released to full speed once the worker is back), so the join and its inputs are
backpressured; unaligned checkpoints every 0.5 s; the worker
running a sink (and the join chained with it: its buffers, timers and channel state of both inputs) is killed
with SIGKILL and started again. The committed output must hold every matching pair exactly once and nothing
else, from the memory and the RocksDB backend."""

from __future__ import annotations

import bisect
import functools
import json
from collections import Counter
from typing import Any

import pytest

from runtime.connectors.generator import BLOCK, generate_block, key_names
from runtime.state.rocksdb import available as rocksdb_available
from tests.support.checkpoints import history_entry
from tests.support.cluster import Cluster, committed_rows, poll, write_module
from tests.support.failover import (
    Setup,
    assert_recovered,
    kill_worker_running,
    restart_worker,
    start,
    wait_first_checkpoint,
)
from tests.support.releasable_sink import RELEASABLE_SINK, release, release_path

pytestmark = pytest.mark.integration

# Why these sizes: the join's MapState holds a key's whole buffer in one value, so with RocksDB every record
# decodes and re-encodes its key's buffer (and fires a timer that does it again). A buffer spans the watermark's
# lag behind the newest records (a source subtask's watermark is a generator block, 1024 ms, behind its
# sibling's), so it holds ~lag/KEYS records: with 20 keys RocksDB took 2.4 ms of CPU per record (10x the memory
# backend; 117 s in the suite). 100 keys make the buffers 5x smaller; the wider interval keeps ~0.7 pairs per
# record; 12,000 records still leave the job seconds of slow-sink work at the kill (1 ms a pair until `release`).
N, KEYS, LOWER, UPPER = 12_000, 100, -30, 40
# small buffers: the sources are blocked on credit within a fraction of a second
CHANNELS = {"buffer_bytes": 4096, "buffers_per_channel": 2}

JOB = '''
from runtime.api import BoundedOutOfOrderness, FileSink, GeneratorSource, Job

RELEASE = {release!r}
''' + RELEASABLE_SINK + '''

def join(job: Job) -> None:
    timed = BoundedOutOfOrderness(max_delay_ms=0, timestamp=lambda r: r[2])
    left = job.source(GeneratorSource(count={n}, keys={keys}, seed=1), name="left", parallelism=2, watermarks=timed)
    right = job.source(GeneratorSource(count={n}, keys={keys}, seed=2), name="right", parallelism=2,
                       watermarks=timed)
    (left.key_by(lambda r: r[0]).interval_join(right.key_by(lambda r: r[0])).between({lower}, {upper})
        .process(lambda l, r, ctx: ctx.emit((l[0], l[1], r[1])), parallelism=2)
        .sink(ReleasableSink({out!r}, delay_per_record_s=0.001), parallelism=2))
'''


@functools.cache  # both backends' runs compare with the same pairs
def expected_pairs() -> Counter[str]:
    """Every (key, left seq, right seq) with the right timestamp within [left + LOWER, left + UPPER]: per key,
    the right side sorted by timestamp and the window's range found by bisection (the nested loop over all
    pairs of a key took most of a minute on a loaded machine)."""
    names = key_names(KEYS)
    sides = [[r for b in range(-(-N // BLOCK)) for r in generate_block(b, seed=seed, keys=names, cum_weights=None,
                                                                        count=N)] for seed in (1, 2)]
    by_key: dict[str, list[tuple[int, int]]] = {}
    for key, seq, ts in sides[1]:
        by_key.setdefault(key, []).append((ts, seq))
    for right in by_key.values():
        right.sort()
    stamps = {key: [ts for ts, _ in right] for key, right in by_key.items()}
    pairs: Counter[str] = Counter()
    for key, seq, ts in sides[0]:
        right, at = by_key.get(key, []), stamps.get(key, [])
        for _, rseq in right[bisect.bisect_left(at, ts + LOWER):bisect.bisect_right(at, ts + UPPER)]:
            pairs[json.dumps([key, seq, rseq], separators=(",", ":"))] += 1
    return pairs


BACKENDS = [pytest.param("memory", id="memory"),
            pytest.param("rocksdb", id="rocksdb", marks=pytest.mark.skipif(not rocksdb_available(),
                                                                          reason="rocksdict is not installed"))]


@pytest.mark.timeout(300)  # generous: 12 s for rocksdb at load 8 on two cores (it took 120 s with 20 keys)
@pytest.mark.parametrize("backend", BACKENDS)
def test_interval_join_killed_under_backpressure_commits_every_pair_once(cluster: Cluster, backend: str) -> None:
    setup = Setup(cluster, N)
    write_module(cluster.tmp_path, "joinjobs", JOB.format(n=N, keys=KEYS, lower=LOWER, upper=UPPER,
                                                          out=str(setup.out), release=release_path(cluster)))
    start(cluster)
    config: dict[str, Any] = {
        **CHANNELS, "state": {"backend": backend, "work_dir": str(cluster.tmp_path / "local-state")},
        "checkpoint": {"interval_s": 0.5, "mode": "unaligned", "timeout_s": 10, "tolerable_failures": 3},
        "restart": {"kind": "fixed", "max_attempts": 3, "delay_s": 0.5, "slot_wait_s": 60}}
    job_id = cluster.submit("joinjobs:join", config)

    def backpressured() -> bool:
        st = setup.status(job_id)
        assert st["state"] in ("CREATED", "DEPLOYING", "RUNNING"), f"{st}\n{setup.logs()}"
        return sum(t["backpressured_s"] for t in st["tasks"]) >= 0.3

    poll(backpressured, 60, "the join's inputs to be backpressured by the slow sink")
    st = wait_first_checkpoint(setup, job_id)
    killed_after = st["last_checkpoint"]["checkpoint_id"]
    victim = kill_worker_running(cluster, st, 0)
    restart_worker(cluster, victim)
    release(cluster)  # the restored attempt at full speed: the restore of the join's buffers is under test
    st = setup.wait_finished(job_id, 180)  # a busy machine runs the join at ~150 records/s
    assert_recovered(st, 1)
    assert st["restored_checkpoint_id"] is not None and st["restored_checkpoint_id"] >= killed_after, st
    restored = history_entry(cluster, job_id, st["restored_checkpoint_id"])
    # in-flight records of the join's inputs went into channel state and were replayed after the restore
    assert restored["mode"] == "unaligned" and restored["inflight_bytes"] > 0, restored

    poll(lambda: not committed_rows(setup.out)[1], 15, "the final commit (no in-progress files left)")
    rows, _ = committed_rows(setup.out)
    expected = expected_pairs()
    assert len(expected) > N // 2  # enough pairs that every subtask joins many
    missing, extra = expected - rows, rows - expected
    assert not missing and not extra, (f"{sum(missing.values())} missing e.g. {list(missing)[:3]}, "
                                       f"{sum(extra.values())} extra e.g. {list(extra)[:3]}")
