"""Asynchronous keyed state on a real cluster: an AsyncKeyedProcessFunction count under kill -9 of a worker with
unaligned checkpoints, in capture mode (records in flight at the barrier go into the checkpoint and are replayed
first) and in drain mode (the snapshot waits for them), on the memory and RocksDB backends. State round trips
are slowed (a test-only LatencyBackend delay) so that records really are in flight at every barrier. Every
job must commit each count exactly once, per key in order. With event time, an asynchronous function's timers
under the same kill must commit exactly what the synchronous KeyedProcessFunction commits without failures."""

from __future__ import annotations

import json
import os
import re
import signal
from typing import Any

import pytest

from runtime.state.rocksdb import available
from tests.support.cluster import Cluster, poll, write_module
from tests.support.failover import (
    KEYS,
    SEED,
    WORKER_ARGS,
    Setup,
    assert_exact_output,
    assert_recovered,
    sink_placement,
    start,
    worker_id_of,
)
from tests.support.releasable_sink import RELEASABLE_SINK, release, release_path

pytestmark = pytest.mark.integration

JOB = '''
from runtime.api import (AsyncKeyedProcessFunction, BoundedOutOfOrderness, FileSink, GeneratorSource, Job,
                         KeyedProcessFunction)


class AsyncCount(AsyncKeyedProcessFunction):
    async def open(self, ctx):
        self.count = ctx.value_state("count", 0)

    async def process(self, record, ctx):
        n = (await self.count.value()) + 1
        await self.count.update(n)
        ctx.emit((record[0], n))


def build(job: Job) -> None:
    (job.source(GeneratorSource(count={words}, keys={keys}, seed={seed}), parallelism=2)
        .key_by(lambda r: r[0])
        .process(AsyncCount(), parallelism=2)
        .sink(FileSink({out!r}, delay_per_record_s={sink_delay})))


# event time: a count per key reported by a timer at the end of each second of event time
def jittered(record):
    return record[2] + (record[1] * 7919) % 400


class AsyncWindows(AsyncKeyedProcessFunction):
    def open(self, ctx):
        self.count = ctx.value_state("count", 0)

    async def process(self, record, ctx):
        await self.count.update((await self.count.value()) + 1)
        ctx.register_event_time_timer(ctx.timestamp // 1000 * 1000 + 999)

    async def on_timer(self, timestamp, payload, ctx):
        ctx.emit(["timer", ctx.key, timestamp, await self.count.value()])


class SyncWindows(KeyedProcessFunction):
    def open(self, ctx):
        self.count = ctx.value_state("count", 0)

    def process(self, record, ctx):
        self.count.update(self.count.value() + 1)
        ctx.timers.register_event_time(ctx.timestamp // 1000 * 1000 + 999)

    def on_timer(self, timestamp, ctx):
        ctx.emit(["timer", ctx.current_key, timestamp, self.count.value()])


def _windows(job, fn, out):
    watermarks = BoundedOutOfOrderness(max_delay_ms=150, timestamp=jittered, granularity_ms=10)
    (job.source(GeneratorSource(count={words}, keys={keys}, seed={seed}), parallelism=1, watermarks=watermarks)
        .key_by(lambda r: r[0])
        .process(fn, parallelism=2)
        .sink(FileSink(out)))


def windows_async(job: Job) -> None:
    _windows(job, AsyncWindows(), {out!r})


def windows_sync(job: Job) -> None:
    _windows(job, SyncWindows(), {out!r} + "-sync")
'''

ROUND_TRIP_MS = 3  # every state batch (reads, then the writes of finished records) costs this much


def install(cluster: Cluster, words: int, sink_delay: float = 0.00002) -> Setup:
    setup = Setup(cluster, words)
    write_module(cluster.tmp_path, "asyncjobs", JOB.format(words=words, keys=KEYS, seed=SEED, out=str(setup.out),
                                                           sink_delay=sink_delay))
    return setup


def config(cluster: Cluster, backend: str, checkpoint: str, mode: str = "unaligned") -> dict[str, Any]:
    state: dict[str, Any] = {"backend": backend, "options": {"round_trip_ms": ROUND_TRIP_MS}}
    if backend == "rocksdb":
        state["work_dir"] = str(cluster.tmp_path / "local-state")
    return {"buffer_bytes": 32 * 1024, "buffers_per_channel": 4,
            "checkpoint": {"interval_s": 0.4, "mode": mode, "timeout_s": 20, "tolerable_failures": 5,
                           "retain": 1000},
            "restart": {"kind": "fixed", "max_attempts": 3, "delay_s": 0.5, "slot_wait_s": 60},
            "state": state,
            "async_state": {"max_in_flight": 300, "batch_size": 64, "batch_timeout_ms": 1, "checkpoint": checkpoint}}


def checkpoints(cluster: Cluster, job_id: str) -> dict[int, dict[str, Any]]:
    job_dir = cluster.tmp_path / "state" / "checkpoints" / job_id
    out = {}
    for d in job_dir.glob("chk-*"):
        try:
            out[int(d.name.split("-")[1])] = json.loads((d / "_metadata").read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            continue  # in progress
    return out


def captured(metadata: dict[str, Any]) -> int:
    """Records in flight that the asynchronous operators' snapshots of this checkpoint captured."""
    return sum(int(ack["figures"].get("async_captured_records", 0)) for ack in metadata["acks"].values())


def async_acks(metadata: dict[str, Any]) -> int:
    return sum(1 for ack in metadata["acks"].values() if "async_captured_records" in ack["figures"])


def run_killed(cluster: Cluster, backend: str, checkpoint: str, words: int, mode: str = "unaligned",
               entry: str = "asyncjobs:build") -> tuple[Setup, str, dict[str, Any]]:
    """Submit the async count, kill -9 the worker of a count subtask after a checkpoint that (in capture mode)
    captured records in flight, start a worker in its place; returns once the job finished."""
    setup = install(cluster, words)
    start(cluster)
    job_id = cluster.submit(entry, config(cluster, backend, checkpoint, mode))
    status: dict[str, Any] = {}

    def ready() -> bool:
        st = setup.status(job_id)
        assert st["state"] in ("CREATED", "DEPLOYING", "RUNNING"), f"{st}\n{setup.logs()}"
        status.update(st)
        done = checkpoints(cluster, job_id)
        if checkpoint == "capture":
            return len(sink_placement(st)) == 2 and any(captured(m) > 0 for m in done.values())
        return len(sink_placement(st)) == 2 and len(done) >= 2

    poll(ready, 60, "completed checkpoints (capture: one with records in flight)")
    victim_id = sink_placement(status)[0]  # hosts a count subtask, chained with its sink
    victim = next(w for w in cluster.workers if worker_id_of(w) == victim_id)
    os.kill(victim.pid, signal.SIGKILL)
    victim.proc.wait(10)
    cluster.start_worker(*WORKER_ARGS, worker_id=victim_id)
    final = setup.wait_finished(job_id, timeout_s=150)
    assert_recovered(final, 1)
    assert final["restored_checkpoint_id"] is not None, final
    return setup, job_id, final


@pytest.mark.timeout(300)
@pytest.mark.parametrize("backend", ["memory", pytest.param("rocksdb", marks=pytest.mark.skipif(
    not available(), reason="the rocksdb extra (rocksdict) is not installed"))])
def test_async_count_in_capture_mode_survives_kill_9_exactly(cluster: Cluster, backend: str) -> None:
    setup, job_id, final = run_killed(cluster, backend, "capture", words=200_000)
    assert_exact_output(setup)
    done = checkpoints(cluster, job_id)
    restored = done[int(final["restored_checkpoint_id"])]
    assert async_acks(restored) == 2, restored["acks"]  # both count subtasks stored their in-flight document
    # capture never waits: records were in flight at the barrier, stored, and replayed first after the restore
    assert captured(restored) > 0, {i: captured(m) for i, m in sorted(done.items())}
    handles = [a["state"]["backend"] for a in restored["acks"].values() if (a.get("state") or {}).get("backend")]
    assert len(handles) == 2 and {h["backend"] for h in handles} == {backend}, handles


@pytest.mark.timeout(300)
@pytest.mark.parametrize("backend, mode", [
    pytest.param("rocksdb", "unaligned", marks=pytest.mark.skipif(not available(), reason="no rocksdict")),
    ("memory", "aligned")])  # aligned: the task drains at the in-band barrier
def test_async_count_in_drain_mode_survives_kill_9_exactly(cluster: Cluster, backend: str, mode: str) -> None:
    setup, job_id, _ = run_killed(cluster, backend, "drain", words=150_000, mode=mode)
    assert_exact_output(setup)
    done = checkpoints(cluster, job_id)
    assert done and all(captured(m) == 0 for m in done.values()), {i: captured(m) for i, m in sorted(done.items())}
    assert any(async_acks(m) == 2 for m in done.values())


def committed_lines(directory: Any) -> list[str]:
    files = sorted(directory.iterdir()) if directory.exists() else []
    assert [p.name for p in files if p.name.startswith((".", "_"))] == [], "uncommitted files left behind"
    return sorted(line for p in files for line in p.read_text().splitlines())


@pytest.mark.timeout(300)
def test_async_timers_with_event_time_in_capture_mode_survive_kill_9_exactly(cluster: Cluster) -> None:
    setup, job_id, _ = run_killed(cluster, "memory", "capture", words=100_000, entry="asyncjobs:windows_async")
    reference = cluster.submit("asyncjobs:windows_sync", {"checkpoint": {"interval_s": 0.5, "mode": "unaligned"}})
    assert cluster.wait_job(reference, timeout_s=120)["state"] == "FINISHED"
    expected = committed_lines(setup.out.parent / (setup.out.name + "-sync"))
    assert len(expected) > 1000  # a timer per key and second of event time
    assert committed_lines(setup.out) == expected
    assert any(captured(m) > 0 for m in checkpoints(cluster, job_id).values())


# -- rescaling a running job ---------------------------------------------------------------------------------

RUNNING_JOB = """
from runtime.api import FileSink, GeneratorSource, Job
from runtime.examples.wordcount import AsyncCount

RELEASE = {release!r}
""" + RELEASABLE_SINK + """

def wordcount(job: Job) -> None:
    (job.source(GeneratorSource(count={words}, keys={keys}, seed={seed}), parallelism=2)
        .key_by(lambda r: r[0])
        .process(AsyncCount(), parallelism=2, name="Count")  # the name test_rescale_running's helpers expect
        .sink(ReleasableSink({out!r}, delay_per_record_s=0.0002)))
"""


def rescale_async(cluster: Cluster, job_id: str, parallelism: int) -> int:
    """`sluice rescale` to `parallelism` (test_rescale_running's checks, bar in-flight channel bytes: the
    asynchronous operator holds most of the data in flight here); returns the checkpoint it used."""
    from runtime.graph.enums import JobState
    from tests.support.cluster import logs, sluice

    before = cluster.call("status", {"job_id": job_id})["attempt"]
    proc = sluice(cluster, "rescale", job_id, "--parallelism", str(parallelism))
    assert proc.returncode == 0, (proc.stdout, proc.stderr, logs(cluster))
    m = re.search(r"rescaled to (.*) \(attempt (\d+)\) from checkpoint (\d+)", proc.stdout)
    assert m is not None, proc.stdout
    assert m.group(1) == f"GeneratorSource={parallelism}, Count -> FileSink={parallelism}", proc.stdout
    st = cluster.call("status", {"job_id": job_id})
    assert st["state"] == JobState.RUNNING and st["attempt"] == before + 1 == int(m.group(2)), st
    assert st["restored_checkpoint_id"] == int(m.group(3)) and st["restarts"] == 0, st
    return int(m.group(3))


# Both rescales come as soon as the job is backpressured (a few seconds in all). The sink bounds the sources:
# they are ahead of it by what the channels hold, which 8 KiB buffers keep to ~20k records, so 150k records
# (15 s of the sink at parallelism 2) leave every source subtask running until the last rescale; the rest then
# drains with the sink released (full speed).
RESCALED_WORDS = 150_000


@pytest.mark.timeout(600)
def test_a_running_async_count_in_capture_mode_rescaled_2_3_1_gives_exact_output(running_cluster: Cluster) -> None:
    """Each rescale takes an unaligned checkpoint with records in flight in the asynchronous operators; the new
    subtasks replay the captured records of their key groups from every old subtask, first."""
    from runtime.graph.enums import JobState
    from tests.support.cluster import assert_running_counts, generator_counts
    from tests.support.rescale import CONFIG, KEYS, SEED, wait_backpressured

    cluster = running_cluster
    out = cluster.tmp_path / "out"
    write_module(cluster.tmp_path, "runningasync", RUNNING_JOB.format(out=str(out), words=RESCALED_WORDS,
                                                                        keys=KEYS, seed=SEED,
                                                                        release=release_path(cluster)))
    # every checkpoint kept: the ones the rescales restored are read after later ones completed
    config = {**CONFIG, "buffer_bytes": 8 * 1024, "checkpoint": {**CONFIG["checkpoint"], "retain": 1000},
              "state": {"backend": "memory", "options": {"round_trip_ms": ROUND_TRIP_MS}},
              "async_state": {"max_in_flight": 300, "checkpoint": "capture"}}
    job_id = str(cluster.call("submit", {"entry": "runningasync:wordcount", "name": "asynccount", "config": config,
                                         "sys_path": str(cluster.tmp_path)})["job_id"])
    captured_at_rescale = []
    for before, after in ((2, 3), (3, 1)):
        wait_backpressured(cluster, job_id, 2 * before)
        restored_from = rescale_async(cluster, job_id, after)
        captured_at_rescale.append(captured(checkpoints(cluster, job_id)[restored_from]))
    release(cluster)  # the rest of the input at full speed
    final = cluster.wait_job(job_id, timeout_s=300)
    assert final["state"] == JobState.FINISHED, final
    assert final["attempt"] == 2 and final["restarts"] == 0, final
    assert_running_counts(out, generator_counts(RESCALED_WORDS, KEYS, SEED))
    # records in flight were captured by the checkpoints the rescales restored, and replayed by key group
    assert sum(captured_at_rescale) > 0, captured_at_rescale
