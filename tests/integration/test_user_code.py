"""User code cannot take a worker down (runtime/execution/isolation.py, runtime/execution/user_code.py).

1. A map that blocks 15 s on one record (longer than the 10 s heartbeat timeout) runs beside an unrelated
   job on the same two workers: no worker is dropped (heartbeats stay far from the timeout), the other job
   never restarts and keeps completing checkpoints, the slow call is reported (worker log, metric, the
   job's exception history with the function and its stack), and the blocking job finishes exactly once.
2. `sys.exit(3)` in a map fails that job with the cause named; the workers and the other job stay up.
3. `os._exit(7)` in a map ends its worker process (nothing in the process can stop it): the coordinator
   restarts the job on the other worker from its checkpoint, and it finishes exactly once.
4. A map that leaks memory on a worker started with `--memory-limit` (RLIMIT_AS) fails with MemoryError;
   the worker stays up.
5. An async_map coroutine blocking 10.5 s in a synchronous call, a sink whose close() blocks 10.5 s, an
   AsyncKeyedProcessFunction's process and a plain map chained before an async_map blocking 10.5 s each (a task
   with an asynchronous operator runs its whole chain on its own loop), beside a bounded job on the same
   workers: no worker dropped, the other job exact, every slow call reported.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.cluster import Cluster, committed_rows, logs, poll, reaped_cluster, write_module
from tests.support.scrape import scrape

JOBS = '''
import os
import sys
import time

from runtime.api import AsyncKeyedProcessFunction, FileSink, GeneratorSource, Job
from runtime.examples.wordcount import Count

BLOCK_S = {block_s}
SHORT_BLOCK_S = {short_block_s}


def steady(job: Job) -> None:
    (job.source(GeneratorSource(count=None, keys=50, seed=3, records_per_second=2000), parallelism=2)
        .key_by(lambda r: r[0]).process(Count(), parallelism=2)
        .sink(FileSink({steady_out!r}), parallelism=2))


def block_on_one_record(record):
    if record[1] == 700:
        time.sleep(BLOCK_S)  # a synchronous client that hangs
    return record[1]


def blocking(job: Job) -> None:
    (job.source(GeneratorSource(count=2000, keys=50, seed=4, records_per_second=400), parallelism=2)
        .map(block_on_one_record, parallelism=2)
        .sink(FileSink({blocking_out!r}), parallelism=2))


def bounded_steady(job: Job) -> None:
    (job.source(GeneratorSource(count={steady_records}, keys=50, seed=10, records_per_second=2000), parallelism=2)
        .map(lambda r: r[1], parallelism=2)
        .sink(FileSink({bounded_out!r}), parallelism=2))


async def block_async_on_one_record(record):
    if record[1] == 300:
        time.sleep(SHORT_BLOCK_S)  # a synchronous client inside an async function
    return record[1]


def async_blocking(job: Job) -> None:
    (job.source(GeneratorSource(count=1000, keys=50, seed=8, records_per_second=400), parallelism=1)
        .async_map(block_async_on_one_record, timeout_s=60, parallelism=1)
        .sink(FileSink({async_out!r}), parallelism=1))


def block_before_async_on_one_record(record):
    if record[1] == 250:
        time.sleep(SHORT_BLOCK_S)  # a plain function chained before an async_map, in the same task
    return record


async def passed_on(record):
    return record


class BlockingAsyncCount(AsyncKeyedProcessFunction):
    async def open(self, ctx):
        self.count = ctx.value_state("count", 0)

    async def process(self, record, ctx):
        await self.count.update((await self.count.value()) + 1)
        if record[1] == 200:
            time.sleep(SHORT_BLOCK_S)  # a synchronous client inside an asynchronous state function
        ctx.emit(record[1])


def async_state_blocking(job: Job) -> None:
    # two tasks, each blocking on its own loop at about the same time: source -> map -> async_map, and the count
    (job.source(GeneratorSource(count=1000, keys=50, seed=11, records_per_second=400), parallelism=1)
        .map(block_before_async_on_one_record, parallelism=1)
        .async_map(passed_on, timeout_s=60, parallelism=1)
        .key_by(lambda r: r[0]).process(BlockingAsyncCount(), parallelism=1)
        .sink(FileSink({state_out!r}), parallelism=1))


class SlowCloseSink(FileSink):
    """A sink whose close() blocks at the end of a bounded job (a client waiting for a broker that is down)."""

    def close(self):
        time.sleep(SHORT_BLOCK_S)
        super().close()


def slow_close(job: Job) -> None:
    (job.source(GeneratorSource(count=500, keys=5, seed=9), parallelism=1).map(lambda r: r[1])
        .sink(SlowCloseSink({close_out!r})))


def exit_on_one_record(record):
    if record[1] == 50:
        sys.exit(3)
    return record


def exiting(job: Job) -> None:
    job.source(GeneratorSource(count=1000, keys=5, seed=5), parallelism=1).map(exit_on_one_record).sink(
        FileSink({exiting_out!r}))


def kill_process_once(record):
    marker = {marker!r}
    if record[1] == 300 and not os.path.exists(marker):
        open(marker, "w").close()
        os._exit(7)
    return record[1]


def killing(job: Job) -> None:
    (job.source(GeneratorSource(count=1000, keys=5, seed=6, records_per_second=500), parallelism=1)
        .map(kill_process_once).sink(FileSink({killing_out!r})))


class Leak:
    """Keeps 8 MiB of every record (in the function object: it goes with the task)."""

    def __init__(self):
        self.kept = []

    def __call__(self, record):
        self.kept.append(bytearray(8 << 20))
        return record[1]


def leaking(job: Job) -> None:
    job.source(GeneratorSource(count=1000, keys=5, seed=7), parallelism=1).map(Leak()).sink(
        FileSink({leaking_out!r}))
'''

BLOCK_S = 15.0
HEARTBEAT_TIMEOUT_S = 10.0  # the coordinator's default
SHORT_BLOCK_S = 10.5  # past the heartbeat timeout: the async call and the close
STEADY_RECORDS = 26_000  # 13 s at its 2,000 records/s: it runs all through both blocks
NO_RESTART = {"restart": {"max_attempts": 0}}
WORKER_ARGS = ("--slow-call", "3s", "--slots", "3")


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Two workers of three slots; the slow-call threshold at 3 s so the 15 s call is reported early in its block."""
    tmp = tmp_path_factory.mktemp("user_code")
    with reaped_cluster(tmp) as c:
        _write_jobs(tmp)
        c.start(2, worker_args=WORKER_ARGS, worker_ids=True)
        yield c


def _write_jobs(tmp: Path) -> None:
    write_module(tmp, "usercodejobs", JOBS.format(
        block_s=BLOCK_S, steady_out=str(tmp / "steady"), blocking_out=str(tmp / "blocking"),
        exiting_out=str(tmp / "exiting"), marker=str(tmp / "killed-once"), killing_out=str(tmp / "killing"),
        leaking_out=str(tmp / "leaking"), short_block_s=SHORT_BLOCK_S, steady_records=STEADY_RECORDS,
        bounded_out=str(tmp / "bounded"), async_out=str(tmp / "async"), close_out=str(tmp / "close"),
        state_out=str(tmp / "async_state")))


def _job(cluster: Cluster, job_id: str) -> dict[str, Any]:
    status: dict[str, Any] = cluster.call("status", {"job_id": job_id})
    return status


@pytest.mark.integration
def test_a_map_blocking_past_the_heartbeat_timeout_touches_no_other_job(shared: Cluster) -> None:
    cluster = shared
    steady = cluster.submit("usercodejobs:steady", {"checkpoint": {"interval_s": 0.5}})
    poll(lambda: _job(cluster, steady).get("checkpoints_completed", 0) >= 2, 60, "the steady job to checkpoint")
    blocking = cluster.submit("usercodejobs:blocking", {"checkpoint": {"interval_s": 0.5}})
    oldest_heartbeat = 0.0
    steady_checkpoints: list[int] = []
    started = time.monotonic()

    def blocking_done() -> bool:
        nonlocal oldest_heartbeat
        workers = cluster.call("status")["workers"]
        assert len(workers) == 2, (workers, logs(cluster))  # none dropped
        oldest_heartbeat = max(oldest_heartbeat, *(w["last_heartbeat_s_ago"] for w in workers))
        other = _job(cluster, steady)
        assert other["state"] == "RUNNING" and other["restarts"] == 0, other
        steady_checkpoints.append(other.get("checkpoints_completed", 0))
        return _job(cluster, blocking)["state"] in ("FINISHED", "FAILED", "CANCELLED")

    poll(blocking_done, BLOCK_S + 90, "the blocking job to end", interval_s=0.25)
    took = time.monotonic() - started
    end = _job(cluster, blocking)
    assert end["state"] == "FINISHED" and end["restarts"] == 0, (end, logs(cluster))
    assert took >= BLOCK_S  # it did block
    # heartbeats every second; the timeout is 10 s: a busy machine delays one by a second or two, never ten
    assert oldest_heartbeat < HEARTBEAT_TIMEOUT_S / 2, oldest_heartbeat
    # the other job kept checkpointing while the call blocked (every 0.5 s; a busy machine may take longer)
    assert steady_checkpoints[-1] - steady_checkpoints[0] >= 5, steady_checkpoints
    rows, _ = committed_rows(cluster.tmp_path / "blocking")
    assert rows == {str(seq): 1 for seq in range(2000)}  # exactly once

    # reported: the worker's log, its metric, and the job's exception history, naming the function
    function = "usercodejobs.block_on_one_record"
    worker_logs = "".join(cluster.log(f"worker-{i}") for i in (1, 2))
    assert f"user call {function}" in worker_logs and "time.sleep(BLOCK_S)" in worker_logs
    entries = [e for e in _exceptions(cluster, blocking) if function in e["cause"]]
    assert len(entries) == 1 and entries[0]["outcome"] == "reported", entries
    assert "time.sleep(BLOCK_S)" in entries[0]["traceback"]
    slow_calls = sum(v for w in cluster.workers for k, v in scrape(w.fields["metrics"]).items()
                     if k.startswith("sluice_task_slow_user_calls_total{") and blocking in k)
    assert slow_calls == 1
    cluster.call("cancel", {"job_id": steady})
    cluster.wait_job(steady, timeout_s=60)


@pytest.mark.integration
def test_an_async_call_and_a_close_blocking_past_the_heartbeat_timeout_touch_no_other_job(shared: Cluster) -> None:
    """A task with an asynchronous operator runs its whole chain on its own loop, and a task's close() runs on its
    thread (runtime/execution/user_loop.py, Task._close): an async_map coroutine that sleeps 10.5 s in a
    synchronous call, a sink whose close() sleeps 10.5 s at the end of its bounded job, an
    AsyncKeyedProcessFunction's process and a plain map chained before an async_map that sleep 10.5 s each,
    beside a bounded job that keeps running and checkpointing on the same workers: no worker is dropped, the
    other job finishes exact and never restarts, every slow call is reported naming its function, and every
    blocking job finishes exactly once."""
    cluster = shared
    other = cluster.submit("usercodejobs:bounded_steady", {"checkpoint": {"interval_s": 0.5}})
    async_job = cluster.submit("usercodejobs:async_blocking", {"checkpoint": {"interval_s": 0.5}})
    close_job = cluster.submit("usercodejobs:slow_close", {"checkpoint": {"interval_s": 0.5}})
    state_job = cluster.submit("usercodejobs:async_state_blocking", {"checkpoint": {"interval_s": 0.5}})
    jobs = (other, async_job, close_job, state_job)
    oldest_heartbeat = 0.0
    other_checkpoints: list[int] = []
    started = time.monotonic()

    def all_done() -> bool:
        nonlocal oldest_heartbeat
        workers = cluster.call("status")["workers"]
        assert len(workers) == 2, (workers, logs(cluster))  # none dropped
        oldest_heartbeat = max(oldest_heartbeat, *(w["last_heartbeat_s_ago"] for w in workers))
        states = [_job(cluster, job) for job in jobs]
        assert all(s["restarts"] == 0 for s in states), states
        if states[0]["state"] == "RUNNING":
            other_checkpoints.append(states[0].get("checkpoints_completed", 0))
        return all(s["state"] in ("FINISHED", "FAILED", "CANCELLED") for s in states)

    poll(all_done, SHORT_BLOCK_S + 90, "the four jobs to end", interval_s=0.25)
    took = time.monotonic() - started
    for job in jobs:
        end = _job(cluster, job)
        assert end["state"] == "FINISHED" and end["restarts"] == 0, (end, logs(cluster))
    assert took >= SHORT_BLOCK_S  # they did block
    assert oldest_heartbeat < HEARTBEAT_TIMEOUT_S / 2, oldest_heartbeat
    # the other job kept checkpointing meanwhile (every 0.5 s; a busy machine may take longer)
    assert other_checkpoints and other_checkpoints[-1] - other_checkpoints[0] >= 5, other_checkpoints
    for out, count in (("bounded", STEADY_RECORDS), ("async", 1000), ("close", 500), ("async_state", 1000)):
        rows, _ = committed_rows(cluster.tmp_path / out)
        assert rows == {str(seq): 1 for seq in range(count)}, out  # exactly once

    worker_logs = "".join(cluster.log(f"worker-{i}") for i in (1, 2))
    for job, function in ((async_job, "usercodejobs.block_async_on_one_record"),
                          (close_job, "usercodejobs.SlowCloseSink.close"),
                          (state_job, "usercodejobs.BlockingAsyncCount.process"),
                          (state_job, "usercodejobs.block_before_async_on_one_record")):
        line = "time.sleep(SHORT_BLOCK_S)"
        assert f"user call {function}" in worker_logs, function
        entries = [e for e in _exceptions(cluster, job) if function in e["cause"]]
        assert len(entries) == 1 and entries[0]["outcome"] == "reported", entries
        assert line in entries[0]["traceback"], entries[0]


def _exceptions(cluster: Cluster, job_id: str) -> list[dict[str, Any]]:
    """The job's exception history, newest first (REST)."""
    assert cluster.coordinator is not None
    url = f"http://{cluster.coordinator.fields['http']}/api/v1/jobs/{job_id}/exceptions"
    with urllib.request.urlopen(url, timeout=10) as resp:
        entries: list[dict[str, Any]] = json.loads(resp.read())["exceptions"]
    return entries


@pytest.mark.integration
def test_sys_exit_in_a_map_fails_that_job_only(shared: Cluster) -> None:
    cluster = shared
    steady = cluster.submit("usercodejobs:steady", {"checkpoint": {"interval_s": 0.5}})
    job = cluster.submit("usercodejobs:exiting", NO_RESTART)
    end = cluster.wait_job(job, timeout_s=60)
    assert end["state"] == "FAILED", end
    cause = _exceptions(cluster, job)[0]["cause"]
    assert "sys.exit(3)" in cause and "usercodejobs.exit_on_one_record" in cause, cause
    assert all(w.proc.poll() is None for w in cluster.workers)  # status 3 used to end the worker
    assert len(cluster.call("status")["workers"]) == 2
    other = _job(cluster, steady)
    assert other["state"] == "RUNNING" and other["restarts"] == 0, other
    cluster.call("cancel", {"job_id": steady})
    cluster.wait_job(steady, timeout_s=60)


@pytest.mark.integration
def test_os_exit_ends_its_worker_and_the_job_recovers_on_the_other(shared: Cluster) -> None:
    cluster = shared
    job = cluster.submit("usercodejobs:killing", {"checkpoint": {"interval_s": 0.3}})
    poll(lambda: any(w.proc.poll() is not None for w in cluster.workers), 60, "a worker to exit")
    (gone,) = [w for w in cluster.workers if w.proc.poll() is not None]
    assert gone.proc.returncode == 7
    end = cluster.wait_job(job, timeout_s=120)
    assert end["state"] == "FINISHED" and end["restarts"] == 1, (end, logs(cluster))
    rows, _ = committed_rows(cluster.tmp_path / "killing")
    assert rows == {str(seq): 1 for seq in range(1000)}  # exactly once across the lost worker
    cluster.start_worker(*WORKER_ARGS, worker_id=str(gone.fields["id"]))  # for the tests after this one
    cluster.wait_workers(2)


@pytest.mark.integration
def test_a_leaking_map_under_a_memory_limit_fails_with_memory_error(cluster: Cluster) -> None:
    _write_jobs(cluster.tmp_path)
    cluster.start(1, worker_args=("--memory-limit", "700MiB"))
    job = cluster.submit("usercodejobs:leaking", NO_RESTART)
    end = cluster.wait_job(job, timeout_s=120)
    assert end["state"] == "FAILED", end
    entry = _exceptions(cluster, job)[0]
    assert "MemoryError" in entry["cause"], entry
    # the worker lives on: what the function kept went with its task
    assert cluster.workers[0].proc.poll() is None, logs(cluster)
    assert len(cluster.call("status")["workers"]) == 1
