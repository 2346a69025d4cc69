"""The job lifecycle's shell: turns RPC results and worker events into stimuli for each job's pure
`JobLifecycle` (coordinator/lifecycle.py) and carries out the instructions it returns.

A failure (a task raised, a worker's heartbeats stopped or its link broke, a
data connection between workers broke, too many checkpoints failed) cancels
what is left of the attempt and, while the restart strategy allows, starts a
new attempt from the latest completed checkpoint once enough slots are free:
the plan is made again for the workers registered now, so a restarted or
standby worker with a new address is used. Sources rewind to their
checkpointed positions, restored channel state is replayed before new data,
and sinks redo the commits of that checkpoint and drop everything after it.

The end of a bounded job is a checkpoint like any other: a task that reached
the end of its input waits until a checkpoint taken after that has completed
and its sinks published it, then finishes. Once every task has ended, the
manager asks for that final checkpoint (again after an abort) if periodic
checkpoints do not bring one; when every task has finished the job is
FINISHED and reports the final checkpoint's id. A failure before that
restores the latest checkpoint, whose commit is redone, never doubled.

Instructions that only change the record run at once, in order; from the
first one that waits (an RPC, a delay, a checkpoint) the rest of the list runs
as one task of the manager's `BackgroundTasks`, so a restart's delay starts
after the cancel of the failed attempt returned, as before. Whatever such a
task raises unforeseen fails the job (`ExecutionFailed`) and is logged, so no
job is left RESTARTING forever.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from coordinator import autoscale as policy
from coordinator import lifecycle as lc
from coordinator.autoscale import AutoscaleSettings, Scaling, ScalingStatistics, Shape
from coordinator.checkpoint_runner import CheckpointRunner
from coordinator.checkpointing import CheckpointSettings, CompletedCheckpoint
from coordinator.job_graphs import JobGraphs
from coordinator.jobs import JobRecord
from coordinator.metrics import DurationHistogram, JobsStatistics
from coordinator.scheduler import WorkerSlots, describe_parallelism, make_plan, merge_parallelism
from coordinator.storage import METADATA_FILE, CheckpointStorage
from coordinator.trace_spans import SpanSink, recovery_span
from netstack.errors import NetstackError, RpcError
from netstack.transport import Link
from runtime.api import Job, JobDefinitionError
from runtime.common import objectstore
from runtime.common.checksums import CorruptFile
from runtime.common.tasks import BackgroundTasks
from runtime.graph import protocol as p
from runtime.graph import replies as r
from runtime.graph.checkpoint_metadata import CheckpointMetadata
from runtime.graph.enums import JobState
from runtime.graph.evolution import match_operators
from runtime.graph.job_config import JobConfig
from runtime.graph.plan import JobLoadError, Plan, chain_graph
from runtime.graph.restore_compatibility import IncompatibleCheckpoint, restore_spec

if TYPE_CHECKING:
    from coordinator.registry import WorkerRecord

log = logging.getLogger("sluice.jobs")

# instructions that wait: the rest of their list runs as a background task
WAITING = (lc.Deploy, lc.StartTasks, lc.CancelTasks, lc.ScheduleRestart, lc.PlanAttempt, lc.RequestFinalCheckpoint,
           lc.TakeRescaleCheckpoint, lc.StepReached)
RUNNER_STOP_S = 10.0  # how long stopping waits for checkpoint runners (their retention discards) to end


@dataclass
class _RescaleCall:
    """One `rescale` under way: what was asked, and the answer its caller awaits."""

    requested: dict[str, int]
    run_at: dict[str, int] | None  # a scale-up's target, else None (the ask is merged into the config)
    timeout_s: float
    answer: asyncio.Future[lc.AnswerRescale]
    config: JobConfig | None = None  # the job's config once rescaled
    checkpoint_id: int | None = None


class JobManager:
    def __init__(self, *, workers: Mapping[str, WorkerRecord], storage: CheckpointStorage,
                 autoscale: AutoscaleSettings | None = None,
                 persist: Callable[[JobRecord], None] = lambda job: None,
                 record_written: Callable[[str], Awaitable[None]] | None = None,
                 on_step: Callable[[str], Awaitable[None]] | None = None) -> None:
        self.workers = workers
        self.storage = storage
        self.persist = persist  # writes the job's record (coordinator/job_store.py) after every change
        # waits until a job's record as queued now is on disk (JobStore.written): an upgrade's write-ahead
        self.record_written = record_written
        # called at each step of an upgrade or rescale (`step`): a test's launcher may stop the process there
        self.on_step = on_step
        self.recovered = 0  # jobs a previous coordinator left running, restarted by this one
        self.jobs: dict[str, JobRecord] = {}
        self.lifecycles: dict[str, lc.JobLifecycle] = {}
        # the OTLP export's (coordinator/telemetry.py): traces of checkpoints and recoveries; None: off, none built
        self.submit_span: SpanSink | None = None
        self._tasks = BackgroundTasks("jobs")
        self._runner_stops: set[asyncio.Future[Any]] = set()
        self._last_runner_stop: dict[str, asyncio.Future[Any]] = {}  # job id -> its latest runner's stop
        self._plans: dict[str, Plan] = {}  # job id -> the next attempt's plan, until UsePlan
        self._rescales: dict[str, _RescaleCall] = {}  # job id -> its rescale under way: one at a time
        self._channel_base = itertools.count(1, 1 << 20)  # each attempt gets its own range of channel ids
        self.checkpoint_durations = DurationHistogram()
        self.restart_durations = DurationHistogram()
        self.autoscale = autoscale or AutoscaleSettings()
        self.scaling: dict[str, Scaling] = {}  # job id -> its scale-downs and scale-ups (coordinator/autoscale.py)
        self.graphs = JobGraphs()

    def statistics(self) -> JobsStatistics:
        return JobsStatistics(tuple(j.statistics() for j in self.jobs.values()),
                              self.checkpoint_durations.statistics(), self.restart_durations.statistics(),
                              tuple(ScalingStatistics(jid, sc.scale_downs, sc.scale_ups, bool(sc.reason))
                                    for jid, sc in self.scaling.items()))

    async def stop(self) -> None:
        """End every task of the manager: checkpoint runners first (their retention discards finish, bounded),
        then deploys, restarts, cancels and the autoscaler."""
        if self._runner_stops:
            await asyncio.wait(list(self._runner_stops), timeout=RUNNER_STOP_S)
        await self._tasks.cancel_and_wait()

    def lease_lost(self) -> None:
        """Another coordinator may lead now: every job is left as it is, for it to restart."""
        for job in list(self.jobs.values()):
            self.handle(job, lc.LeaseLost())

    # -- planning -----------------------------------------------------------------

    def worker_slots(self) -> list[WorkerSlots]:
        return [WorkerSlots(w.worker_id, w.slots, w.host, w.data_port)
                for w in sorted(self.workers.values(), key=lambda w: w.registered_at)]

    def plan(self, job: JobRecord, config: JobConfig | None = None, groups: Mapping[int, int] | None = None) -> Plan:
        """Raises RpcError for a job module that does not import or a graph the cluster cannot run.
        `config` (default: the job's) lets a rescale try its new parallelism before it stops anything; `groups`
        keeps a checkpoint's task boundaries (plan.chain_graph)."""
        config = job.config if config is None else config
        try:
            return make_plan(job_id=job.job_id, attempt=job.attempt, entry=job.entry, name=job.name,
                             sys_path=job.sys_path, config=config, job=self.graph(job, config.parallelism),
                             workers=self.worker_slots(), channel_base=next(self._channel_base), groups=groups)
        except (JobLoadError, JobDefinitionError) as exc:
            raise RpcError(str(exc), type(exc).__name__) from None

    def graph(self, job: JobRecord, parallelism: Mapping[str, int] | None = None) -> Job:
        """The job's graph at `parallelism` (default: its configured overrides), built once (JobGraphs);
        raises JobLoadError or JobDefinitionError."""
        return self.graphs.get(job.job_id, entry=job.entry, name=job.name, sys_path=job.sys_path,
                               parallelism=job.config.parallelism if parallelism is None else parallelism)

    def _built(self, job: JobRecord, parallelism: Mapping[str, int] | None = None) -> Job:
        """`graph`, with a job that no longer builds as an RpcError."""
        try:
            return self.graph(job, parallelism)
        except (JobLoadError, JobDefinitionError) as exc:
            raise RpcError(str(exc), type(exc).__name__) from None

    async def _read_checkpoint(self, path: str) -> CheckpointMetadata:
        try:
            metadata = await asyncio.to_thread(self.storage.read_metadata, path)
            await asyncio.to_thread(self.storage.verify, path, metadata)
        except CorruptFile as exc:  # CorruptCheckpoint, or a task file's verified read (runtime/common/checksums)
            raise RpcError(str(exc), "CorruptCheckpoint") from None
        return metadata

    async def restored_plan(self, job: JobRecord, path: str, plan: Plan) -> Plan:
        """`plan` with the checkpoint at `path` attached, re-planned if needed so that it keeps the checkpoint's
        task boundaries (a former network edge stays one: issue 20 item 3); RpcError if it cannot be restored."""
        metadata = await self._read_checkpoint(path)
        built = self._built(job, plan.config.parallelism)
        if metadata.operators:
            groups = match_operators(metadata.graph, built).old_vertex_of_new
            if [v.nodes for v in chain_graph(built, groups)[0]] != [v.nodes for v in plan.vertices]:
                plan = self.plan(job, plan.config, groups=groups)
        directory = await asyncio.to_thread(self.storage.directory_of, path)
        try:
            plan.restore = restore_spec(metadata, built, plan, path=path, directory=directory)
        except IncompatibleCheckpoint as exc:
            raise RpcError(str(exc), "IncompatibleCheckpoint") from None
        return plan

    # -- jobs in and out ---------------------------------------------------------------

    def add(self, job: JobRecord) -> None:
        self.jobs[job.job_id] = job
        self.lifecycles[job.job_id] = lc.JobLifecycle(job.job_id, job.restart_strategy)
        job.on_change = self.persist
        self.persist(job)
        self.handle(job, lc.Submitted())

    async def write_ahead(self, job: JobRecord) -> None:
        """Write the record of a job not yet added and wait until it is on disk: what a new leader needs to
        finish a step begun here (an upgrade's new version). OSError if it could not be written."""
        self.persist(job)
        if self.record_written is not None:
            await self.record_written(job.job_id)

    async def settled(self, job: JobRecord) -> None:
        """Once an ended job's checkpoint runner has settled (a `_metadata` write under way as the last task
        finished has landed and been counted, bounded) and the job's record as it is then is on disk: what a
        client is told the job ended after, so a coordinator restarted from the record shows the same page."""
        stopping = self._last_runner_stop.get(job.job_id)
        if stopping is not None:
            await asyncio.wait([stopping], timeout=RUNNER_STOP_S)
        if self.record_written is not None:
            try:
                await self.record_written(job.job_id)
            except OSError as exc:  # logged by the store; the answer goes out all the same
                log.warning("job %s: its ended record is not on disk: %s", job.job_id, exc)

    async def step(self, name: str) -> None:
        """A point of an upgrade or rescale that a new leader carries on from; the hook (tests only) may stop
        the process here, as a kill -9 at this exact point would."""
        if self.on_step is not None:
            await self.on_step(name)

    def adopt(self, job: JobRecord, *, superseded_by: str = "") -> None:
        """A job from the previous coordinator's records: an ended one is shown as it ended, an unfinished one
        runs again (`recover`) once enough workers have registered; one an upgrade replaced (`superseded_by`,
        job_store.superseded) is cancelled, the upgrade finished."""
        self.jobs[job.job_id] = job
        self.lifecycles[job.job_id] = lc.JobLifecycle(job.job_id, job.restart_strategy, state=job.state,
                                                      attempt=job.attempt, restarts=job.restarts)
        job.on_change = self.persist
        if superseded_by and not job.terminal:
            log.warning("job %s was being upgraded to %s when the previous coordinator stopped: finishing the "
                        "upgrade", job.job_id, superseded_by)
            self.handle(job, lc.Recovered(superseded_by))
        elif not job.terminal:
            self.recovered += 1
            self._tasks.spawn(self.recover(job), name=f"recover {job.job_id}")

    async def recover(self, job: JobRecord) -> None:
        """Restart a job whose coordinator died from its latest completed checkpoint, as a new attempt: the
        previous coordinator's attempt is gone with it (its workers cancelled their tasks when the link broke)."""
        # checkpoint ids go on after every one the previous coordinator may have started (sinks name files by id)
        try:
            started = await asyncio.to_thread(started_checkpoint_ids, self.storage, job.job_id)
        except OSError as exc:  # the checkpoint storage cannot be listed: reusing an id could double a commit
            log.error("job %s: cannot list its checkpoints to recover it: %s", job.job_id, exc)
            self.handle(job, lc.ExecutionFailed(f"recovery after a coordinator failover failed: {exc}"))
            return
        job.next_checkpoint_id = max([job.next_checkpoint_id, *(n + 1 for n in started)])
        log.warning("job %s was %s when the previous coordinator stopped: restarting it (attempt %d)",
                    job.job_id, job.state, job.attempt + 1)
        self.handle(job, lc.Recovered())

    # -- stimuli from the coordinator's RPC handlers and link events ---------------------------

    def task_failed(self, job: JobRecord, attempt: int, cause: str, *, fatal: bool = False) -> None:
        self.handle(job, lc.TaskFailed(attempt, cause, fatal))

    def worker_lost(self, worker_id: str, why: str) -> None:
        for job in list(self.jobs.values()):
            if job.plan is not None and worker_id in job.plan.placement.values():
                self.handle(job, lc.WorkerLost(job.attempt, worker_id, why))

    def task_ended(self, job: JobRecord, task: str) -> None:
        job.ended_tasks.add(task)
        if len(job.ended_tasks | job.finished_tasks) == job.total_tasks():
            self.handle(job, lc.AllTasksEnded(job.attempt))

    def task_finished(self, job: JobRecord, task: str) -> None:
        job.finished_tasks.add(task)
        if job.checkpoints is not None:
            job.checkpoints.task_finished(task)  # later checkpoints record it as finished
        if len(job.finished_tasks) == job.total_tasks():
            self.handle(job, lc.AllTasksFinished(job.attempt))

    async def cancel(self, job: JobRecord, why: str) -> None:
        """Cancel the job; returns once its workers answered the cancel."""
        task = self.handle(job, lc.CancelAsked(why))
        if task is not None:
            await asyncio.shield(task)

    # -- carrying out instructions ------------------------------------------------------------

    def handle(self, job: JobRecord, stimulus: lc.Stimulus) -> asyncio.Future[None] | None:
        """Feed one stimulus; returns the task running the waiting part of the instructions, if any."""
        machine = self.lifecycles[job.job_id]
        instructions = machine.handle(stimulus, time.monotonic())
        job.attempt, job.restarts = machine.attempt, machine.restarts  # the record mirrors the machine
        for i, ins in enumerate(instructions):
            if isinstance(ins, WAITING):
                return self._tasks.spawn(self._carry_out(job, instructions[i:]),
                                         name=f"{job.job_id} {type(ins).__name__}")
            self._do(job, ins)
        return None

    async def _carry_out(self, job: JobRecord, instructions: list[lc.Instruction]) -> None:
        try:
            for ins in instructions:
                if isinstance(ins, WAITING):
                    await self._wait_on(job, ins)
                else:
                    self._do(job, ins)
        except Exception as exc:
            log.exception("job %s: %s failed", job.job_id, type(ins).__name__)
            self.handle(job, lc.ExecutionFailed(f"{type(ins).__name__} failed: {type(exc).__name__}: {exc}"))

    def _do(self, job: JobRecord, ins: lc.Instruction) -> None:
        if isinstance(ins, lc.MoveTo):
            job.move(ins.state, ins.error)
            if ins.state == JobState.FAILED:
                tried = f" after {job.restarts} restarts" if job.restarts else ""
                log.error("job %s failed%s: %s", job.job_id, tried, ins.error)
            elif ins.state == JobState.FINISHED:
                log.info("job %s finished (final checkpoint %s)", job.job_id, job.final_checkpoint_id)
            if job.terminal:  # no plan, restore or scaling asks for an ended job's graph again
                self.graphs.forget(job.job_id)
        elif isinstance(ins, lc.Adopt):
            job.state = ins.state
        elif isinstance(ins, lc.Persist):
            self.persist(job)
        elif isinstance(ins, lc.RecordFailure):
            job.note_failure(ins.cause)
        elif isinstance(ins, lc.StartCheckpoints):
            self._start_checkpoints(job, ins.attempt)
        elif isinstance(ins, lc.StopCheckpoints):
            self._stop_checkpoints(job, ins.reason, failed=ins.failed)
        elif isinstance(ins, lc.RecordFinalCheckpoint):
            if job.checkpoints is not None:
                job.final_checkpoint_id = job.checkpoints.coordinator.statistics().last_completed_id
        elif isinstance(ins, lc.UsePlan):
            plan = self._plans.pop(job.job_id)
            self._note_parallelism(job, job.plan, plan)
            job.plan = plan
            job.finished_tasks = set()
            job.ended_tasks = set()
            job.task_stats = {}
        elif isinstance(ins, lc.RecordRestart):
            job.last_restart_s = ins.seconds
            job.restart_s.append(ins.seconds)
            self.restart_durations.observe(ins.seconds)
            if self.submit_span is not None:
                span = recovery_span(job_id=job.job_id, attempt=job.attempt, seconds=ins.seconds,
                                     running_at_s=time.time(), cause=job.failures[-1] if job.failures else "",
                                     restored_checkpoint_id=job.restored_checkpoint_id)
                self.submit_span(lambda: span)
            log.info("job %s running again (attempt %d) %.2fs after the failure", job.job_id, job.attempt,
                     ins.seconds)
        elif isinstance(ins, lc.CommitRescale):
            config = self._rescales[job.job_id].config
            assert config is not None
            job.config = config
        elif isinstance(ins, lc.AnswerRescale):
            call_or_none = self._rescales.pop(job.job_id, None)
            if call_or_none is not None and not call_or_none.answer.done():
                call_or_none.answer.set_result(ins)
        else:  # pragma: no cover - every instruction is handled above or in _wait_on
            raise AssertionError(f"unknown instruction {ins!r}")

    async def _wait_on(self, job: JobRecord, ins: lc.Instruction) -> None:
        if isinstance(ins, lc.Deploy):
            await self._deploy(job, ins.attempt)
        elif isinstance(ins, lc.StartTasks):
            await self._start_tasks(job, ins.attempt)
        elif isinstance(ins, lc.CancelTasks):
            await self.cancel_tasks(job, ins.attempt)
        elif isinstance(ins, lc.ScheduleRestart):
            log.error("job %s: %s; restarting in %.1fs (restart %d of %d)", job.job_id,
                      job.failures[-1] if job.failures else "?", ins.delay_s, ins.restart, ins.of)
            await asyncio.sleep(ins.delay_s)
            self.handle(job, lc.RestartDelayElapsed(ins.attempt))
        elif isinstance(ins, lc.PlanAttempt):
            await asyncio.sleep(ins.after_s)
            await self._plan_next(job, ins)
        elif isinstance(ins, lc.RequestFinalCheckpoint):
            await self._final_checkpoint(job, ins)
        elif isinstance(ins, lc.TakeRescaleCheckpoint):
            await self._rescale_checkpoint(job, ins.attempt)
        elif isinstance(ins, lc.StepReached):
            await self.step(ins.step)

    # -- deploying ------------------------------------------------------------------

    def _involved(self, job: JobRecord) -> list[Link]:
        assert job.plan is not None
        return [self.workers[w].link for w in sorted(set(job.plan.placement.values()))]

    async def _deploy(self, job: JobRecord, attempt: int) -> None:
        assert job.plan is not None
        try:
            plan_dict = job.plan.to_dict()
            await asyncio.gather(*(p.call(link, p.Deploy(plan_dict), timeout_s=60.0)
                                   for link in self._involved(job)))
        except (NetstackError, KeyError) as exc:
            self.handle(job, lc.DeployFailed(attempt, str(exc)))
            return
        self.handle(job, lc.DeployAcked(attempt))

    async def _start_tasks(self, job: JobRecord, attempt: int) -> None:
        try:
            await asyncio.gather(*(p.call(link, p.StartJob(job.job_id)) for link in self._involved(job)))
        except (NetstackError, KeyError) as exc:
            self.handle(job, lc.DeployFailed(attempt, str(exc)))
            return
        if attempt == 0 and job.plan is not None:
            log.info("job %s running on %s", job.job_id, ", ".join(sorted(set(job.plan.placement.values()))))
        self.handle(job, lc.TasksStarted(attempt))

    def _start_checkpoints(self, job: JobRecord, attempt: int) -> None:
        plan = job.plan
        assert plan is not None
        involved = sorted(set(plan.placement.values()))
        tasks = frozenset(f"{v.id}:{i}" for v in plan.vertices for i in range(v.parallelism))
        # the graph by operator uid (runtime/graph/operator_ids.py): what a restore into another version maps by
        job_info = {"entry": job.entry, "name": job.name,
                    "vertices": [{"id": v.id, "name": v.name, "parallelism": v.parallelism, "nodes": list(v.nodes)}
                                 for v in plan.vertices], **plan.graph}

        def on_complete(completed: CompletedCheckpoint) -> None:
            checkpoint_id, summary = completed.checkpoint_id, completed.summary
            stale = job.checkpoints is not runner  # the attempt restarted while this `_metadata` write was under way
            if stale and summary is not None:
                job.complete_archived(summary.to_document())
            last = job.last_checkpoint
            if not stale or checkpoint_id > (last.checkpoint_id if last is not None else 0):
                job.last_checkpoint = completed
            job.next_checkpoint_id = max(job.next_checkpoint_id, checkpoint_id + 1)
            if summary is not None and summary.duration_s is not None:
                self.checkpoint_durations.observe(summary.duration_s)
            self.handle(job, lc.CheckpointCompleted(attempt, checkpoint_id))

        def links() -> list[Link]:
            # a worker whose tasks have all finished may have released the job: it takes no part any more
            busy = {w for t, w in plan.placement.items() if t not in job.finished_tasks}
            return [self.workers[w].link for w in involved if w in self.workers and w in busy]

        job.checkpoints = runner = CheckpointRunner(
            job_id=job.job_id, attempt=attempt, settings=job.checkpoint_settings or CheckpointSettings(None),
            tasks=tasks, storage=self.storage, links=links, job_info=job_info,
            fail_job=lambda reason: self.task_failed(job, attempt, reason), on_complete=on_complete,
            first_id=job.next_checkpoint_id, submit_span=self.submit_span)
        runner.start()

    def _stop_checkpoints(self, job: JobRecord, reason: str, *, failed: bool) -> None:
        runner = job.checkpoints
        if runner is None:
            return
        if failed:
            runner.task_failed(reason)
        runner.stop_nowait(reason)
        # a job that finishes lets a checkpoint being written complete: it is durable either way, and retention
        # must count it
        stopping = self._tasks.spawn(runner.stop(reason, job_finished=job.state == JobState.FINISHING),
                                     name=f"{job.job_id} checkpoint runner stop")
        self._runner_stops.add(stopping)
        stopping.add_done_callback(self._runner_stops.discard)
        self._last_runner_stop[job.job_id] = stopping
        stopping.add_done_callback(lambda done: self._last_runner_stop.pop(job.job_id, None)
                                   if self._last_runner_stop.get(job.job_id) is done else None)
        job.archive_checkpoints()
        job.checkpoints = None
        st = runner.coordinator.statistics()
        last_id = max([st.in_flight_id or 0, st.last_completed_id or 0] + [h.checkpoint_id for h in
                                                                             runner.coordinator.history()])
        job.next_checkpoint_id = max(job.next_checkpoint_id, last_id + 1)

    # -- finishing ------------------------------------------------------------------

    async def _final_checkpoint(self, job: JobRecord, ins: lc.RequestFinalCheckpoint) -> None:
        """Every task ended: take a checkpoint (its commit finishes the tasks); the lifecycle asks again after
        an abort. Aborts count against tolerable_failures like any other."""
        await asyncio.sleep(ins.after_s)
        runner = job.checkpoints
        if runner is None or job.attempt != ins.attempt:
            return  # the attempt ended meanwhile
        checkpoint_id, fut = runner.request()
        result = await fut
        if result.completed:
            log.info("job %s: final checkpoint %d completed", job.job_id, checkpoint_id)
        self.handle(job, lc.FinalCheckpointDone(ins.attempt, result.completed, result.reason or ""))

    # -- restarting -------------------------------------------------------------------

    async def _plan_next(self, job: JobRecord, ins: lc.PlanAttempt) -> None:
        """Plan the attempt for the workers registered now and attach the latest intact checkpoint."""
        call = self._rescales.get(job.job_id)
        run_at = call.run_at if ins.scale_up and call is not None else None
        try:
            plan = self._plan_attempt(job, waited_s=time.monotonic() - ins.waiting_since, run_at=run_at)
        except RpcError as exc:  # typically: not enough slots until a worker comes back
            self.handle(job, lc.PlanFailed(ins.attempt, str(exc), retriable=True))
            return
        try:
            plan, missing = await self._attach_latest_checkpoint(job, plan)
        except RpcError as exc:
            self.handle(job, lc.PlanFailed(ins.attempt, f"cannot restore: {exc}", retriable=False))
            return
        if missing:
            self.handle(job, lc.RestoreMissing(ins.attempt, missing))
            return
        self._plans[job.job_id] = plan
        self.handle(job, lc.AttemptPlanned(ins.attempt))

    async def _attach_latest_checkpoint(self, job: JobRecord, plan: Plan) -> tuple[Plan, str]:
        """The plan with the newest completed checkpoint that is intact attached (re-planned to keep its task
        boundaries; `lc.choose_restore` decides which may be used); a corrupt one is skipped (and logged) for the
        one before it, down to the checkpoint the job was submitted with. The second item says what is missing
        when the job must not run: its output is committed, its checkpoints gone."""
        choice = await asyncio.to_thread(self._restore_choice, job)
        if choice.missing:
            return plan, choice.missing
        candidates = list(choice.candidates)
        if not candidates:
            job.restored_checkpoint_id = None
            return plan, ""  # no checkpoint yet: start from scratch; sinks drop the earlier attempt's uncommitted files
        for path in candidates[:-1]:
            try:
                plan = await self.restored_plan(job, path, plan)
                break
            except RpcError as exc:
                if exc.remote_type != "CorruptCheckpoint":
                    raise
                log.error("job %s: skipping checkpoint %s for an older one: %s", job.job_id, path, exc)
        else:
            path = candidates[-1]
            plan = await self.restored_plan(job, path, plan)
        assert plan.restore is not None
        job.restored_checkpoint_id = plan.restore.checkpoint_id
        log.info("job %s: attempt %d restores checkpoint %s", job.job_id, job.attempt, path)
        return plan, ""

    def _restore_choice(self, job: JobRecord) -> lc.RestoreChoice:
        """What the store holds and whether the record's checkpoints still exist (blocking: in a thread)."""
        last = job.last_checkpoint
        recorded = (last.checkpoint_id, last.path) if last is not None and last.path else None
        job_dir = getattr(self.storage, "job_dir", None)
        return lc.choose_restore(
            self.storage.list_completed(job.job_id), recorded,
            recorded is not None and _completed_at(recorded[1]), job.restored_from,
            bool(job.restored_from) and _completed_at(job.restored_from),
            job_dir(job.job_id) if job_dir is not None else "the checkpoint store")

    # -- rescaling a running job -------------------------------------------------------

    async def rescale(self, job: JobRecord, requested: dict[str, int], *, timeout_s: float = 600.0,
                      run_at: dict[str, int] | None = None) -> r.Rescaled:
        """Checkpoint the running job in its own mode (unaligned stays unaligned: no savepoint, no draining), stop
        the attempt and redeploy the same job at the new parallelism from that checkpoint, through the failover's
        own restart path. Every refusal (not running, too few slots, a failed checkpoint, a plan that cannot be
        rescaled) is one RpcError line raised before anything is stopped: the job keeps running unchanged.
        With `run_at` (a scale-up: operator name -> parallelism, up to the ask) the ask is kept and the job
        redeploys at `run_at`."""
        answer: asyncio.Future[lc.AnswerRescale] = asyncio.get_running_loop().create_future()
        call = _RescaleCall(dict(requested), run_at, timeout_s, answer)
        if job.job_id not in self._rescales:
            self._rescales[job.job_id] = call
        else:
            call.answer.set_result(lc.AnswerRescale(f"job {job.job_id} is being rescaled already", "JobNotRunning"))
        if not answer.done():
            self.handle(job, lc.RescaleAsked(_finishing(job), scale_up=run_at is not None))
        result = await answer
        if result.error:
            raise RpcError(result.error, result.error_type)
        log.info("job %s rescaled to %s from checkpoint %s: down %.3fs", job.job_id,
                 describe_parallelism(job.plan), job.restored_checkpoint_id, result.downtime_s)
        job.rescale_s.append(result.downtime_s)
        used: dict[str, Any] = next((h for h in reversed(job.checkpoint_history())
                                     if h.get("checkpoint_id") == job.restored_checkpoint_id), {})
        return r.Rescaled(job.job_id, job.attempt, result.downtime_s,
                          [{"name": v.name, "parallelism": v.parallelism}
                           for v in (job.plan.vertices if job.plan else [])],
                          checkpoint_id=job.restored_checkpoint_id, requested_checkpoint_id=call.checkpoint_id,
                          inflight_bytes=used.get("inflight_bytes"), mode=used.get("mode"))

    async def _rescale_checkpoint(self, job: JobRecord, attempt: int) -> None:
        """Try the new plan, take the checkpoint and check that the new plan can restore it; every refusal is
        reported before anything is stopped."""
        call = self._rescales[job.job_id]
        try:
            if call.run_at is None:
                call.config = job.config.with_parallelism(merge_parallelism(job.config.parallelism, call.requested))
                trial = self.plan(job, call.config)  # too many slots, an unknown operator, a forward edge torn apart
            else:
                call.config = job.config
                trial = self.plan(job, job.config.with_parallelism(call.run_at))
            runner = job.checkpoints
            if runner is None:
                raise RpcError(f"job {job.job_id} is {job.state}, not RUNNING: nothing to rescale", "JobNotRunning")
            call.checkpoint_id, fut = runner.request()
            result = await asyncio.wait_for(fut, call.timeout_s)
            if not result.completed:
                raise RpcError(f"job {job.job_id} not rescaled: checkpoint {call.checkpoint_id} did not complete "
                               f"({result.reason or result.status}); it keeps running unchanged",
                               "RescaleCheckpointFailed")
            # the restore refusals (sources, broadcast edges), at the task boundaries the restart will keep
            trial = await self.restored_plan(job, str(result.path), trial)
        except RpcError as exc:
            self.handle(job, lc.RescaleCheckpointDone(attempt, str(exc), exc.remote_type or "RescaleFailed"))
            return
        except TimeoutError:
            self.handle(job, lc.RescaleCheckpointDone(attempt, f"job {job.job_id} not rescaled: checkpoint "
                                                               f"{call.checkpoint_id} timed out", "Timeout"))
            return
        await self.step("rescale:checkpoint-taken")
        log.info("job %s: stopping attempt %d to rescale it to %s from checkpoint %d", job.job_id, attempt,
                 describe_parallelism(trial), call.checkpoint_id)
        self.handle(job, lc.RescaleCheckpointDone(attempt))

    # -- scaling down and up (the policy is coordinator/autoscale.py) ----------------------

    def _shape(self, job: JobRecord) -> Shape:
        """The job's operators at their asked parallelism; RpcError if the job no longer builds."""
        try:
            return policy.shape_of(self.graph(job))
        except (JobLoadError, JobDefinitionError) as exc:
            raise RpcError(str(exc), type(exc).__name__) from None

    def _asked_vertices(self, job: JobRecord) -> dict[str, int]:
        """Task type name -> asked parallelism (the chaining of a shrunk job is the same: autoscale.py)."""
        try:
            vertices, _ = chain_graph(self.graph(job))
        except (JobLoadError, JobDefinitionError) as exc:
            raise RpcError(str(exc), type(exc).__name__) from None
        return {v.name: v.parallelism for v in vertices}

    def slots(self, *, settled_for_s: float = 0.0) -> int:
        """Slots of the workers registered at least `settled_for_s` ago (a flapping worker never counts)."""
        now = time.monotonic()
        return sum(w.slots for w in self.workers.values() if now - w.registered_at >= settled_for_s)

    def _plan_attempt(self, job: JobRecord, *, waited_s: float, run_at: dict[str, int] | None) -> Plan:
        """The plan of a restart: at `run_at` if given (a scale-up), else at the ask; once the restart has
        waited `scale_down_after` for the slots the ask needs (at once if the job ran scaled down already: the
        cluster was known to be too small), at the largest parallelism the slots allow. Raises RpcError while
        no plan fits."""
        if run_at is not None:
            return self.plan(job, job.config.with_parallelism(run_at))
        try:
            return self.plan(job)
        except RpcError:
            after = self.autoscale.scale_down_after(job.config.scale_down_after_s)
            scaling = self.scaling.get(job.job_id)
            if after is None or (waited_s < after and not (scaling is not None and scaling.reason)):
                raise
            slots, shape = self.slots(), self._shape(job)
            fitted = policy.fit_parallelism(shape, slots)
            if fitted is None or shape.slots_needed <= slots:
                raise  # nothing fits, or the ask failed for another reason than slots
            log.warning("job %s: %d slots free of %d needed after %.1fs: scaling down to %s", job.job_id, slots,
                        shape.slots_needed, waited_s, ", ".join(f"{k}={v}" for k, v in fitted.items()))
            return self.plan(job, job.config.with_parallelism(fitted))

    def _note_parallelism(self, job: JobRecord, before: Plan | None, plan: Plan) -> None:
        """Record whether the next attempt runs below its ask, and count the scale-downs and scale-ups."""
        try:
            asked = self._asked_vertices(job)
        except RpcError:
            return
        current = {v.name: v.parallelism for v in plan.vertices}
        scaling = self.scaling.setdefault(job.job_id, Scaling())
        was_below = bool(scaling.reason)
        scaling.asked = asked
        if current == asked or set(current) != set(asked):
            scaling.at_ask()
        else:
            scaling.scaled_down(free=self.slots(), needed=max(asked.values()), now=time.time())
        change = policy.direction({v.name: v.parallelism for v in before.vertices} if before else None, current)
        if change is not None and (was_below or scaling.reason):
            if change == "down":
                scaling.scale_downs += 1
            else:
                scaling.scale_ups += 1

    def scaling_status(self, job: JobRecord) -> dict[str, Any]:
        """For `status`: each task type's current and asked parallelism, and why they differ."""
        current = {v.name: v.parallelism for v in (job.plan.vertices if job.plan else [])}
        scaling = self.scaling.get(job.job_id)
        asked = dict(scaling.asked) if scaling is not None and scaling.asked else dict(current)
        described = scaling.describe(current) if scaling is not None else Scaling().describe(current)
        return {**described, "asked": {name: asked.get(name, p) for name, p in current.items()}}

    async def run_autoscaler(self, interval_s: float = 0.5) -> None:
        """Scale jobs back up once the slots of workers registered for `scale_up_after_s` allow more."""
        while True:
            await asyncio.sleep(interval_s)
            for job in list(self.jobs.values()):
                self._maybe_scale_up(job)

    def _maybe_scale_up(self, job: JobRecord) -> None:
        scaling = self.scaling.get(job.job_id)
        if scaling is None or not scaling.reason or job.state != JobState.RUNNING or job.plan is None \
                or job.checkpoints is None or _finishing(job) or job.job_id in self._rescales:
            return
        now = time.monotonic()
        if now < scaling.next_scale_up_at:
            return
        try:
            settled = self.slots(settled_for_s=self.autoscale.scale_up_after_s)
            target = policy.fit_parallelism(self._shape(job), settled)
        except RpcError:
            return
        if not policy.should_scale_up(job.plan.config.parallelism, target):
            return
        assert target is not None
        # one try per settle period: a refused scale-up (a checkpoint that failed) is not retried in a loop
        scaling.next_scale_up_at = now + max(1.0, self.autoscale.scale_up_after_s)
        self._tasks.spawn(self._scale_up(job, target), name=f"{job.job_id} scale-up")

    async def _scale_up(self, job: JobRecord, target: dict[str, int]) -> None:
        log.info("job %s: workers are back; scaling up to %s", job.job_id,
                 ", ".join(f"{k}={v}" for k, v in target.items()))
        try:
            result = await self.rescale(job, {}, run_at=target)
        except RpcError as exc:
            log.warning("job %s: scale-up not done: %s", job.job_id, exc)
            return
        log.info("job %s scaled up to %s: down %.3fs", job.job_id, describe_parallelism(job.plan),
                 result.downtime_s)

    # -- cancelling ---------------------------------------------------------------------

    async def cancel_tasks(self, job: JobRecord, attempt: int) -> None:
        if job.plan is None:
            return
        calls = []
        for wid in set(job.plan.placement.values()):
            record = self.workers.get(wid)
            if record is not None and not record.link.is_closing():
                # the attempt fences the call: a worker already running a later attempt (of a new leader) keeps it
                calls.append(p.call(record.link, p.CancelJob(job.job_id, attempt), timeout_s=15.0))
        results = await asyncio.gather(*calls, return_exceptions=True)
        for failure in results:
            if isinstance(failure, Exception):
                log.warning("cancelling job %s on a worker failed: %s", job.job_id, failure)


def _finishing(job: JobRecord) -> bool:
    """Every task reached its end: the final checkpoint is due, the job is not rescaled any more. Some tasks at
    their end are no reason not to rescale: the checkpoint records them, the restore keeps them at their end."""
    total = job.total_tasks()
    return total > 0 and len(job.ended_tasks | job.finished_tasks) >= total


def _completed_at(path: str) -> bool:
    """Whether a checkpoint or savepoint (its directory or its `_metadata`) is there to restore."""
    metadata = path if objectstore.basename(path) == METADATA_FILE else objectstore.join(path, METADATA_FILE)
    try:
        return objectstore.exists(metadata)
    except OSError:
        return True  # the store cannot say: let the restore try it and name the error


def started_checkpoint_ids(storage: CheckpointStorage, job_id: str) -> list[int]:
    """Ids of the job's checkpoints on disk, completed or not (a directory is made when one is triggered)."""
    job_dir = getattr(storage, "job_dir", None)
    ids = [n for n, _ in storage.list_completed(job_id)]
    if job_dir is not None:
        with contextlib.suppress(OSError):
            ids += [int(name[4:]) for name in objectstore.list_children(job_dir(job_id))
                    if name.startswith("chk-") and name[4:].isdigit()]
    return ids
