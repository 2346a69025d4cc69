"""Task isolation end to end: blocking user code runs on its task's thread, not on the worker's event loop
(runtime/execution/isolation.py).

1. Two independent pipelines on one worker: a fast one (generator -> map -> discard), and one whose sink
   blocks 1 ms per record with `time.sleep` without declaring it (it runs on its task's thread). The fast
   pipeline delivers every record well above what it got inline, the worker's heartbeats keep coming,
   checkpoints complete. Inline, the sleeping sink took about half the loop's time. Its speed alone and beside
   the sleeper is measured by scripts/bench_isolation.py (docs/BENCHMARKS.md).
2. The demo's job shape (keyed count, a sink throttled to the demo's 40 us a record, unaligned checkpoints
   every second) on two workers: an aligned checkpoint taken mid-run completes within a few multiples of the
   in-flight target (it was measured at 54 s while the throttled sink slept on the loop).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from runtime.cli.demo import SINK_DELAY_S
from tests.support.cluster import Cluster, poll, write_module

JOBS = '''
import json
import os
import time

from runtime.api import DiscardSink, FileSink, GeneratorSource, Job, Sink
from runtime.examples.wordcount import Count

TIMES = {times!r}


class TimedSink(DiscardSink):
    """Discards, and at the end of its bounded input writes when it opened and finished (wall clock)."""

    def open(self, subtask_index, parallelism, attempt):
        super().open(subtask_index, parallelism, attempt)
        self.opened = time.time()

    def finish(self):
        # written aside and renamed: the test reads the file as soon as it is there
        path = os.path.join(TIMES, f"{{self.opened}}.json")
        with open(path + ".tmp", "w") as f:
            json.dump({{"opened": self.opened, "finished": time.time(), "records": self.records}}, f)
        os.replace(path + ".tmp", path)


class SleepingSink(Sink):
    """A blocking client: 1 ms a record, not declared blocking."""

    def write(self, record):
        time.sleep(0.001)


def _fast(job):
    (job.source(GeneratorSource(count={fast}, keys=100, seed=1), parallelism=1, name="fast")
        .map(lambda r: (r[0], r[1] + 1), parallelism=1)
        .sink(TimedSink(), parallelism=1))


def together(job: Job) -> None:
    _fast(job)
    (job.source(GeneratorSource(count=None, keys=10, seed=2), parallelism=1, name="slow")
        .sink(SleepingSink(), parallelism=1))


def demo(job: Job) -> None:
    (job.source(GeneratorSource(count=None, keys=1000, seed=7), parallelism=2)
        .key_by(lambda r: r[0])
        .process(Count(), parallelism=2)
        .sink(FileSink({out!r}, delay_per_record_s={delay}), parallelism=2))
'''

FAST_RECORDS = 2_000_000  # under a second on a quiet machine (chained, nothing crosses a channel)
PROGRESS_FLOOR_PER_S = 200_000
INFLIGHT_TARGET_S = 1.0


def _write_jobs(cluster: Cluster) -> Path:
    times = cluster.tmp_path / "times"
    times.mkdir(exist_ok=True)
    write_module(cluster.tmp_path, "isolationjobs", JOBS.format(
        fast=FAST_RECORDS, times=str(times), out=str(cluster.tmp_path / "out"), delay=SINK_DELAY_S))
    return times


HEARTBEAT_TIMEOUT_S = 10.0  # the coordinator's default --heartbeat-timeout: a worker silent this long is lost


@pytest.mark.integration
def test_a_pipeline_beside_a_blocking_sink_on_the_same_worker_keeps_running(cluster: Cluster) -> None:
    """What isolation guarantees, with margins a busy machine keeps: beside a sink that sleeps on every record,
    the fast pipeline keeps making progress and delivers every record, the worker's heartbeats never come near
    the timeout (the job is never failed over), and checkpoints complete. How fast it goes beside the sleeper
    is a benchmark's figure (scripts/bench_isolation.py, docs/BENCHMARKS.md)."""
    times = _write_jobs(cluster)
    cluster.start(1)
    checkpoints = {"interval_s": 0.5, "mode": "unaligned", "timeout_s": 60.0, "tolerable_failures": 0}
    job_id = cluster.submit("isolationjobs:together", {"checkpoint": checkpoints})
    oldest_heartbeat = 0.0

    def look() -> dict[str, Any]:
        nonlocal oldest_heartbeat
        status = cluster.call("status", {"job_id": job_id})
        assert status["state"] in ("DEPLOYING", "RUNNING") and status["attempt"] == 0, status  # never failed over
        workers = cluster.call("status")["workers"]
        assert len(workers) == 1, workers  # registered all along
        oldest_heartbeat = max(oldest_heartbeat, *(w["last_heartbeat_s_ago"] for w in workers))
        return status

    poll(lambda: look() and bool(list(times.glob("*.json"))), 120,
         "the fast pipeline to finish beside the blocking sink", interval_s=0.2)
    (written,) = list(times.glob("*.json"))
    run = json.loads(written.read_text())
    assert run["records"] == FAST_RECORDS, run
    rate = FAST_RECORDS / (run["finished"] - run["opened"])
    done = look()["checkpoints_completed"]
    poll(lambda: look()["checkpoints_completed"] >= done + 2, 60,
         "two more checkpoints after the fast pipeline finished, the blocking sink still running")
    status = look()
    slow = sum(t["records_in"] for t in status["tasks"] if t["name"].startswith("slow"))
    cluster.call("cancel", {"job_id": job_id})
    cluster.wait_job(job_id, timeout_s=30)
    print(f"fast pipeline {rate:,.0f} records/s beside the blocking "
          f"sink; slow sink {slow} records; oldest heartbeat {oldest_heartbeat:.1f} s; "
          f"{status['checkpoints_completed']} checkpoints")
    assert status["checkpoints_failed"] == 0 and status["checkpoints_completed"] >= 2, status
    assert slow > 0, status  # the blocking pipeline ran meanwhile
    # progress: isolated it runs at millions a second (scripts/bench_isolation.py); inline, behind the sleeping
    # sink, it got 18 k records/s. The floor is 25 times below a quiet machine's figure, 10 times above inline.
    assert rate >= PROGRESS_FLOOR_PER_S, f"the fast pipeline made {rate:,.0f} records/s beside the blocking sink"
    # a heartbeat is due every second; half the timeout leaves a loaded machine's scheduling room, and a
    # heartbeat stuck behind the sleeping sink (inline, the loop was late by 1.7 s per batch) would exceed it
    assert oldest_heartbeat < HEARTBEAT_TIMEOUT_S / 2, f"a heartbeat was {oldest_heartbeat} s old"


@pytest.mark.integration
def test_aligned_checkpoint_of_the_demo_job_completes_near_the_inflight_target(running_cluster: Cluster) -> None:
    cluster = running_cluster
    _write_jobs(cluster)
    config = {"inflight_target_s": INFLIGHT_TARGET_S,
              "checkpoint": {"interval_s": 1.0, "mode": "unaligned", "timeout_s": 30.0, "tolerable_failures": 5}}
    job_id = cluster.submit("isolationjobs:demo", config)
    poll(lambda: cluster.call("status", {"job_id": job_id}).get("checkpoints_completed", 0) >= 2, 30,
         "two unaligned checkpoints (the pipeline is backpressured by then)")
    t0 = time.monotonic()
    aligned = cluster.call("checkpoint", {"job_id": job_id, "mode": "aligned"})
    took = time.monotonic() - t0
    cluster.call("cancel", {"job_id": job_id})
    history = cluster.call("checkpoints", {"job_id": job_id})["history"]
    mine = [h for h in history if h["mode"] == "aligned"]
    assert mine and mine[-1]["status"] == "COMPLETED", (aligned, mine)
    # a few multiples of the target on a shared machine (about 1 s on a quiet one)
    print(f"aligned checkpoint of the demo job: {mine[-1]['duration_s']:.2f} s (RPC {took:.2f} s)")
    assert mine[-1]["duration_s"] <= 5 * INFLIGHT_TARGET_S, (mine[-1], took)
