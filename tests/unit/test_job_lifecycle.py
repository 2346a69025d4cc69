"""JobLifecycle: the exact instructions for each stimulus in each state, the way test_checkpointing.py pins the
checkpoint coordinator down; and a property test over random stimulus sequences (no two deploys at once, none
after the end, only legal transitions)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.jobs import TRANSITIONS
from coordinator.lifecycle import (
    PLAN_RETRY_S,
    Adopt,
    AllTasksEnded,
    AllTasksFinished,
    AnswerRescale,
    AttemptPlanned,
    CancelAsked,
    CancelTasks,
    CheckpointCompleted,
    CommitRescale,
    Deploy,
    DeployAcked,
    DeployFailed,
    ExecutionFailed,
    FinalCheckpointDone,
    JobLifecycle,
    LeaseLost,
    MoveTo,
    Persist,
    PlanAttempt,
    PlanFailed,
    RecordFailure,
    RecordFinalCheckpoint,
    RecordRestart,
    Recovered,
    RequestFinalCheckpoint,
    RescaleAsked,
    RescaleCheckpointDone,
    RestartDelayElapsed,
    RestoreChoice,
    RestoreMissing,
    ScheduleRestart,
    StartCheckpoints,
    StartTasks,
    StepReached,
    StopCheckpoints,
    Submitted,
    TakeRescaleCheckpoint,
    TaskFailed,
    TasksStarted,
    UsePlan,
    WorkerLost,
    choose_restore,
)
from coordinator.restarts import RestartStrategy
from runtime.graph.enums import JobState

FIXED = RestartStrategy("fixed", max_attempts=2, delay_s=1.0, slot_wait_s=10.0, failure_window_s=None)


def running(strategy: RestartStrategy | None = FIXED) -> JobLifecycle:
    """A job whose attempt 0 runs (at time 0)."""
    job = JobLifecycle("j", strategy)
    job.handle(Submitted(), 0.0)
    job.handle(DeployAcked(0), 0.0)
    job.handle(TasksStarted(0), 0.0)
    return job


def restarted(job: JobLifecycle, now: float) -> None:
    """From a failure's ScheduleRestart to the new attempt running."""
    job.handle(RestartDelayElapsed(job.attempt), now)
    job.handle(AttemptPlanned(job.attempt), now)
    job.handle(DeployAcked(job.attempt), now)
    job.handle(TasksStarted(job.attempt), now)


# -- submit and deploy -----------------------------------------------------------------------------------


def test_submit_deploys_attempt_0_and_a_deploy_acked_starts_checkpoints_then_tasks():
    job = JobLifecycle("j", FIXED)
    assert job.handle(Submitted(), 0.0) == [MoveTo(JobState.DEPLOYING), Deploy(0)]
    assert job.handle(DeployAcked(0), 0.1) == [MoveTo(JobState.RUNNING), StartCheckpoints(0), StartTasks(0)]
    assert job.handle(TasksStarted(0), 0.2) == []  # no failure to measure a restart from
    assert job.state == JobState.RUNNING and job.attempt == 0 and job.restarts == 0


def test_a_second_submit_does_nothing():
    job = running()
    assert job.handle(Submitted(), 1.0) == []


def test_deploy_failed_restarts_after_the_delay():
    job = JobLifecycle("j", FIXED)
    job.handle(Submitted(), 0.0)
    assert job.handle(DeployFailed(0, "worker-1 refused"), 1.0) == [
        RecordFailure("deployment failed: worker-1 refused"),
        StopCheckpoints("deployment failed: worker-1 refused", failed=True),
        MoveTo(JobState.RESTARTING), CancelTasks(0), ScheduleRestart(0, 1.0, restart=1, of=2)]
    assert job.handle(RestartDelayElapsed(0), 2.0) == [PlanAttempt(1, 0.0, 2.0)]
    assert job.restarts == 1 and job.attempt == 1
    assert job.handle(AttemptPlanned(1), 2.5) == [UsePlan(1), MoveTo(JobState.DEPLOYING), Deploy(1)]
    assert job.handle(DeployAcked(1), 3.0) == [MoveTo(JobState.RUNNING), StartCheckpoints(1), StartTasks(1)]
    assert job.handle(TasksStarted(1), 3.5) == [RecordRestart(2.5)]


def test_deploy_failed_without_a_restart_strategy_fails_the_job():
    job = JobLifecycle("j", None)
    job.handle(Submitted(), 0.0)
    assert job.handle(DeployFailed(0, "boom"), 1.0) == [
        RecordFailure("deployment failed: boom"), StopCheckpoints("deployment failed: boom", failed=True),
        MoveTo(JobState.FAILED, "deployment failed: boom"), CancelTasks(0)]
    assert job.terminal


def test_a_late_deploy_ack_of_an_earlier_attempt_is_ignored():
    job = JobLifecycle("j", FIXED)
    job.handle(Submitted(), 0.0)
    job.handle(DeployFailed(0, "x"), 0.0)
    job.handle(RestartDelayElapsed(0), 1.0)
    job.handle(AttemptPlanned(1), 1.0)
    assert job.handle(DeployAcked(0), 1.1) == []
    assert job.handle(DeployAcked(1), 1.2)[0] == MoveTo(JobState.RUNNING)


# -- failures of a running job --------------------------------------------------------------------------------


def test_task_failed_cancels_the_attempt_and_schedules_a_restart():
    job = running()
    assert job.handle(TaskFailed(0, "task 1:0 failed: boom"), 5.0) == [
        RecordFailure("task 1:0 failed: boom"), StopCheckpoints("task 1:0 failed: boom", failed=True),
        MoveTo(JobState.RESTARTING), CancelTasks(0), ScheduleRestart(0, 1.0, restart=1, of=2)]


def test_worker_lost_is_a_failure_named_after_the_worker():
    job = running()
    cause = "worker w-2 lost: heartbeat timeout"
    assert job.handle(WorkerLost(0, "w-2", "heartbeat timeout"), 5.0) == [
        RecordFailure(cause), StopCheckpoints(cause, failed=True), MoveTo(JobState.RESTARTING), CancelTasks(0),
        ScheduleRestart(0, 1.0, restart=1, of=2)]


def test_exponential_strategy_delays_double_and_the_last_failure_fails_the_job():
    job = running(RestartStrategy("exponential", max_attempts=2, delay_s=0.5, max_delay_s=30.0, failure_window_s=None))
    assert job.handle(TaskFailed(0, "a"), 1.0)[-1] == ScheduleRestart(0, 0.5, restart=1, of=2)
    restarted(job, 2.0)
    assert job.handle(TaskFailed(1, "b"), 3.0)[-1] == ScheduleRestart(1, 1.0, restart=2, of=2)
    restarted(job, 4.0)
    assert job.handle(TaskFailed(2, "c"), 5.0) == [
        RecordFailure("c"), StopCheckpoints("c", failed=True),
        MoveTo(JobState.FAILED, "c (restart attempts exhausted)"), CancelTasks(2)]
    assert job.restarts == 2 and job.attempt == 2


def test_failures_during_a_restart_are_ignored():
    job = running()
    job.handle(TaskFailed(0, "first"), 1.0)
    assert job.handle(TaskFailed(0, "second task of the same attempt"), 1.1) == []
    assert job.handle(WorkerLost(0, "w-1", "gone"), 1.2) == []
    job.handle(RestartDelayElapsed(0), 2.0)
    assert job.handle(TaskFailed(0, "late, of the cancelled attempt"), 2.1) == []
    assert job.handle(DeployFailed(0, "late"), 2.2) == []
    assert job.state == JobState.RESTARTING and job.restarts == 1


def test_a_failure_of_the_new_attempt_while_it_deploys_is_counted():
    job = running()
    job.handle(TaskFailed(0, "first"), 1.0)
    job.handle(RestartDelayElapsed(0), 2.0)
    job.handle(AttemptPlanned(1), 2.0)
    assert job.handle(WorkerLost(1, "w-1", "gone"), 2.5) == [
        RecordFailure("worker w-1 lost: gone"), StopCheckpoints("worker w-1 lost: gone", failed=True),
        MoveTo(JobState.RESTARTING), CancelTasks(1), ScheduleRestart(1, 1.0, restart=2, of=2)]


def test_a_restart_delay_of_a_stale_attempt_or_after_a_cancel_does_nothing():
    job = running()
    job.handle(TaskFailed(0, "x"), 1.0)
    assert job.handle(RestartDelayElapsed(5), 2.0) == []
    job.handle(CancelAsked("by user"), 2.0)
    assert job.handle(RestartDelayElapsed(0), 2.1) == []


# -- restarts counted in a failure window ---------------------------------------------------------------------

WINDOWED = RestartStrategy("exponential", max_attempts=8, delay_s=1.0, max_delay_s=30.0, failure_window_s=300.0)


def fail_until(job: JobLifecycle, now: float, outage_ends: float) -> float:
    """Every attempt fails 2 s after it starts while the outage lasts; returns when one runs past it."""
    while True:
        out = job.handle(TaskFailed(job.attempt, "sink: connection refused"), now)
        if job.terminal:
            return now
        delay = out[-1]
        assert isinstance(delay, ScheduleRestart)
        now += delay.delay_s
        restarted(job, now)
        if now + 2.0 >= outage_ends:
            return now
        now += 2.0


def test_a_minute_long_outage_is_ridden_out_with_backoff_within_the_window():
    job = running(WINDOWED)
    now = fail_until(job, 10.0, outage_ends=70.0)
    assert job.state == JobState.RUNNING and job.restarts == 6, (job.state, job.restarts)
    assert job.restart_times == [11.0, 15.0, 21.0, 31.0, 49.0, 81.0]  # 1, 2, 4, 8, 16, 30 s after each failure
    assert now == 81.0


def test_failures_again_and_again_within_the_window_still_fail_the_job():
    job = running(WINDOWED)
    fail_until(job, 10.0, outage_ends=10_000.0)
    assert job.state == JobState.FAILED and job.restarts == 8


def test_restarts_older_than_the_window_no_longer_count_and_the_backoff_starts_again():
    job = running(RestartStrategy("exponential", max_attempts=2, delay_s=1.0, failure_window_s=60.0))
    assert job.handle(TaskFailed(0, "a"), 0.0)[-1] == ScheduleRestart(0, 1.0, restart=1, of=2)
    restarted(job, 1.0)
    assert job.handle(TaskFailed(1, "b"), 10.0)[-1] == ScheduleRestart(1, 2.0, restart=2, of=2)
    restarted(job, 12.0)
    # a third failure within 60 s of both restarts fails the job; 100 s later only the second one counts
    assert job.handle(TaskFailed(2, "c"), 65.0)[-1] == ScheduleRestart(2, 2.0, restart=2, of=2)
    restarted(job, 67.0)
    assert job.handle(TaskFailed(3, "d"), 200.0)[-1] == ScheduleRestart(3, 1.0, restart=1, of=2)
    assert job.restarts == 3


def test_without_a_window_every_restart_of_the_jobs_life_counts():
    job = running(RestartStrategy("fixed", max_attempts=1, delay_s=1.0, failure_window_s=None))
    job.handle(TaskFailed(0, "a"), 0.0)
    restarted(job, 1.0)
    assert job.handle(TaskFailed(1, "b"), 10_000.0) == [
        RecordFailure("b"), StopCheckpoints("b", failed=True),
        MoveTo(JobState.FAILED, "b (restart attempts exhausted)"), CancelTasks(1)]


# -- planning a restart -----------------------------------------------------------------------------------------


def test_plan_failing_for_slots_is_retried_until_slot_wait_then_counts_as_a_failed_restart():
    job = running()
    job.handle(TaskFailed(0, "x"), 1.0)
    assert job.handle(RestartDelayElapsed(0), 2.0) == [PlanAttempt(1, 0.0, 2.0)]
    assert job.handle(PlanFailed(1, "needs 4 slots, 2 free", retriable=True), 2.1) == [
        PlanAttempt(1, PLAN_RETRY_S, 2.0)]
    assert job.handle(PlanFailed(1, "needs 4 slots, 2 free", retriable=True), 12.0) == [
        RecordFailure("needs 4 slots, 2 free"), ScheduleRestart(1, 1.0, restart=2, of=2)]
    assert job.handle(RestartDelayElapsed(1), 13.0) == [PlanAttempt(2, 0.0, 13.0)]
    assert job.handle(PlanFailed(2, "cannot restore: corrupt", retriable=False), 13.1) == [
        RecordFailure("cannot restore: corrupt"),
        MoveTo(JobState.FAILED, "cannot restore: corrupt (restart attempts exhausted)")]


def test_a_missing_checkpoint_fails_the_job_at_once_without_another_restart():
    job = running()
    job.handle(TaskFailed(0, "worker lost"), 1.0)
    job.handle(RestartDelayElapsed(0), 2.0)
    assert job.handle(RestoreMissing(0, "late"), 2.1) == []  # fenced by attempt
    assert job.handle(RestoreMissing(1, "checkpoint 4 (/c/chk-4): missing"), 2.1) == [
        RecordFailure("checkpoint 4 (/c/chk-4): missing"),
        MoveTo(JobState.FAILED, "cannot restart: checkpoint 4 (/c/chk-4): missing")]
    assert job.handle(AttemptPlanned(1), 2.2) == []  # nothing deploys after


def test_restore_choice_takes_the_newest_checkpoint_the_store_or_the_record_holds():
    listed = [(3, "/s/chk-3"), (5, "/s/chk-5")]
    assert choose_restore(listed, (5, "/s/chk-5"), True, "", False, "/s") == RestoreChoice(("/s/chk-5", "/s/chk-3"))
    # the coordinator restarted with another --checkpoint-dir: the recorded path is still there, and newer
    assert choose_restore([], (7, "/old/chk-7"), True, "/sp", True, "/new") == RestoreChoice(("/old/chk-7", "/sp"))
    assert choose_restore(listed, (7, "/old/chk-7"), True, "", False, "/s").candidates[0] == "/old/chk-7"
    # a wiped store that was written to again: the newer listed checkpoint wins, the recorded one is gone
    assert choose_restore([(9, "/s/chk-9")], (7, "/s/chk-7"), False, "", False, "/s") == RestoreChoice(("/s/chk-9",))
    # never checkpointed, never restored: from scratch is exact
    assert choose_restore([], None, False, "", False, "/s") == RestoreChoice(())


def test_restore_choice_refuses_to_start_from_scratch_once_output_is_committed():
    choice = choose_restore([], (7, "/s/chk-7"), False, "", False, "/s")
    assert choice.candidates == () and "\n" not in choice.missing
    assert choice.missing.startswith("checkpoint 7 (/s/chk-7), the latest it completed: missing, and /s holds no")
    assert "not replaying its input over committed output" in choice.missing
    # the savepoint it was submitted with is gone as well: both are named
    both = choose_restore([], (7, "/s/chk-7"), False, "/sp/savepoint-1", False, "/s").missing
    assert "checkpoint 7" in both and "/sp/savepoint-1" in both
    # submitted with a savepoint that vanished before any checkpoint completed: its state must not be lost either
    assert "/sp/savepoint-1" in choose_restore([], None, False, "/sp/savepoint-1", False, "/s").missing


def test_a_plan_result_of_another_attempt_is_ignored():
    job = running()
    job.handle(TaskFailed(0, "x"), 1.0)
    job.handle(RestartDelayElapsed(0), 2.0)
    assert job.handle(AttemptPlanned(0), 2.1) == []
    assert job.handle(PlanFailed(7, "x", retriable=True), 2.1) == []


def test_recovery_restarts_from_the_dead_coordinators_state_without_counting():
    job = JobLifecycle("j", FIXED, state=JobState.RUNNING, attempt=3, restarts=1)
    assert job.handle(Recovered(), 10.0) == [RecordFailure("coordinator failover"), Adopt(JobState.RESTARTING),
                                             Persist(), PlanAttempt(4, 0.0, 10.0)]
    assert job.restarts == 1
    job.handle(AttemptPlanned(4), 10.5)
    job.handle(DeployAcked(4), 11.0)
    assert job.handle(TasksStarted(4), 11.5) == []  # no failure of ours to measure from


def test_an_instruction_that_raised_fails_the_job():
    job = running()
    job.handle(TaskFailed(0, "x"), 1.0)
    assert job.handle(ExecutionFailed("PlanAttempt failed: KeyError: 'w'"), 2.0) == [
        StopCheckpoints("PlanAttempt failed: KeyError: 'w'", failed=True),
        MoveTo(JobState.FAILED, "PlanAttempt failed: KeyError: 'w'"), CancelTasks(0)]


# -- the end of a bounded job ---------------------------------------------------------------------------------------


def test_all_tasks_ended_asks_for_one_final_checkpoint_and_again_after_aborts_with_backoff():
    job = running()
    assert job.handle(AllTasksEnded(0), 1.0) == [RequestFinalCheckpoint(0, 0.0)]
    assert job.handle(AllTasksEnded(0), 1.0) == []
    assert job.handle(FinalCheckpointDone(0, False, "declined"), 1.1) == [RequestFinalCheckpoint(0, 0.05)]
    assert job.handle(FinalCheckpointDone(0, False, "declined"), 1.2) == [RequestFinalCheckpoint(0, 0.1)]
    assert job.handle(FinalCheckpointDone(0, False, "job failed"), 1.3) == []  # the failover takes over
    assert job.handle(FinalCheckpointDone(0, True), 1.4) == []


def test_all_tasks_finished_finishes_with_the_last_checkpoint():
    job = running()
    assert job.handle(AllTasksFinished(0), 2.0) == [
        MoveTo(JobState.FINISHING), RecordFinalCheckpoint(), StopCheckpoints("job finished", failed=False),
        MoveTo(JobState.FINISHED)]
    assert job.terminal


def test_a_finished_job_ignores_late_failures_cancels_and_rescales():
    job = running()
    job.handle(AllTasksFinished(0), 2.0)
    assert job.handle(TaskFailed(0, "late"), 2.1) == []
    assert job.handle(WorkerLost(0, "w-1", "gone"), 2.2) == []
    assert job.handle(CancelAsked("by user"), 2.3) == []
    assert job.handle(RescaleAsked(finishing=False), 2.4) == [
        AnswerRescale("job j is FINISHED, not RUNNING: nothing to rescale", "JobNotRunning")]
    assert job.state == JobState.FINISHED


def test_a_final_checkpoint_after_a_restart_is_asked_again_from_the_first_pause():
    job = running()
    job.handle(AllTasksEnded(0), 1.0)
    job.handle(FinalCheckpointDone(0, False, "declined"), 1.1)
    job.handle(TaskFailed(0, "x"), 1.2)
    restarted(job, 3.0)
    assert job.handle(FinalCheckpointDone(0, False, "declined"), 3.1) == []  # the old attempt's
    assert job.handle(AllTasksEnded(1), 4.0) == [RequestFinalCheckpoint(1, 0.0)]
    assert job.handle(FinalCheckpointDone(1, False, "declined"), 4.1) == [RequestFinalCheckpoint(1, 0.05)]


def test_checkpoint_completed_persists_the_record_whichever_attempt_wrote_it():
    job = running()
    assert job.handle(CheckpointCompleted(0, 4), 1.0) == [Persist()]
    job.handle(TaskFailed(0, "x"), 1.1)
    # attempt 0's `_metadata` write landed after the restart began: its archived entry is COMPLETED, recorded
    assert job.handle(CheckpointCompleted(0, 5), 1.2) == [Persist()]


def test_a_checkpoint_completed_after_the_job_finished_is_recorded():
    """Issue 30: the last periodic checkpoint completes once every task finished, after the record was written
    FINISHED; a coordinator that read that record showed checkpoints_completed one less than the live status."""
    job = running()
    job.handle(AllTasksEnded(0), 1.0)
    assert job.handle(AllTasksFinished(0), 2.0) == [
        MoveTo(JobState.FINISHING), RecordFinalCheckpoint(), StopCheckpoints("job finished", failed=False),
        MoveTo(JobState.FINISHED)]
    assert job.handle(CheckpointCompleted(0, 30), 2.1) == [Persist()]
    job.handle(LeaseLost(), 2.2)
    assert job.handle(CheckpointCompleted(0, 31), 2.3) == []  # another leader may write the record now


# -- cancel and lease -----------------------------------------------------------------------------------------------


def test_cancel_of_a_running_job():
    job = running()
    assert job.handle(CancelAsked("cancelled by user"), 1.0) == [
        MoveTo(JobState.CANCELLED, "cancelled by user"), StopCheckpoints("cancelled by user", failed=True),
        CancelTasks(0)]
    assert job.handle(CancelAsked("again"), 1.1) == []


def test_cancel_while_restarting_cancels_the_new_attempt_number():
    job = running()
    job.handle(TaskFailed(0, "x"), 1.0)
    job.handle(RestartDelayElapsed(0), 2.0)
    assert job.handle(CancelAsked("by user"), 2.1) == [
        MoveTo(JobState.CANCELLED, "by user"), StopCheckpoints("by user", failed=True), CancelTasks(1)]
    assert job.handle(AttemptPlanned(1), 2.2) == []


def test_lease_lost_stops_checkpoints_and_then_nothing_is_touched():
    job = running()
    assert job.handle(LeaseLost(), 1.0) == [StopCheckpoints("leadership lost", failed=False)]
    assert job.handle(TaskFailed(0, "x"), 1.1) == []
    assert job.handle(CancelAsked("coordinator shutting down"), 1.2) == []
    assert job.state == JobState.RUNNING  # the record is the next leader's to restart


def test_lease_lost_during_a_rescale_answers_it():
    job = running()
    job.handle(RescaleAsked(finishing=False), 1.0)
    assert job.handle(LeaseLost(), 1.1) == [AnswerRescale("the coordinator lost its lease", "NotLeader"),
                                            StopCheckpoints("leadership lost", failed=False)]


# -- rescale -------------------------------------------------------------------------------------------------------


def test_rescale_checkpoints_then_stops_and_redeploys_without_counting_a_restart():
    job = running()
    assert job.handle(RescaleAsked(finishing=False), 1.0) == [TakeRescaleCheckpoint(0)]
    assert job.handle(RescaleCheckpointDone(0), 2.0) == [
        CommitRescale(), StopCheckpoints("rescale", failed=False), MoveTo(JobState.RESTARTING), CancelTasks(0),
        StepReached("rescale:stopped"), PlanAttempt(1, 0.0, 2.0)]
    assert job.handle(AttemptPlanned(1), 2.2) == [UsePlan(1), MoveTo(JobState.DEPLOYING), Deploy(1)]
    assert job.handle(DeployAcked(1), 2.3) == [MoveTo(JobState.RUNNING), StartCheckpoints(1), StartTasks(1)]
    assert job.handle(TasksStarted(1), 2.5) == [AnswerRescale(downtime_s=0.5)]
    assert job.restarts == 0 and job.attempt == 1


def test_scale_up_plans_at_its_target_while_waiting_for_slots_then_falls_back():
    job = running()
    job.handle(RescaleAsked(finishing=False, scale_up=True), 1.0)
    assert job.handle(RescaleCheckpointDone(0), 2.0)[-1] == PlanAttempt(1, 0.0, 2.0, scale_up=True)
    assert job.handle(PlanFailed(1, "slots", retriable=True), 2.1) == [
        PlanAttempt(1, PLAN_RETRY_S, 2.0, scale_up=True)]
    assert job.handle(PlanFailed(1, "slots", retriable=True), 20.0) == [
        RecordFailure("slots"), ScheduleRestart(1, 1.0, restart=1, of=2)]
    assert job.handle(RestartDelayElapsed(1), 21.0) == [PlanAttempt(2, 0.0, 21.0)]  # at the usual plan
    job.handle(AttemptPlanned(2), 21.0)
    job.handle(DeployAcked(2), 21.0)
    assert job.handle(TasksStarted(2), 22.0) == [AnswerRescale(downtime_s=20.0)]


def test_rescale_refused_when_not_running_or_finishing_or_already_rescaling():
    job = JobLifecycle("j", FIXED)
    job.handle(Submitted(), 0.0)
    assert job.handle(RescaleAsked(finishing=False), 0.1) == [
        AnswerRescale("job j is DEPLOYING, not RUNNING: nothing to rescale", "JobNotRunning")]
    job = running()
    assert job.handle(RescaleAsked(finishing=True), 1.0) == [
        AnswerRescale("job j is finishing, not RUNNING: nothing to rescale", "JobNotRunning")]
    job.handle(RescaleAsked(finishing=False), 1.0)
    assert job.handle(RescaleAsked(finishing=False), 1.1) == [
        AnswerRescale("job j is being rescaled already", "JobNotRunning")]


def test_rescale_with_some_tasks_at_their_end_is_taken_but_not_once_every_task_ended():
    """Some finished tasks (a rules source that ended) are recorded by the checkpoint and kept finished by the
    restore; once every task ended the final checkpoint is due and the job is finishing."""
    job = running()
    assert job.handle(RescaleAsked(finishing=False), 1.0) == [TakeRescaleCheckpoint(0)]
    job = running()
    job.handle(AllTasksEnded(0), 1.0)
    assert job.handle(RescaleAsked(finishing=False), 1.1) == [
        AnswerRescale("job j is finishing, not RUNNING: nothing to rescale", "JobNotRunning")]


def test_rescale_whose_checkpoint_failed_is_refused_and_the_job_runs_on():
    job = running()
    job.handle(RescaleAsked(finishing=False), 1.0)
    assert job.handle(RescaleCheckpointDone(0, "checkpoint 1 did not complete", "RescaleCheckpointFailed"), 2.0) == [
        AnswerRescale("checkpoint 1 did not complete", "RescaleCheckpointFailed")]
    assert job.state == JobState.RUNNING and job.attempt == 0
    assert job.handle(RescaleAsked(finishing=False), 3.0) == [TakeRescaleCheckpoint(0)]


def test_failure_while_the_rescale_checkpoint_is_taken_restarts_and_the_rescale_is_refused_after():
    job = running()
    job.handle(RescaleAsked(finishing=False), 1.0)
    assert job.handle(TaskFailed(0, "boom"), 1.5) == [
        RecordFailure("boom"), StopCheckpoints("boom", failed=True), MoveTo(JobState.RESTARTING), CancelTasks(0),
        ScheduleRestart(0, 1.0, restart=1, of=2)]
    # the stopped runner aborted the rescale's checkpoint: the shell reports it
    assert job.handle(RescaleCheckpointDone(0, "checkpoint 1 did not complete (boom)", "RescaleCheckpointFailed"),
                      1.6) == [AnswerRescale("checkpoint 1 did not complete (boom)", "RescaleCheckpointFailed")]


def test_job_restarted_before_the_rescale_checkpoint_reported_is_not_rescaled():
    job = running()
    job.handle(RescaleAsked(finishing=False), 1.0)
    job.handle(TaskFailed(0, "boom"), 1.5)
    assert job.handle(RescaleCheckpointDone(0), 1.6) == [
        AnswerRescale("job j is RESTARTING (attempt 0) after the checkpoint: not rescaled", "JobNotRunning")]


def test_failure_of_the_rescaled_attempt_while_it_deploys_fails_the_rescale_and_restarts_counted():
    job = running()
    job.handle(RescaleAsked(finishing=False), 1.0)
    job.handle(RescaleCheckpointDone(0), 2.0)
    job.handle(AttemptPlanned(1), 2.1)
    assert job.handle(DeployFailed(1, "worker-2 gone"), 2.2) == [
        RecordFailure("deployment failed: worker-2 gone"),
        StopCheckpoints("deployment failed: worker-2 gone", failed=True), MoveTo(JobState.RESTARTING),
        AnswerRescale("job j stopped for the rescale but is RESTARTING now", "RescaleFailed"), CancelTasks(1),
        ScheduleRestart(1, 1.0, restart=1, of=2)]


def test_rescale_whose_restart_runs_out_of_attempts_fails_with_the_cause():
    job = running(RestartStrategy("none"))
    job.handle(RescaleAsked(finishing=False), 1.0)
    job.handle(RescaleCheckpointDone(0), 2.0)
    assert job.handle(PlanFailed(1, "needs 6 slots", retriable=False), 3.0) == [
        RecordFailure("needs 6 slots"), MoveTo(JobState.FAILED, "needs 6 slots (restart attempts exhausted)"),
        AnswerRescale("job j stopped for the rescale but is FAILED now: needs 6 slots (restart attempts exhausted)",
                      "RescaleFailed")]


def test_cancel_during_a_rescale_answers_it():
    job = running()
    job.handle(RescaleAsked(finishing=False), 1.0)
    assert job.handle(CancelAsked("by user"), 1.5) == [
        MoveTo(JobState.CANCELLED, "by user"), AnswerRescale("job j is CANCELLED now: not rescaled", "JobNotRunning"),
        StopCheckpoints("by user", failed=True), CancelTasks(0)]


# -- the default restart strategy against outages and real faults ---------------------------------------------------


def ride_out(healthy_after_s: float, strategy: RestartStrategy, *, horizon_s: float = 900.0) -> tuple[str, float]:
    """Drive a job with `strategy` through a dependency that is down from t=0 until `healthy_after_s`: every
    attempt deployed meanwhile fails 0.5 s after it started (the worst case for the budget: failures come as
    fast as restarts). Returns the job's state once it ran 10 s healthy or ended, and the time then."""
    job = running(strategy)
    now = 0.0
    pending = job.handle(TaskFailed(0, "state store unreachable"), now)
    while not job.terminal:
        follow: list = []
        for ins in pending:
            if isinstance(ins, ScheduleRestart):
                now += ins.delay_s
                follow += job.handle(RestartDelayElapsed(ins.attempt), now)
            elif isinstance(ins, PlanAttempt):
                follow += job.handle(AttemptPlanned(ins.attempt), now)
            elif isinstance(ins, Deploy):
                now += 0.2
                follow += job.handle(DeployAcked(ins.attempt), now)
            elif isinstance(ins, StartTasks):
                follow += job.handle(TasksStarted(ins.attempt), now)
                if now >= healthy_after_s:
                    return job.state, now
                now += 0.5
                follow += job.handle(TaskFailed(ins.attempt, "state store unreachable"), now)
        pending = follow
        assert now < horizon_s, "the job neither ran nor ended"
    return job.state, now


def test_the_default_strategy_rides_out_a_minute_long_outage_and_a_20s_partition():
    assert ride_out(60.0, RestartStrategy()) == (JobState.RUNNING, pytest.approx(61.0 + 6 * 0.7 + 0.2, abs=1.0))
    assert ride_out(20.0, RestartStrategy())[0] == JobState.RUNNING
    # what the default was before: three restarts 1 s apart are spent in seconds
    assert ride_out(60.0, RestartStrategy("fixed", max_attempts=3, failure_window_s=None))[0] == JobState.FAILED


def test_the_default_strategy_still_fails_a_job_that_fails_again_and_again():
    state, at = ride_out(float("inf"), RestartStrategy())
    assert state == JobState.FAILED and 100 < at < 150, at


# -- properties ------------------------------------------------------------------------------------------------------

ATTEMPTS = st.integers(min_value=0, max_value=4)
STIMULI = st.one_of(
    st.just(Submitted()), st.just(Recovered()), st.builds(DeployAcked, ATTEMPTS), st.builds(TasksStarted, ATTEMPTS),
    st.builds(DeployFailed, ATTEMPTS, st.just("e")), st.builds(TaskFailed, ATTEMPTS, st.just("t")),
    st.builds(WorkerLost, ATTEMPTS, st.just("w"), st.just("x")), st.builds(AllTasksEnded, ATTEMPTS),
    st.builds(FinalCheckpointDone, ATTEMPTS, st.booleans(), st.sampled_from(["", "job failed", "declined"])),
    st.builds(AllTasksFinished, ATTEMPTS), st.builds(CheckpointCompleted, ATTEMPTS, st.just(1)),
    st.builds(RescaleAsked, st.booleans(), st.booleans()),
    st.builds(RescaleCheckpointDone, ATTEMPTS, st.sampled_from(["", "refused"])),
    st.builds(RestartDelayElapsed, ATTEMPTS), st.builds(AttemptPlanned, ATTEMPTS),
    st.builds(PlanFailed, ATTEMPTS, st.just("p"), st.booleans()), st.builds(RestoreMissing, ATTEMPTS, st.just("m")),
    st.builds(CancelAsked, st.just("c")),
    st.builds(ExecutionFailed, st.just("x")), st.just(LeaseLost()))


@settings(max_examples=300, deadline=None)
@given(st.lists(STIMULI, max_size=40), st.sampled_from([FIXED, RestartStrategy("none"),
                                                        RestartStrategy("exponential", max_attempts=5),
                                                        RestartStrategy("fixed", max_attempts=2,
                                                                        failure_window_s=3.0)]))
def test_no_sequence_deploys_twice_at_once_or_after_the_end_or_moves_illegally(stimuli, strategy):
    job = JobLifecycle("j", strategy)
    state = job.state
    deploying: int | None = None  # the attempt whose Deploy is out and not yet answered
    ended = False
    rescale_answers = 0
    rescale_asks = 0
    for now, stimulus in enumerate(stimuli):
        if isinstance(stimulus, RescaleAsked):
            rescale_asks += 1
        before = job.attempt
        out = job.handle(stimulus, float(now))
        if ended:  # an ended job does nothing more (it answers a rescale: no; it records a late checkpoint)
            assert all((isinstance(i, AnswerRescale) and i.error) or isinstance(i, Persist) for i in out), (
                stimulus, out)
            rescale_answers += sum(isinstance(i, AnswerRescale) for i in out)
            continue
        for ins in out:
            if isinstance(ins, MoveTo):
                assert ins.state in TRANSITIONS[state], (state, ins, stimulus)
                state = ins.state
                ended = state in (JobState.FINISHED, JobState.FAILED, JobState.CANCELLED)
                if state != JobState.DEPLOYING:
                    deploying = None
            elif isinstance(ins, Adopt):
                state = ins.state
            elif isinstance(ins, Deploy):
                assert deploying is None and not ended, (stimulus, out)
                assert ins.attempt == job.attempt >= before
                deploying = ins.attempt
            elif isinstance(ins, AnswerRescale):
                rescale_answers += 1
        assert job.state == state or job.fenced
        if strategy.failure_window_s is None:
            assert job.restarts <= strategy.max_attempts or strategy.kind == "none"
    # every ask is answered once at most (the shell's own refusal of a second concurrent ask aside)
    assert rescale_answers <= rescale_asks


def test_a_failure_no_restart_can_repair_fails_the_job_at_once():
    job = running(RestartStrategy())  # the default: eight restarts in five minutes
    cause = "task 1:0 failed: OutputGone: pre-committed file .part is gone"
    assert job.handle(TaskFailed(0, cause, fatal=True), 1.0) == [
        RecordFailure(cause), StopCheckpoints(cause, failed=True),
        MoveTo(JobState.FAILED, f"{cause} (not restarted: a restart cannot repair it)"), CancelTasks(0)]


def test_a_fatal_cause_reported_after_a_secondary_failure_fails_the_job_before_its_restart():
    """A consumer's failure (its upstream went away) reached the coordinator first and a restart was scheduled;
    the upstream task's own cause, which no restart repairs, arrives within the restart delay: the job fails
    now instead of restarting into it (a busy CI run restarted an unpicklable value's job once)."""
    job = running(RestartStrategy())
    out = job.handle(TaskFailed(0, "task 2:1 failed: ConnectionLost: upstream closed"), 1.0)
    assert job.state == JobState.RESTARTING and any(isinstance(i, ScheduleRestart) for i in out)
    cause = "task 1:0 failed: UnpicklableValue: lock_it: a value of type _thread.lock cannot be sent"
    assert job.handle(TaskFailed(0, cause, fatal=True), 1.1) == [
        RecordFailure(cause), MoveTo(JobState.FAILED, f"{cause} (not restarted: a restart cannot repair it)")]
    assert job.handle(RestartDelayElapsed(0), 2.0) == [] and job.restarts == 0 and job.attempt == 0
    # a cause that a restart may repair, arriving the same way, leaves the restart as it was
    job = running(RestartStrategy())
    job.handle(TaskFailed(0, "task 2:1 failed: ConnectionLost: upstream closed"), 1.0)
    assert job.handle(TaskFailed(0, "task 1:0 failed: ValueError: bad record"), 1.1) == []
    assert job.state == JobState.RESTARTING


# -- a step begun by a coordinator that died (issue 31) -------------------------------------------------------------


def test_a_job_an_upgrade_replaced_is_cancelled_not_recovered():
    """The new version's record was written before the leader died: the old version's record still says RUNNING
    (or whatever it was), and the new leader finishes the upgrade: no restart, no tasks to stop (they went with
    the previous coordinator)."""
    for state in (JobState.RUNNING, JobState.RESTARTING, JobState.DEPLOYING):
        job = JobLifecycle("j", FIXED, state=state, attempt=2)
        assert job.handle(Recovered(superseded_by="job-new"), 10.0) == [
            MoveTo(JobState.CANCELLED, "upgraded to job-new (the upgrade was finished by a new leader after a "
                                       "coordinator failover)")]
        assert job.terminal and job.attempt == 2 and job.handle(Recovered(), 11.0) == []


def test_the_new_version_of_an_upgrade_is_recovered_from_created_like_any_job():
    job = JobLifecycle("j", FIXED, state=JobState.CREATED)
    assert job.handle(Recovered(), 10.0) == [RecordFailure("coordinator failover"), Adopt(JobState.RESTARTING),
                                             Persist(), PlanAttempt(1, 0.0, 10.0)]
    assert job.handle(AttemptPlanned(1), 10.5) == [UsePlan(1), MoveTo(JobState.DEPLOYING), Deploy(1)]
    assert job.restarts == 0


def test_a_rescale_whose_leader_died_is_carried_on_as_the_record_says():
    """Before `RescaleCheckpointDone` the record holds the old parallelism and RUNNING: a new leader recovers
    the job as it ran. From `CommitRescale` the record that says RESTARTING holds the new one (StepReached marks
    the point): a new leader recovers it at the new parallelism, as a recovery (not a restart)."""
    job = running()
    job.handle(RescaleAsked(finishing=False), 1.0)
    out = job.handle(RescaleCheckpointDone(0), 2.0)
    assert out.index(CommitRescale()) < out.index(MoveTo(JobState.RESTARTING)) < out.index(
        StepReached("rescale:stopped")) < out.index(PlanAttempt(1, 0.0, 2.0))
    successor = JobLifecycle("j", FIXED, state=JobState.RESTARTING, attempt=1)
    assert successor.handle(Recovered(), 5.0)[-1] == PlanAttempt(2, 0.0, 5.0)
    assert successor.restarts == 0
