"""The lifecycle of one job, as a pure state machine.

`JobLifecycle.handle(stimulus, now)` takes what happened (a frozen dataclass:
submitted, deploy acknowledged or failed, a task or worker failed, every task
ended or finished, a rescale asked, the lease lost, a cancel, a restart delay
elapsed...) and returns the instructions for the shell
(coordinator/job_manager.py) to carry out: move the record to a state, deploy
or cancel an attempt's tasks, start or stop its checkpoints, schedule a
restart, answer a rescale. It does no I/O and never reads the clock, in the
manner of dask's `WorkerState.handle_stimulus` and of the checkpoint
coordinator (coordinator/checkpointing.py), so every interleaving is a fast
unit test (tests/unit/test_job_lifecycle.py).

    CREATED -> DEPLOYING -> RUNNING -> FINISHING -> FINISHED
                  |  ^         |
                  v  |         v                       (a failure, a restart left: wait the
               RESTARTING <----+                        strategy's delay, plan, deploy)
    any non-terminal state -> FAILED (no restart left) | CANCELLED (by the user)

Attempts fence stimuli: a stimulus names the attempt it is about, and one
about an earlier attempt (a late failure of the tasks a restart just
cancelled, a deploy that was overtaken) changes nothing. Once the job is
terminal, or once the coordinator lost its lease (`LeaseLost`: someone else
may lead and will restart the job), every stimulus is ignored.

RESTARTING has three phases: waiting out the restart delay (`ScheduleRestart`
-> `RestartDelayElapsed`), planning the next attempt (`PlanAttempt` ->
`AttemptPlanned` | `PlanFailed`, retried every `PLAN_RETRY_S` while slots are
missing, up to the strategy's `slot_wait_s`), then DEPLOYING.

Which checkpoint a restart restores is decided here too (`choose_restore`): the
newest completed one the store lists or the job's record names, and never
none once a checkpoint completed: sinks have committed its output, so a
restart from scratch would write it again. When the store no longer holds
any (a deleted directory, a wiped or expired bucket, another
`--checkpoint-dir`) and the recorded path is gone too, the shell reports
`RestoreMissing` and the job fails at once with one line naming the missing
checkpoint; no restart is spent, as none can bring it back.

A rescale (`RescaleAsked`, also a scale-up decided by coordinator/autoscale.py)
takes a checkpoint first (`TakeRescaleCheckpoint`); only once it completed is
the attempt stopped and the next one planned at the new parallelism, through
the same restart path but not counted as a restart. One answer
(`AnswerRescale`) ends every rescale: refused before anything stopped, done
once the new attempt's tasks started, or failed when the job failed, was
cancelled or had to restart on the way. A job some of whose tasks reached
their end is rescaled like any other (the checkpoint records them, and the
restore keeps fully finished operators finished); one all of whose tasks did
is finishing, and a rescale is refused.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from coordinator.restarts import RestartStrategy
from runtime.graph.enums import JobState

PLAN_RETRY_S = 0.2  # between tries to plan a restart while too few slots are free
FINAL_PAUSE_FIRST_S = 0.05  # before asking again for a final checkpoint that aborted; doubles up to the max
FINAL_PAUSE_MAX_S = 2.0  # a final checkpoint that fails at once (full disk) must not spin the loop
TERMINAL = frozenset({JobState.FINISHED, JobState.FAILED, JobState.CANCELLED})


# -- stimuli ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Submitted:
    """A new job, planned (with the checkpoint it restores, if any): deploy attempt 0."""


@dataclass(frozen=True)
class Recovered:
    """A job the previous coordinator left unfinished: restart it as a new attempt (not counted); or, when an
    upgrade's new version was recorded already (`superseded_by`), finish that upgrade: the job is cancelled."""

    superseded_by: str = ""


@dataclass(frozen=True)
class DeployAcked:
    attempt: int  # every involved worker accepted the plan


@dataclass(frozen=True)
class TasksStarted:
    attempt: int  # every involved worker started the attempt's tasks


@dataclass(frozen=True)
class DeployFailed:
    attempt: int
    error: str


@dataclass(frozen=True)
class TaskFailed:
    """A task raised, a worker reported a job error, or too many checkpoints failed."""

    attempt: int
    cause: str
    fatal: bool = False  # a restart cannot repair it (output a restored checkpoint needs is gone): no restart


@dataclass(frozen=True)
class WorkerLost:
    """A worker hosting tasks of the attempt stopped heartbeating or lost its link."""

    attempt: int
    worker_id: str
    why: str


@dataclass(frozen=True)
class AllTasksEnded:
    attempt: int  # every task reached the end of its input (or finished): a final checkpoint is due


@dataclass(frozen=True)
class FinalCheckpointDone:
    attempt: int
    completed: bool
    reason: str = ""  # why it aborted; "job failed": too many checkpoints failed, the failover takes over


@dataclass(frozen=True)
class AllTasksFinished:
    attempt: int  # every task finished: its last checkpoint's commit is published


@dataclass(frozen=True)
class CheckpointCompleted:
    attempt: int
    checkpoint_id: int


@dataclass(frozen=True)
class RescaleAsked:
    """`sluice rescale`, or a scale-up back towards the ask (`scale_up`: plan at the shell's target)."""

    # every task reached the end of its input (a final checkpoint is due): the job is finishing, not rescaled.
    # Some tasks at their end do not stop a rescale: the restore keeps finished operators finished
    # (runtime/checkpointing/restore_plan.py), as Flink's FLIP-147 does.
    finishing: bool
    scale_up: bool = False


@dataclass(frozen=True)
class RescaleCheckpointDone:
    attempt: int
    error: str = ""  # empty: the checkpoint completed and the new plan can restore it
    error_type: str = ""


@dataclass(frozen=True)
class RestartDelayElapsed:
    attempt: int


@dataclass(frozen=True)
class AttemptPlanned:
    attempt: int  # the shell holds the plan, with the checkpoint it restores


@dataclass(frozen=True)
class PlanFailed:
    attempt: int
    error: str
    retriable: bool  # too few slots (try again until slot_wait_s), not a checkpoint that cannot be restored


@dataclass(frozen=True)
class RestoreMissing:
    """The job's committed output needs a checkpoint that is gone (`choose_restore`): it must not run."""

    attempt: int
    what: str  # one line: which checkpoint, where, and that the store holds no other


@dataclass(frozen=True)
class CancelAsked:
    why: str


@dataclass(frozen=True)
class ExecutionFailed:
    """Carrying out an instruction raised something unforeseen: the job fails rather than hang."""

    error: str


@dataclass(frozen=True)
class LeaseLost:
    """Another coordinator may lead: touch nothing of the job any more, persist nothing."""


Stimulus = (Submitted | Recovered | DeployAcked | TasksStarted | DeployFailed | TaskFailed | WorkerLost
            | AllTasksEnded | FinalCheckpointDone | AllTasksFinished | CheckpointCompleted | RescaleAsked
            | RescaleCheckpointDone | RestartDelayElapsed | AttemptPlanned | PlanFailed | RestoreMissing | CancelAsked
            | ExecutionFailed | LeaseLost)


# -- instructions ----------------------------------------------------------------------------


@dataclass(frozen=True)
class MoveTo:
    """Move the job record (its transition table is coordinator/jobs.py); a terminal state ends the job."""

    state: str
    error: str = ""


@dataclass(frozen=True)
class Adopt:
    """Set the record's state without a transition: the state it had was a dead coordinator's."""

    state: str


@dataclass(frozen=True)
class Persist:
    pass


@dataclass(frozen=True)
class RecordFailure:
    cause: str  # appended to the job's failures


@dataclass(frozen=True)
class Deploy:
    attempt: int  # send the attempt's plan (and the checkpoint it restores) to its workers


@dataclass(frozen=True)
class StartTasks:
    attempt: int


@dataclass(frozen=True)
class CancelTasks:
    attempt: int  # fenced by attempt: a worker already running a later one keeps it


@dataclass(frozen=True)
class StartCheckpoints:
    attempt: int


@dataclass(frozen=True)
class StopCheckpoints:
    reason: str
    failed: bool  # abort the in-flight checkpoint as failed (a task failure), or just end the runner


@dataclass(frozen=True)
class RecordFinalCheckpoint:
    pass  # the job ends with the last completed checkpoint: note its id before the runner stops


@dataclass(frozen=True)
class RequestFinalCheckpoint:
    attempt: int
    after_s: float  # then report FinalCheckpointDone


@dataclass(frozen=True)
class ScheduleRestart:
    attempt: int  # the attempt that failed
    delay_s: float  # then report RestartDelayElapsed(attempt)
    restart: int  # which restart this is (1-based), for the log
    of: int  # restarts the strategy allows


@dataclass(frozen=True)
class PlanAttempt:
    """Plan `attempt` for the workers registered now and attach the latest intact checkpoint, after `after_s`.

    `waiting_since` is when the restart began to wait for slots (the shell's scale-down waits from then);
    `scale_up`: try the shell's scale-up target rather than the ask."""

    attempt: int
    after_s: float
    waiting_since: float
    scale_up: bool = False


@dataclass(frozen=True)
class UsePlan:
    attempt: int  # the planned attempt is the job's now


@dataclass(frozen=True)
class RecordRestart:
    seconds: float  # failure detected -> the new attempt's tasks started


@dataclass(frozen=True)
class TakeRescaleCheckpoint:
    attempt: int  # try the new plan, checkpoint, check it restores; then report RescaleCheckpointDone


@dataclass(frozen=True)
class CommitRescale:
    pass  # the job's configuration becomes the rescale's


@dataclass(frozen=True)
class StepReached:
    """A point of a rescale a new leader carries on from (the record as of here); a test's launcher may stop
    the coordinator here (tests/support/faulty_coordinator.py). Nothing else to do."""

    step: str


@dataclass(frozen=True)
class AnswerRescale:
    error: str = ""  # empty: rescaled, down `downtime_s`
    error_type: str = ""
    downtime_s: float = 0.0


Instruction = (MoveTo | Adopt | Persist | RecordFailure | Deploy | StartTasks | CancelTasks | StartCheckpoints
               | StopCheckpoints | RecordFinalCheckpoint | RequestFinalCheckpoint | ScheduleRestart | PlanAttempt
               | UsePlan | RecordRestart | TakeRescaleCheckpoint | CommitRescale | StepReached | AnswerRescale)


# -- which checkpoint a restart restores ---------------------------------------------------------


@dataclass(frozen=True)
class RestoreChoice:
    candidates: tuple[str, ...]  # paths, newest first: the shell restores the first intact one; () = from scratch
    missing: str = ""  # not empty: output is committed but no checkpoint is left: the job must not run


def choose_restore(listed: Sequence[tuple[int, str]], recorded: tuple[int, str] | None, recorded_present: bool,
                   submitted_with: str, submitted_present: bool, store: str) -> RestoreChoice:
    """The checkpoints a restart may restore, newest first, from what the shell found.

    `listed`: the completed checkpoints the store holds (id, path); `recorded`: the latest one the job's record
    says completed, and whether its `_metadata` is still there (it may live outside the store: the coordinator
    was restarted with another --checkpoint-dir); `submitted_with`: the checkpoint or savepoint the job was
    submitted to restore. Starting from scratch is chosen only while nothing was ever checkpointed or restored:
    a completed checkpoint means its output is committed, and replaying the input over it would double it."""
    by_id = {n: path for n, path in listed}
    if recorded is not None and recorded_present and recorded[0] not in by_id:
        by_id[recorded[0]] = recorded[1]
    candidates = [by_id[n] for n in sorted(by_id, reverse=True)]
    if submitted_with and submitted_present:
        candidates.append(submitted_with)
    if candidates:
        return RestoreChoice(tuple(candidates))
    gone = []
    if recorded is not None:
        gone.append(f"checkpoint {recorded[0]} ({recorded[1]}), the latest it completed")
    if submitted_with:
        gone.append(f"the checkpoint it was submitted to restore ({submitted_with})")
    if not gone:
        return RestoreChoice(())  # nothing checkpointed, nothing committed: from scratch is exact
    return RestoreChoice((), f"{' and '.join(gone)}: missing, and {store} holds no other completed checkpoint "
                             "of the job; not replaying its input over committed output")


# -- the machine -------------------------------------------------------------------------------


@dataclass
class _Rescale:
    scale_up: bool
    stopped_at: float | None = None  # None while its checkpoint is taken; then the attempt was stopped


class JobLifecycle:
    def __init__(self, job_id: str, strategy: RestartStrategy | None, *, state: str = JobState.CREATED,
                 attempt: int = 0, restarts: int = 0) -> None:
        self.job_id = job_id
        self.strategy = strategy  # None: never restart
        self.state = state
        self.attempt = attempt
        self.restarts = restarts
        self.restart_times: list[float] = []  # when this coordinator restarted the job (failure_window_s)
        self.fenced = False  # the lease is lost
        self.handled = 0  # stimuli handled: a recovery is the first one of an adopted job, or none
        self.phase = ""  # while RESTARTING: "delay" or "planning"
        self.failed_at: float | None = None  # when the failure that the current restart recovers from came in
        self.counted = True  # whether the next attempt counts as a restart (not for a rescale or a recovery)
        self.waiting_since = 0.0
        self.scale_up = False  # plan the restart at the shell's scale-up target (until it fails to)
        self.final_requested = False
        self.final_pause_s = FINAL_PAUSE_FIRST_S
        self.rescale: _Rescale | None = None

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL

    def handle(self, stimulus: Stimulus, now: float) -> list[Instruction]:
        if self.terminal and isinstance(stimulus, LeaseLost):
            self.fenced = True  # an ended job writes its record no more either
        if self.terminal and not self.fenced and isinstance(stimulus, CheckpointCompleted):
            # a checkpoint whose `_metadata` write was under way as the job ended completed after the record
            # was written FINISHED: the record counts it too, or a coordinator that reads it shows one less
            return [Persist()]
        if self.fenced or self.terminal:
            if isinstance(stimulus, RescaleAsked):  # every ask is answered, once
                why = "the coordinator lost its lease" if self.fenced else f"job {self.job_id} is {self.state}"
                return [AnswerRescale(f"{why}, not RUNNING: nothing to rescale", "JobNotRunning")]
            return []
        handler = getattr(self, f"_on_{type(stimulus).__name__}")
        out: list[Instruction] = handler(stimulus, now)
        self.handled += 1
        return out

    # -- starting -----------------------------------------------------------------------------

    def _on_Submitted(self, s: Submitted, now: float) -> list[Instruction]:
        if self.state != JobState.CREATED:
            return []
        return [*self._move(JobState.DEPLOYING), Deploy(self.attempt)]

    def _on_Recovered(self, s: Recovered, now: float) -> list[Instruction]:
        if self.handled:
            return []
        if s.superseded_by:  # its tasks went with the previous coordinator: nothing to stop, nothing to restart
            return self._move(JobState.CANCELLED, f"upgraded to {s.superseded_by} (the upgrade was finished by "
                                                  "a new leader after a coordinator failover)")
        self.state = JobState.RESTARTING
        self.failed_at = None
        return [RecordFailure("coordinator failover"), Adopt(JobState.RESTARTING), Persist(),
                *self._next_attempt(now, counted=False)]

    def _on_DeployAcked(self, s: DeployAcked, now: float) -> list[Instruction]:
        if self.state != JobState.DEPLOYING or s.attempt != self.attempt:
            return []
        self.final_requested = False
        self.final_pause_s = FINAL_PAUSE_FIRST_S
        return [*self._move(JobState.RUNNING), StartCheckpoints(self.attempt), StartTasks(self.attempt)]

    def _on_TasksStarted(self, s: TasksStarted, now: float) -> list[Instruction]:
        if self.state != JobState.RUNNING or s.attempt != self.attempt:
            return []
        out: list[Instruction] = []
        if self.failed_at is not None:
            out.append(RecordRestart(now - self.failed_at))
            self.failed_at = None
        if self.rescale is not None and self.rescale.stopped_at is not None:
            out.append(AnswerRescale(downtime_s=now - self.rescale.stopped_at))
            self.rescale = None
        return out

    # -- failures --------------------------------------------------------------------------------

    def _on_DeployFailed(self, s: DeployFailed, now: float) -> list[Instruction]:
        return self._failure(s.attempt, f"deployment failed: {s.error}", now)

    def _on_TaskFailed(self, s: TaskFailed, now: float) -> list[Instruction]:
        return self._failure(s.attempt, s.cause, now, fatal=s.fatal)

    def _on_WorkerLost(self, s: WorkerLost, now: float) -> list[Instruction]:
        return self._failure(s.attempt, f"worker {s.worker_id} lost: {s.why}", now)

    def _failure(self, attempt: int, cause: str, now: float, *, fatal: bool = False) -> list[Instruction]:
        """Cancel the attempt; restart after the strategy's delay, or fail the job when no restart is left or
        none can repair the failure (`fatal`). A failure of an earlier attempt, or one while a restart is under
        way already, changes nothing, except a fatal one of the attempt whose restart is still waiting out its
        delay: a task's own cause can reach the coordinator after a failure it caused elsewhere (a consumer of
        its output, on another worker), and restarting into a cause no restart repairs would only meet it again."""
        if (fatal and attempt == self.attempt and self.state == JobState.RESTARTING and self.phase == "delay"
                and self.rescale is None):
            self.failed_at = None
            error = f"{cause} (not restarted: a restart cannot repair it)"
            return [RecordFailure(cause), *self._move(JobState.FAILED, error)]
        if attempt != self.attempt or self.state not in (JobState.DEPLOYING, JobState.RUNNING):
            return []
        out: list[Instruction] = [RecordFailure(cause), StopCheckpoints(cause, failed=True)]
        number = self._restart_number(now)
        delay = self.strategy.delay_before(number) if self.strategy is not None and not fatal else None
        if delay is None:
            why = (" (not restarted: a restart cannot repair it)" if fatal else
                   " (restart attempts exhausted)" if self.restarts else "")
            error = f"{cause}{why}"
            return [*out, *self._move(JobState.FAILED, error), CancelTasks(self.attempt)]
        assert self.strategy is not None
        self.failed_at = now
        self.counted = True
        self.phase = "delay"
        return [*out, *self._move(JobState.RESTARTING), CancelTasks(self.attempt),
                ScheduleRestart(self.attempt, delay, number, self.strategy.max_attempts)]

    def _restart_number(self, now: float) -> int:
        """The next restart's number for the strategy: over the job's life, or within its failure window."""
        window = self.strategy.failure_window_s if self.strategy is not None else None
        if window is None:
            return self.restarts + 1
        self.restart_times = [t for t in self.restart_times if now - t < window]
        return len(self.restart_times) + 1

    # -- restarting ------------------------------------------------------------------------------

    def _on_RestartDelayElapsed(self, s: RestartDelayElapsed, now: float) -> list[Instruction]:
        if self.state != JobState.RESTARTING or self.phase != "delay" or s.attempt != self.attempt:
            return []
        return self._next_attempt(now, counted=self.counted)

    def _next_attempt(self, now: float, *, counted: bool, scale_up: bool = False) -> list[Instruction]:
        if counted:
            self.restarts += 1
            self.restart_times.append(now)
        self.counted = True  # a redeploy that failed and is tried again is a restart like any other
        self.attempt += 1
        self.phase = "planning"
        self.waiting_since = now
        self.scale_up = scale_up
        return [PlanAttempt(self.attempt, 0.0, now, scale_up=scale_up)]

    def _on_PlanFailed(self, s: PlanFailed, now: float) -> list[Instruction]:
        if self.state != JobState.RESTARTING or self.phase != "planning" or s.attempt != self.attempt:
            return []
        slot_wait_s = self.strategy.slot_wait_s if self.strategy is not None else 0.0
        if s.retriable and now + PLAN_RETRY_S < self.waiting_since + slot_wait_s:
            return [PlanAttempt(self.attempt, PLAN_RETRY_S, self.waiting_since, scale_up=self.scale_up)]
        self.scale_up = False  # a scale-up that did not deploy falls back to the usual plan
        out: list[Instruction] = [RecordFailure(s.error)]
        number = self._restart_number(now)
        delay = self.strategy.delay_before(number) if self.strategy is not None else None
        if delay is None:
            return [*out, *self._move(JobState.FAILED, f"{s.error} (restart attempts exhausted)")]
        assert self.strategy is not None
        self.phase = "delay"
        return [*out, ScheduleRestart(self.attempt, delay, number, self.strategy.max_attempts)]

    def _on_RestoreMissing(self, s: RestoreMissing, now: float) -> list[Instruction]:
        if self.state != JobState.RESTARTING or self.phase != "planning" or s.attempt != self.attempt:
            return []
        self.phase = ""
        return [RecordFailure(s.what), *self._move(JobState.FAILED, f"cannot restart: {s.what}")]

    def _on_AttemptPlanned(self, s: AttemptPlanned, now: float) -> list[Instruction]:
        if self.state != JobState.RESTARTING or self.phase != "planning" or s.attempt != self.attempt:
            return []
        self.phase = ""
        return [UsePlan(self.attempt), *self._move(JobState.DEPLOYING), Deploy(self.attempt)]

    # -- ending ------------------------------------------------------------------------------------

    def _on_AllTasksEnded(self, s: AllTasksEnded, now: float) -> list[Instruction]:
        if self.state != JobState.RUNNING or s.attempt != self.attempt or self.final_requested:
            return []
        self.final_requested = True
        return [RequestFinalCheckpoint(self.attempt, 0.0)]

    def _on_FinalCheckpointDone(self, s: FinalCheckpointDone, now: float) -> list[Instruction]:
        if self.state != JobState.RUNNING or s.attempt != self.attempt or s.completed or s.reason == "job failed":
            return []  # completed: its commit finishes the tasks; "job failed": the failover takes over
        # an abort answered at once must let the failover and the workers run first
        pause_s = self.final_pause_s
        self.final_pause_s = min(FINAL_PAUSE_MAX_S, pause_s * 2)
        return [RequestFinalCheckpoint(self.attempt, pause_s)]

    def _on_AllTasksFinished(self, s: AllTasksFinished, now: float) -> list[Instruction]:
        if self.state != JobState.RUNNING or s.attempt != self.attempt:
            return []
        return [*self._move(JobState.FINISHING), RecordFinalCheckpoint(),
                StopCheckpoints("job finished", failed=False), *self._move(JobState.FINISHED)]

    def _on_CheckpointCompleted(self, s: CheckpointCompleted, now: float) -> list[Instruction]:
        # the record names its latest checkpoint and counts every one, also one an earlier attempt's `_metadata`
        # write completed after a restart began
        return [Persist()]

    def _on_CancelAsked(self, s: CancelAsked, now: float) -> list[Instruction]:
        return [*self._move(JobState.CANCELLED, s.why), StopCheckpoints(s.why, failed=True),
                CancelTasks(self.attempt)]

    def _on_ExecutionFailed(self, s: ExecutionFailed, now: float) -> list[Instruction]:
        return [StopCheckpoints(s.error, failed=True), *self._move(JobState.FAILED, s.error),
                CancelTasks(self.attempt)]

    def _on_LeaseLost(self, s: LeaseLost, now: float) -> list[Instruction]:
        self.fenced = True
        out: list[Instruction] = []
        if self.rescale is not None:
            out.append(AnswerRescale("the coordinator lost its lease", "NotLeader"))
            self.rescale = None
        return [*out, StopCheckpoints("leadership lost", failed=False)]

    # -- rescaling ------------------------------------------------------------------------------------

    def _on_RescaleAsked(self, s: RescaleAsked, now: float) -> list[Instruction]:
        if self.rescale is not None:
            return [AnswerRescale(f"job {self.job_id} is being rescaled already", "JobNotRunning")]
        if self.state != JobState.RUNNING or s.finishing or self.final_requested:
            why = "finishing" if self.state == JobState.RUNNING else self.state
            return [AnswerRescale(f"job {self.job_id} is {why}, not RUNNING: nothing to rescale", "JobNotRunning")]
        self.rescale = _Rescale(s.scale_up)
        return [TakeRescaleCheckpoint(self.attempt)]

    def _on_RescaleCheckpointDone(self, s: RescaleCheckpointDone, now: float) -> list[Instruction]:
        rescale = self.rescale
        if rescale is None or rescale.stopped_at is not None:
            return []
        if s.error:
            self.rescale = None
            return [AnswerRescale(s.error, s.error_type)]
        if self.state != JobState.RUNNING or s.attempt != self.attempt:
            self.rescale = None
            return [AnswerRescale(f"job {self.job_id} is {self.state} (attempt {self.attempt}) after the "
                                  "checkpoint: not rescaled", "JobNotRunning")]
        stopped = self.attempt
        self.failed_at = None  # the downtime is the rescale's own figure, not a restart's
        # one step: the record that says RESTARTING carries the new parallelism, so a leader that takes over
        # from here on restarts the job at it (before, it restarts it as it ran: the checkpoint is a usual one)
        out: list[Instruction] = [CommitRescale(), StopCheckpoints("rescale", failed=False),
                                  *self._move(JobState.RESTARTING), CancelTasks(stopped),
                                  StepReached("rescale:stopped"),
                                  *self._next_attempt(now, counted=False, scale_up=rescale.scale_up)]
        rescale.stopped_at = now  # from here on, the end of this restart is the rescale's answer
        return out

    # -- helpers -------------------------------------------------------------------------------------

    def _move(self, state: str, error: str = "") -> list[Instruction]:
        self.state = state
        out: list[Instruction] = [MoveTo(state, error)]
        rescale = self.rescale
        if rescale is not None and (state in TERMINAL or (state == JobState.RESTARTING and rescale.stopped_at)):
            # the job failed, was cancelled or must restart: the rescale is over, unfinished
            self.rescale = None
            if rescale.stopped_at is None:
                out.append(AnswerRescale(f"job {self.job_id} is {state} now: not rescaled", "JobNotRunning"))
            else:
                why = f"job {self.job_id} stopped for the rescale but is {state} now: {error}".rstrip(": ")
                out.append(AnswerRescale(why, "RescaleFailed"))
        return out
