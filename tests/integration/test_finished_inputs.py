"""A finished input does not hold unaligned checkpoints back (FLIP-147), on a real cluster.

Two sources feed one slow keyed count: a short one, which reaches its end while the count is backpressured,
and a long one. With fixed 32 KiB buffers the short source's channel then still holds seconds of data (its
sender queue and the count's credits). Unaligned checkpoints taken meanwhile store that backlog as channel
state instead of waiting until the count has consumed it: every one of them completes in well under a
second. A worker killed with SIGKILL right after such a checkpoint restores it (the short source as ended,
its backlog replayed from channel state) and every count is still written exactly once.
"""

from __future__ import annotations

import os
import signal
from collections import Counter
from typing import Any

import pytest

from tests.support.cluster import Cluster, assert_running_counts, generator_counts, logs, poll, write_module
from tests.support.releasable_sink import RELEASABLE_SINK, release, release_path

pytestmark = pytest.mark.integration

JOBS = '''
from runtime.api import FileSink, GeneratorSource, Job
from runtime.examples.wordcount import Count

RELEASE = {release!r}
''' + RELEASABLE_SINK + '''

def short_and_long(job: Job) -> None:
    short = job.source(GeneratorSource(count={short}, keys={keys}, seed={seed}), parallelism=1, name="short")
    long = job.source(GeneratorSource(count={long}, keys={keys}, seed={seed2}), parallelism=1, name="long")
    (short.union(long).key_by(lambda r: r[0])
        .process(Count(), parallelism=1)
        .sink(ReleasableSink({out!r}, delay_per_record_s=0.0001)))
'''

SHORT, LONG, KEYS, SEED, SEED2 = 50_000, 90_000, 50, 5, 6
BOUND_S = 1.0


def test_a_finished_source_does_not_hold_unaligned_checkpoints_back(cluster: Cluster) -> None:
    out = cluster.tmp_path / "out"
    write_module(cluster.tmp_path, "finishedjobs", JOBS.format(short=SHORT, long=LONG, keys=KEYS, seed=SEED,
                                                               seed2=SEED2, out=str(out),
                                                               release=release_path(cluster)))
    cluster.start(2, worker_args=("--heartbeat-interval", "0.25s"), worker_ids=True)
    config = {"buffer_bytes": 32 * 1024, "buffers_per_channel": 8, "inflight_target_s": 0,
              "checkpoint": {"interval_s": 0.2, "mode": "unaligned", "timeout_s": 20, "min_pause_s": 0,
                             "tolerable_failures": 100, "retain": 100},
              "restart": {"kind": "fixed", "max_attempts": 2, "delay_s": 0.2, "slot_wait_s": 60}}
    job_id = cluster.submit("finishedjobs:short_and_long", config)

    def status() -> dict[str, Any]:
        return dict(cluster.call("status", {"job_id": job_id}))

    def short_ended() -> bool:
        st = status()
        assert st["state"] in ("CREATED", "DEPLOYING", "RUNNING"), st
        return any(t["name"].startswith("short") and t["records_out"] >= SHORT for t in st["tasks"])

    def history() -> list[dict[str, Any]]:
        return list(cluster.call("checkpoints", {"job_id": job_id})["history"])

    poll(short_ended, 60, "the short source to reach its end")
    last_before = max((h["checkpoint_id"] for h in history()), default=0)  # any later one started after the end

    def after_end() -> list[dict[str, Any]]:
        return [h for h in history() if h["checkpoint_id"] > last_before and h["status"] == "COMPLETED"]

    # one checkpoint taken after the end, while the short channel's backlog is still queued
    poll(lambda: after_end(), 30, "a checkpoint after the short source ended")
    taken = after_end()[0]
    st = status()
    assert st["attempt"] == 0 and st["state"] == "RUNNING", st
    assert taken["inflight_bytes"] > 0, taken  # the backlog was stored, not drained first
    # every unaligned checkpoint started after the short source ended was fast (today's first one included)
    since_end = [h for h in history() if last_before < h["checkpoint_id"] <= taken["checkpoint_id"]]
    slow = [(h["checkpoint_id"], h["status"], h["duration_s"]) for h in since_end
            if h["status"] != "COMPLETED" or h["duration_s"] > BOUND_S]
    assert not slow, f"checkpoints after the short source ended: {slow}"

    # kill -9 the worker that runs the count: the job restores that checkpoint or a later one
    count_task = next(t["task"] for t in st["tasks"] if t["name"].startswith("Count"))
    count_worker = st["placement"][count_task.split("/", 1)[1]]
    victim = next(w for w in cluster.workers if str(w.fields["id"]) == count_worker)
    os.kill(victim.pid, signal.SIGKILL)
    victim.proc.wait(10)
    cluster.start_worker("--heartbeat-interval", "0.25s", worker_id=count_worker)
    release(cluster)  # the restored attempt at full speed

    final = cluster.wait_job(job_id, 180)
    assert final["state"] == "FINISHED", (final, logs(cluster))
    assert final["restarts"] == 1, final
    assert final["restored_checkpoint_id"] >= taken["checkpoint_id"], final

    expected: Counter[str] = generator_counts(SHORT, KEYS, SEED) + generator_counts(LONG, KEYS, SEED2)
    assert_running_counts(out, expected)
