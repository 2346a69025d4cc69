"""Async I/O against a real HTTP service (runtime/examples/lookup_service.py, its own process, 20 ms a lookup,
every 50th answered with 503): an ordered enrichment job under kill -9 of a worker with unaligned checkpoints
commits every record's enrichment exactly once and in input order per subtask; and a service outage longer
than the timeout is ridden out by the retry policy, or fails the call for good when the policy gives up. And
against tests/support/faulty_http_service.py: a job whose service only answers 503 fails naming the HTTP error,
one whose service first does not answer finishes with exact output."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from runtime.api import RetryPolicy
from runtime.api.async_io import AsyncMap
from runtime.connectors.http_client import HttpClient
from runtime.examples.lookup_service import score
from runtime.execution.async_io import AsyncIOFailed, AsyncIOOperator
from tests.support.cluster import Cluster, poll, write_module
from tests.support.failover import (
    Setup,
    assert_recovered,
    kill_worker_running,
    part_order,
    restart_worker,
    sink_placement,
    start,
)
from tests.support.faulty_http_service import Fault, always, faults_first, serving_in_thread
from tests.support.lookup_service import lookup_service
from tests.support.scrape import scrape

pytestmark = pytest.mark.integration

WORDS, KEYS, SEED = 20_000, 100, 3

JOB = '''
from runtime.api import FileSink, GeneratorSource, Job, RetryPolicy
from runtime.connectors.http_client import HttpClient

service = HttpClient("127.0.0.1", {port}, max_connections=50)


async def lookup(record):
    key, seq, _ = record
    answer = await service.get_json(f"/lookup/{{key}}")
    return [key, seq, answer["score"]]


def build(job: Job) -> None:
    (job.source(GeneratorSource(count={words}, keys={keys}, seed={seed}), parallelism=2)
        .async_map(lookup, capacity=50, timeout_s=2.0, ordered=True,
                   retry=RetryPolicy(max_attempts=6, initial_backoff_s=0.01))
        .sink(FileSink({out!r})))
'''


def captured(cluster: Cluster, job_id: str) -> int:
    """Records in flight captured by the completed checkpoints so far."""
    total = 0
    for d in (cluster.tmp_path / "state" / "checkpoints" / job_id).glob("chk-*"):
        try:
            metadata = json.loads((d / "_metadata").read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            continue  # in progress
        total += sum(int(a["figures"].get("async_captured_records", 0)) for a in metadata["acks"].values())
    return total


def metric(cluster: Cluster, name: str) -> float:
    return sum(v for w in cluster.workers if w.proc.poll() is None
               for k, v in scrape(w.fields["metrics"]).items() if k.startswith(name))


@pytest.mark.timeout(180)
def test_ordered_enrichment_survives_kill_9_exactly_and_in_order(cluster: Cluster) -> None:
    with lookup_service(latency_ms=20, fail_every=50) as port:
        setup = Setup(cluster, WORDS)
        write_module(cluster.tmp_path, "enrichjob", JOB.format(port=port, words=WORDS, keys=KEYS, seed=SEED,
                                                                out=str(setup.out)))
        start(cluster)
        job_id = cluster.submit("enrichjob:build", {
            "checkpoint": {"interval_s": 0.3, "mode": "unaligned", "timeout_s": 10, "tolerable_failures": 3},
            "restart": {"kind": "fixed", "max_attempts": 3, "delay_s": 0.3, "slot_wait_s": 60}})
        status: dict[str, Any] = {}

        def ready() -> bool:
            status.update(setup.status(job_id))
            assert status["state"] in ("CREATED", "DEPLOYING", "RUNNING"), f"{status}\n{setup.logs()}"
            # a checkpoint stored calls in flight, and injected 503s were retried (seen in the metrics)
            return (len(sink_placement(status)) == 2 and captured(cluster, job_id) > 0
                    and metric(cluster, "sluice_async_io_requests_retried_total") > 0)

        poll(ready, 60, "a checkpoint with calls in flight, and a retried call")
        restart_worker(cluster, kill_worker_running(cluster, status, 0))
        final = setup.wait_finished(job_id, timeout_s=120)
    assert_recovered(final, 1)
    assert final["restored_checkpoint_id"] is not None, final
    files = sorted(setup.out.iterdir(), key=part_order)
    assert [p.name for p in files if p.name.startswith((".", "_"))] == [], "uncommitted files left behind"
    seqs: list[int] = []
    by_subtask: dict[int, list[int]] = {}
    for path in files:
        for line in path.read_text().splitlines():
            key, seq, value = json.loads(line)
            assert value == score(key), line
            seqs.append(seq)
            by_subtask.setdefault(part_order(path)[0], []).append(seq)
    assert sorted(seqs) == list(range(WORDS))  # every record's enrichment exactly once
    for subtask, mine in by_subtask.items():  # ordered mode: each subtask's output in its input order
        assert mine == sorted(mine), f"subtask {subtask} out of order"


async def enrich_through_outage(port: int, outage_s: float, retry: RetryPolicy) -> AsyncIOOperator:
    """One lookup issued while the service hangs for `outage_s`, on the operator alone (no cluster)."""
    client = HttpClient("127.0.0.1", port)
    out: list[Any] = []

    async def lookup(key: str) -> Any:
        return (await client.get_json(f"/lookup/{key}"))["score"]

    op = AsyncIOOperator(AsyncMap(lookup, 10, 0.1, True, retry), node_id=1, name="lookup", key_fn=None,
                         subtask_index=0, parallelism=1, max_parallelism=128, timed=False, emit=out.extend,
                         forward_watermark=lambda ts: None)
    op.bind(wake=lambda: None, on_failure=lambda e: None)
    await client.get_json(f"/outage/{outage_s}")
    op.feed(["k1"])
    try:
        await asyncio.wait_for(op.finish(), 10)
        assert out == [score("k1")]
    finally:
        await op.aclose()
        client.close()
    return op


@pytest.mark.timeout(60)
async def test_an_outage_longer_than_the_timeout_follows_the_retry_policy() -> None:
    with lookup_service(latency_ms=5) as port:
        # 0.1 s timeout, backoff 0.05 s doubling to 0.2 s: a 0.6 s outage costs a few timed-out attempts
        op = await enrich_through_outage(port, 0.6, RetryPolicy(max_attempts=8, initial_backoff_s=0.05,
                                                                 max_backoff_s=0.2))
        assert op.stats.completed == 1 and op.stats.timed_out >= 3 and op.stats.retried == op.stats.timed_out
        # a policy that gives up before the outage ends fails the call for good (the task would fail)
        with pytest.raises(AsyncIOFailed, match=r"timed out \(timeout_s=0.1\) after 3 attempt"):
            await enrich_through_outage(port, 2.0, RetryPolicy(max_attempts=3, initial_backoff_s=0.05))


FAULTY_JOBS = '''
from runtime.api import FileSink, GeneratorSource, Job, RetryPolicy
from runtime.connectors.http_client import HttpClient

down = HttpClient("127.0.0.1", {down_port})
recovering = HttpClient("127.0.0.1", {recovering_port})


def enrich(client):
    async def lookup(record):
        key, seq, _ = record
        return [key, seq, (await client.get_json(f"/lookup/{{key}}"))["score"]]
    return lookup


def build(job: Job, client, out) -> None:
    (job.source(GeneratorSource(count={records}, keys=20, seed=1), parallelism=1)
        .async_map(enrich(client), capacity=8, timeout_s=0.5,
                   retry=RetryPolicy(max_attempts=4, initial_backoff_s=0.05))
        .sink(FileSink(out)))


def against_down(job: Job) -> None:
    build(job, down, {down_out!r})


def against_recovering(job: Job) -> None:
    build(job, recovering, {recovering_out!r})
'''


@pytest.mark.timeout(60)
def test_a_job_fails_naming_the_services_error_or_rides_out_a_service_that_recovers(cluster: Cluster) -> None:
    """Two jobs at once: one against a service that only answers 503 fails after its one restart with the
    HTTP error named; one against a service whose first six requests get no answer at all (retried after the
    0.5 s timeout) finishes without a restart, every record enriched exactly once."""
    records = 300
    down_out, recovering_out = cluster.tmp_path / "down", cluster.tmp_path / "recovering"
    with serving_in_thread(always(Fault.ANSWER_503)) as down, \
            serving_in_thread(faults_first(6, Fault.NEVER)) as recovering:
        write_module(cluster.tmp_path, "faultyjobs", FAULTY_JOBS.format(
            down_port=down.port, recovering_port=recovering.port, records=records, down_out=str(down_out),
            recovering_out=str(recovering_out)))
        cluster.start(1)
        restart = {"kind": "fixed", "max_attempts": 1, "delay_s": 0.2, "slot_wait_s": 30}
        failing = cluster.submit("faultyjobs:against_down", {"restart": restart})
        riding = cluster.submit("faultyjobs:against_recovering", {"restart": restart})
        failed, finished = cluster.wait_job(failing, 40), cluster.wait_job(riding, 40)
    assert failed["state"] == "FAILED" and failed["restarts"] == 1, failed
    cause = "a call failed: HttpError: GET /lookup/"
    assert cause in failed["error"] and "HTTP 503" in failed["error"] and "after 4 attempt(s)" in failed["error"]
    assert len(failed["failures"]) == 2 and all(cause in f for f in failed["failures"]), failed
    assert finished["state"] == "FINISHED" and finished["restarts"] == 0 and finished["failures"] == [], finished
    assert [n for n, _ in recovering.faults] == [1, 2, 3, 4, 5, 6]
    rows = [json.loads(line) for p in sorted(recovering_out.iterdir()) if not p.name.startswith((".", "_"))
            for line in p.read_text().splitlines()]
    assert sorted(seq for _, seq, _ in rows) == list(range(records))
    assert all(value == score(key) for key, _, value in rows)
