"""The exception history: one entry per failover with the traceback its report carried, and the outcome."""

from __future__ import annotations

from coordinator.exception_history import HISTORY_SIZE, Detail, ExceptionHistory
from coordinator.jobs import JobRecord
from runtime.graph.enums import JobState
from runtime.graph.job_config import JobConfig


def test_the_root_cause_takes_its_stashed_traceback_and_concurrent_ones_are_dropped() -> None:
    h = ExceptionHistory()
    h.stash("task 1:0 failed: E", Detail("1:0", "w-1", "tb-1"))
    h.stash("task 1:1 failed: E", Detail("1:1", "w-2", "tb-2"))
    entry = h.record("task 1:1 failed: E", now=10.0, attempt=0)
    assert (entry.task, entry.worker, entry.traceback) == ("1:1", "w-2", "tb-2")
    later = h.record("task 1:0 failed: E", now=20.0, attempt=1)  # the other stash went with the first failover
    assert (later.task, later.traceback) == (None, "")
    h.restarted(now=12.5, attempt=2, restored_checkpoint_id=4)
    assert [(e.outcome, e.restarted_attempt, e.restored_checkpoint_id) for e in h.entries()] == [
        ("restarted", 2, 4), ("restarted", 2, 4)]
    assert h.entries()[0].restart_s == 2.5


def test_the_history_is_bounded() -> None:
    h = ExceptionHistory()
    for n in range(HISTORY_SIZE + 5):
        h.record(f"cause {n}", now=float(n), attempt=n)
    assert len(h) == HISTORY_SIZE and h.entries()[-1].cause == f"cause {HISTORY_SIZE + 4}"


def test_job_moves_give_the_entries_their_outcome() -> None:
    job = JobRecord("job-1", "m:b", "m:b", "", JobConfig())
    job.move(JobState.DEPLOYING)
    job.move(JobState.RUNNING)
    job.note_failure("worker w-1 lost: heartbeat timeout", now=1.0)
    job.move(JobState.RESTARTING)
    job.attempt, job.restored_checkpoint_id = 1, 7
    job.move(JobState.DEPLOYING)
    job.move(JobState.RUNNING)
    job.note_failure("task 2:0 failed: boom", now=2.0)
    job.move(JobState.FAILED, "task 2:0 failed: boom")
    assert [(e.outcome, e.restarted_attempt, e.restored_checkpoint_id) for e in job.exceptions.entries()] == [
        ("restarted", 1, 7), ("failed", None, None)]
    assert job.failures == ["worker w-1 lost: heartbeat timeout", "task 2:0 failed: boom"]


def test_archived_checkpoints_are_counted_when_trimmed() -> None:
    job = JobRecord("job-1", "m:b", "m:b", "", JobConfig())
    job.earlier_checkpoints = [{"checkpoint_id": n, "status": "COMPLETED"} for n in range(10)]
    job.archive_checkpoints(limit=4)
    assert len(job.earlier_checkpoints) == 4 and job.checkpoint_counts() == (10, 0)


def test_a_checkpoint_completed_after_its_attempt_restarted_is_archived_as_completed() -> None:
    job = JobRecord("job-1", "m:b", "m:b", "", JobConfig())
    job.earlier_checkpoints = [{"checkpoint_id": 1, "status": "COMPLETED"},
                               {"checkpoint_id": 2, "status": "IN_PROGRESS", "duration_s": None}]
    assert job.checkpoint_counts() == (1, 0)
    job.complete_archived({"checkpoint_id": 2, "status": "COMPLETED", "duration_s": 0.4})
    assert job.checkpoint_history()[-1] == {"checkpoint_id": 2, "status": "COMPLETED", "duration_s": 0.4}
    assert job.checkpoint_counts() == (2, 0)
    job.complete_archived({"checkpoint_id": 9, "status": "COMPLETED"})  # not archived: nothing changes
    assert [h["checkpoint_id"] for h in job.checkpoint_history()] == [1, 2]
