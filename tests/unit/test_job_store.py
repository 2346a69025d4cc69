"""The persisted job record: a round trip keeps what recovery needs; a damaged or missing file is one clear line
and that record is skipped, never a crash of the coordinator that reads it."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from coordinator.checkpointing import CheckpointSettings, CompletedCheckpoint
from coordinator.job_store import CorruptJobRecord, JobStore, decode, encode, needs_recovery, superseded
from coordinator.jobs import JobRecord
from coordinator.restarts import RestartStrategy
from runtime.graph.enums import JobState
from runtime.graph.job_config import ChannelConfig, JobConfig


def a_job(job_id: str = "job-0001", state: str = JobState.RUNNING) -> JobRecord:
    job = JobRecord(job_id, "mod:build", "wordcount", "jobs-dir",
                    JobConfig.from_document({"buffer_bytes": 4096, "parallelism": {"*": 2}}))
    job.checkpoint_settings = CheckpointSettings(0.5, mode="unaligned", tolerable_failures=3, retain=2)
    job.restart_strategy = RestartStrategy("exponential", max_attempts=7, delay_s=0.25)
    job.state = state
    job.attempt, job.restarts, job.next_checkpoint_id = 3, 2, 12
    job.last_checkpoint = CompletedCheckpoint(11, "/state/checkpoints/job-0001/chk-11")
    job.restored_from = "/sp/savepoint-x-4"
    job.failures = ["worker w-1 lost: heartbeat timeout"]
    return job


def test_round_trip_keeps_what_recovery_needs() -> None:
    job = decode(encode(a_job()), "job-0001.json")
    assert (job.job_id, job.entry, job.name, job.sys_path) == ("job-0001", "mod:build", "wordcount", "jobs-dir")
    assert job.config == JobConfig(channels=ChannelConfig(buffer_bytes=4096), parallelism={"*": 2})
    assert job.checkpoint_settings == CheckpointSettings(0.5, mode="unaligned", tolerable_failures=3, retain=2)
    assert job.restart_strategy == RestartStrategy("exponential", max_attempts=7, delay_s=0.25)
    assert (job.state, job.attempt, job.restarts, job.next_checkpoint_id) == (JobState.RUNNING, 3, 2, 12)
    # the pointer only: the figures of the checkpoint are not needed to restore it
    assert job.last_checkpoint == CompletedCheckpoint(11, "/state/checkpoints/job-0001/chk-11")
    assert job.restored_from == "/sp/savepoint-x-4"
    assert needs_recovery(job)


def test_the_autoscalers_decisions_and_counts_survive_a_round_trip() -> None:
    from dataclasses import replace

    from coordinator.load_scaler import APPLIED, APPLYING, DRY_RUN, INTERRUPTED, REFUSED, DecisionRecord, LoadScaling

    job = a_job()
    assert decode(encode(job), "job-0001.json").load_scaling is None  # never ran: nothing kept
    job.load_scaling = LoadScaling()
    applied = DecisionRecord(1795950000.5, "Count", 1, 2, "up", 900.0, 1400.0, 1.1, 0.95, 850.0, "busy", APPLIED)
    dry = DecisionRecord(1795950060.0, "Map", 2, 1, "down", None, None, None, 0.05, 10.0, "idle", DRY_RUN)
    running = DecisionRecord(1795950120.0, "Count", 2, 3, "up", 1.0, 2.0, 1.0, 0.9, 1.0, "busy", APPLYING)
    job.load_scaling.decisions.extend([applied, dry, running])
    job.load_scaling.counts = {("Count", "up"): 5, ("Map", "down"): 1}  # more than the decisions kept
    back = decode(encode(job), "job-0001.json").load_scaling
    assert back is not None and back.counts == {("Count", "up"): 5, ("Map", "down"): 1}
    # the one being applied when the record was written cannot be known to have finished: it says so
    assert list(back.decisions) == [applied, dry, replace(running, outcome=REFUSED, error=INTERRUPTED)]
    assert back.evaluation is None and not back.samples and not back.applying


def test_an_ended_job_comes_back_ended() -> None:
    ended = a_job(state=JobState.FINISHED)
    ended.ended_at = 1234.5
    job = decode(encode(ended), "x")
    assert job.terminal and job.ended.is_set() and job.ended_at == 1234.5
    assert not needs_recovery(job)


@pytest.mark.parametrize(("damage", "message"), [
    (lambda b: b"", "job record is empty"),
    (lambda b: b[: len(b) // 2], "truncated or not JSON"),
    (lambda b: b.replace(b'"mod:build"', b'"mod:bui1d"'), "job record is corrupt: CRC-32"),
    (lambda b: b.replace(b'"format": 1', b'"format": 9'), "unsupported job record format 9"),
    (lambda b: b"[1, 2]", "expected a JSON object, got list"),
])
def test_a_damaged_record_is_named(damage: object, message: str) -> None:
    with pytest.raises(CorruptJobRecord, match=message) as info:
        decode(damage(encode(a_job())), "/state/jobs/job-0001.json")  # type: ignore[operator]
    assert str(info.value).startswith("/state/jobs/job-0001.json: ")
    assert "\n" not in str(info.value)


def test_a_record_with_a_bad_field_is_named() -> None:
    doc = json.loads(encode(a_job()))
    doc["attempt"] = "three"
    doc.pop("checksum")
    from coordinator.job_store import _body  # the checksum of the body as written, to get past it
    from runtime.common.checksums import checksum
    doc["checksum"] = checksum(_body(doc))
    with pytest.raises(CorruptJobRecord, match="'attempt' must be int, got 'three'"):
        decode(json.dumps(doc).encode(), "f")


@given(st.binary(max_size=300))
def test_any_bytes_decode_or_raise_the_one_error(data: bytes) -> None:
    try:
        decode(data, "f")
    except CorruptJobRecord:
        pass


async def test_store_writes_and_loads_skipping_damaged_files(tmp_path: Path) -> None:
    store = JobStore(str(tmp_path))
    assert store.load() == ([], [])  # no jobs directory yet: a first start
    writer = asyncio.create_task(store.run())
    try:
        first, second = a_job("job-a"), a_job("job-b", JobState.CANCELLED)
        second.submitted_at = first.submitted_at + 1
        store.save(first)
        first.attempt = 4  # a later change: the later record wins
        store.save(first)
        store.save(second)
        await store.flush()
    finally:
        writer.cancel()
    jobs_dir = tmp_path / "jobs"
    (jobs_dir / "job-c.json").write_bytes(encode(a_job("job-c"))[:40])  # torn by a crash of another kind
    (jobs_dir / "job-d.json").write_bytes(encode(a_job("job-e")))  # holds another job than its name
    (jobs_dir / ".job-a.json.x.tmp").write_bytes(b"half")  # a temporary file left by a crash: ignored
    os.mkdir(jobs_dir / "job-f.json")  # not a file at all
    jobs, problems = store.load()
    assert [(j.job_id, j.state, j.attempt) for j in jobs] == [("job-a", JobState.RUNNING, 4),
                                                              ("job-b", JobState.CANCELLED, 3)]
    assert len(problems) == 3, problems
    assert any("job-c.json: job record is truncated or not JSON" in p for p in problems), problems
    assert any("job-d.json: holds job 'job-e'" in p for p in problems), problems
    assert any("job-f.json: cannot read job record" in p for p in problems), problems


async def test_a_coordinator_that_lost_its_lease_writes_nothing(tmp_path: Path) -> None:
    leading = [True]
    store = JobStore(str(tmp_path), may_write=lambda: leading[0])
    writer = asyncio.create_task(store.run())
    try:
        store.save(a_job("job-a"))
        await store.flush()
        leading[0] = False
        job = a_job("job-a", JobState.CANCELLED)
        store.save(job)
        await store.flush()
    finally:
        writer.cancel()
    jobs, _ = store.load()
    assert [j.state for j in jobs] == [JobState.RUNNING]


def test_an_upgrades_new_version_supersedes_the_unfinished_old_one() -> None:
    """Issue 31: the new version's record is written before the old one is cancelled; whatever the old record
    says then (RUNNING: the leader died before the cancel), the new leader cancels it rather than run both."""
    old, new = a_job("job-old"), decode(encode(a_job("job-new", JobState.CREATED)), "x")
    assert new.upgrade_of == ""  # a record of an older version without the field: no upgrade
    new.upgrade_of = "job-old"
    new = decode(encode(new), "job-new.json")
    assert new.upgrade_of == "job-old"
    assert superseded([old, new]) == {"job-old": "job-new"}
    old.state = JobState.CANCELLED  # the cancel was recorded: nothing left to finish but the new one's start
    assert superseded([old, new]) == {}
    assert superseded([new]) == {}  # the old record is gone: the new one runs like any recovered job


async def test_written_waits_for_the_record_as_queued_and_reports_a_failed_write(tmp_path: Path) -> None:
    leading = [True]
    store = JobStore(str(tmp_path), may_write=lambda: leading[0])
    await store.written("job-a")  # nothing queued: at once
    writer = asyncio.create_task(store.run())
    try:
        store.save(a_job("job-a", JobState.CREATED))
        await store.written("job-a")  # awaited directly: the waiter is registered before the writer runs
        assert [j.state for j in store.load()[0]] == [JobState.CREATED]
        leading[0] = False
        store.save(a_job("job-a", JobState.RUNNING))
        with pytest.raises(OSError, match="no longer the leader"):
            await store.written("job-a")  # awaited directly: the waiter is registered before the writer runs
    finally:
        writer.cancel()
    assert [j.state for j in store.load()[0]] == [JobState.CREATED]


def test_the_page_history_survives_a_round_trip_in_unix_time() -> None:
    """Checkpoints, counters, exceptions and the graph come back on another coordinator, whose monotonic clock
    differs: start times cross as Unix time."""
    from coordinator.exception_history import Detail

    job = a_job()
    job.earlier_checkpoints = [{"checkpoint_id": n, "status": "COMPLETED" if n != 3 else "FAILED", "mode": "aligned",
                                "savepoint": False, "started_at": 100.0 + n, "duration_s": 0.1, "state_bytes": 5,
                                "inflight_bytes": 0, "alignment_s": 0.0, "start_delay_s": 0.0}
                               for n in range(1, 61)]
    job.checkpoints_before = (7, 1)  # trimmed away earlier
    job.exceptions.stash("task 1:0 failed: ValueError: x", Detail("1:0", "w-1", "Traceback...\nValueError: x\n"))
    job.note_failure("task 1:0 failed: ValueError: x", now=5000.0)
    job.saved_graph = {"vertices": [{"id": 1, "name": "Src", "parallelism": 2, "records_in": 0, "records_out": 9}],
                       "edges": []}
    back = decode(encode(job, offset=1000.0), "x", offset=2000.0)
    assert back.checkpoint_counts() == (7 + 59, 1 + 1)
    assert len(back.earlier_checkpoints) == 50 and back.earlier_checkpoints[-1]["checkpoint_id"] == 60
    assert back.earlier_checkpoints[-1]["started_at"] == 160.0 + 1000.0 - 2000.0
    [entry] = back.exceptions.entries()
    assert (entry.cause, entry.task, entry.worker, entry.time, entry.outcome) == (
        "task 1:0 failed: ValueError: x", "1:0", "w-1", 5000.0, "pending")
    assert entry.traceback.endswith("ValueError: x\n")
    assert back.total_tasks() == 2 and back.graph_snapshot() == job.saved_graph


def test_a_record_of_an_older_version_loads_with_an_empty_history() -> None:
    doc = json.loads(encode(a_job()))
    for key in ("checkpoint_history", "checkpoint_counts", "exceptions", "graph", "checksum"):
        doc.pop(key)
    from coordinator.job_store import _body
    from runtime.common.checksums import checksum
    doc["checksum"] = checksum(_body(doc))
    job = decode(json.dumps(doc).encode(), "old.json")
    assert job.checkpoint_counts() == (0, 0) and job.exceptions.entries() == [] and job.saved_graph is None


async def test_wait_job_answers_that_a_job_ended_only_once_that_record_is_on_disk(tmp_path: Path) -> None:
    """Issue 30: a coordinator restarted from the record must show what `wait_job` answered (the count of
    checkpoints too). The record writer starts late here, at an exact point: the answer waits for it."""
    from coordinator import lifecycle as lc
    from coordinator.server import Coordinator, CoordinatorConfig

    class Leading(Coordinator):
        def leading(self) -> bool:  # no lease in a unit test; the record writer asks too
            return True

    coordinator = Leading(CoordinatorConfig(token="t", metrics_port=None, state_dir=str(tmp_path)))
    job = JobRecord("job-1", "runtime.examples.wordcount:build", "wc", "", JobConfig())
    coordinator.manager.add(job)
    coordinator.manager.handle(job, lc.CancelAsked("by the test"))  # ended before any deploy got anywhere
    assert job.state == JobState.CANCELLED
    answer = asyncio.ensure_future(coordinator.on_rpc(None, "wait_job", {"job_id": "job-1"}))  # type: ignore[arg-type]
    for _ in range(20):
        await asyncio.sleep(0)
    assert not answer.done()  # nothing is on disk yet
    writer = asyncio.ensure_future(coordinator.store.run())
    try:
        summary = await asyncio.wait_for(answer, 10.0)
        recorded, problems = JobStore(str(tmp_path)).load()
        assert problems == []
        assert [(j.job_id, j.state, j.checkpoint_counts()) for j in recorded] == [
            ("job-1", summary["state"], (summary["checkpoints_completed"], summary["checkpoints_failed"]))]
    finally:
        writer.cancel()
        await coordinator.manager.stop()
