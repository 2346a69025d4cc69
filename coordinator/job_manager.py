"""Job lifecycle on the coordinator: submit, deploy, finish, fail over, cancel.

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
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Callable, Coroutine, Mapping
from typing import TYPE_CHECKING, Any

from coordinator import autoscale as policy
from coordinator.autoscale import AutoscaleSettings, Scaling, ScalingStatistics, Shape
from coordinator.checkpoint_runner import CheckpointRunner
from coordinator.checkpointing import CheckpointSettings
from coordinator.jobs import JobRecord
from coordinator.metrics import DurationHistogram, JobsStatistics
from coordinator.scheduler import WorkerSlots, describe_parallelism, make_plan, merge_parallelism
from coordinator.storage import CheckpointStorage, CorruptCheckpoint
from netstack.errors import NetstackError, RpcError
from netstack.transport import Link
from runtime.api import JobDefinitionError
from runtime.common import objectstore
from runtime.graph.enums import JobState
from runtime.graph.job_config import JobConfig
from runtime.graph.plan import JobLoadError, Plan, build_job, chain_graph
from runtime.graph.rescalability import NotRestorable, checkpointed_node_parallelism, rescale_refusal
from runtime.graph.restore_spec import RestoreSpec, TaskFiles

if TYPE_CHECKING:
    from coordinator.registry import WorkerRecord

log = logging.getLogger("sluice.jobs")


class JobManager:
    def __init__(self, *, workers: Mapping[str, WorkerRecord], storage: CheckpointStorage,
                 spawn: Callable[[Coroutine[Any, Any, Any]], Any], autoscale: AutoscaleSettings | None = None,
                 persist: Callable[[JobRecord], None] = lambda job: None) -> None:
        self.workers = workers
        self.storage = storage
        self.persist = persist  # writes the job's record (coordinator/job_store.py) after every change
        self.recovered = 0  # jobs a previous coordinator left running, restarted by this one
        self.jobs: dict[str, JobRecord] = {}
        self._spawn = spawn
        self._channel_base = itertools.count(1, 1 << 20)  # each attempt gets its own range of channel ids
        self.checkpoint_durations = DurationHistogram()
        self.restart_durations = DurationHistogram()
        self._rescaling: set[str] = set()  # job ids with a rescale under way: one at a time
        self.autoscale = autoscale or AutoscaleSettings()
        self.scaling: dict[str, Scaling] = {}  # job id -> its scale-downs and scale-ups (coordinator/autoscale.py)

    def statistics(self) -> JobsStatistics:
        return JobsStatistics(tuple(j.statistics() for j in self.jobs.values()),
                              self.checkpoint_durations.statistics(), self.restart_durations.statistics(),
                              tuple(ScalingStatistics(jid, sc.scale_downs, sc.scale_ups, bool(sc.reason))
                                    for jid, sc in self.scaling.items()))

    # -- planning -----------------------------------------------------------------

    def worker_slots(self) -> list[WorkerSlots]:
        return [WorkerSlots(w.worker_id, w.slots, w.host, w.data_port)
                for w in sorted(self.workers.values(), key=lambda w: w.registered_at)]

    def plan(self, job: JobRecord, config: JobConfig | None = None) -> Plan:
        """Raises RpcError for a job module that does not import or a graph the cluster cannot run.
        `config` (default: the job's) lets a rescale try its new parallelism before it stops anything."""
        try:
            return make_plan(job_id=job.job_id, attempt=job.attempt, entry=job.entry, name=job.name,
                             sys_path=job.sys_path, config=job.config if config is None else config,
                             workers=self.worker_slots(), channel_base=next(self._channel_base))
        except (JobLoadError, JobDefinitionError) as exc:
            raise RpcError(str(exc), type(exc).__name__) from None

    async def restore_spec(self, path: str, plan: Plan) -> RestoreSpec:
        """Check that a checkpoint or savepoint fits the plan; return what workers need to restore it."""
        try:
            metadata = await asyncio.to_thread(self.storage.read_metadata, path)
            await asyncio.to_thread(self.storage.verify, path, metadata)
        except CorruptCheckpoint as exc:
            raise RpcError(str(exc), "CorruptCheckpoint") from None
        # the same operators, maybe at other parallelisms (and so chained otherwise): the workers redistribute
        # the state (checkpointing/rescaling.py); what they cannot is refused here, naming the operator
        saved = metadata.get("vertices", [])
        old = {int(v["id"]): int(v["parallelism"]) for v in saved}
        nodes: dict[int, int] = {}
        if [v["name"] for v in saved] != [v.name for v in plan.vertices] or any(
                old.get(v.id) != v.parallelism for v in plan.vertices):
            try:
                job = build_job(plan.entry, plan.name, plan.config.parallelism)  # imported already: cheap
                nodes = checkpointed_node_parallelism(saved, job, plan.vertices)
            except (JobLoadError, JobDefinitionError) as exc:
                raise RpcError(str(exc), type(exc).__name__) from None
            except NotRestorable as exc:
                raise RpcError(f"checkpoint {path} {exc}" if str(exc).startswith("was taken") else
                               f"checkpoint {path}: {exc}", "IncompatibleCheckpoint") from None
            refusal = rescale_refusal(job, plan.vertices, plan.edges, nodes)
            if refusal:
                raise RpcError(f"checkpoint {path}: {refusal}", "IncompatibleCheckpoint")
        directory = await asyncio.to_thread(self.storage.directory_of, path)
        return RestoreSpec(path=directory, checkpoint_id=int(metadata["checkpoint_id"]),
                           tasks={task: TaskFiles.from_wire(ack.get("state", {}))
                                  for task, ack in metadata["acks"].items()},
                           parallelism=old, nodes=nodes)

    def add(self, job: JobRecord) -> None:
        self.jobs[job.job_id] = job
        job.on_change = self.persist
        self.persist(job)
        self._spawn(self.deploy(job))

    def adopt(self, job: JobRecord) -> None:
        """A job from the previous coordinator's records: an ended one is shown as it ended, an unfinished one
        runs again (`recover`) once enough workers have registered."""
        self.jobs[job.job_id] = job
        job.on_change = self.persist
        if not job.terminal:
            self.recovered += 1
            self._spawn(self.recover(job))

    async def recover(self, job: JobRecord) -> None:
        """Restart a job whose coordinator died from its latest completed checkpoint, as a new attempt: the
        previous coordinator's attempt is gone with it (its workers cancelled their tasks when the link broke)."""
        # checkpoint ids go on after every one the previous coordinator may have started (sinks name files by id)
        started = await asyncio.to_thread(started_checkpoint_ids, self.storage, job.job_id)
        job.next_checkpoint_id = max([job.next_checkpoint_id, *(n + 1 for n in started)])
        log.warning("job %s was %s when the previous coordinator stopped: restarting it (attempt %d)",
                    job.job_id, job.state, job.attempt + 1)
        job.failures.append("coordinator failover")
        job.state = JobState.RESTARTING  # set, not moved: the state is the dead coordinator's, not a transition
        self.persist(job)
        try:
            await self._restart(job, None, counted=False)
        except Exception as exc:
            log.exception("job %s: recovery failed", job.job_id)
            if not job.terminal:
                job.move(JobState.FAILED, f"recovery after a coordinator failover failed: {type(exc).__name__}: "
                                          f"{exc}")

    # -- deploying ------------------------------------------------------------------

    async def deploy(self, job: JobRecord, *, failed_at: float | None = None) -> None:
        plan = job.plan
        assert plan is not None
        job.move(JobState.DEPLOYING)
        involved = sorted(set(plan.placement.values()))
        try:
            links = [self.workers[w].link for w in involved]
            plan_dict = plan.to_dict()
            await asyncio.gather(*(link.call("deploy", {"plan": plan_dict}, timeout_s=60.0) for link in links))
            if job.state != JobState.DEPLOYING:
                return
            job.move(JobState.RUNNING)
            self._start_checkpoints(job, involved)
            await asyncio.gather(*(link.call("start", {"job_id": job.job_id}) for link in links))
            if failed_at is not None:
                job.last_restart_s = time.monotonic() - failed_at
                job.restart_s.append(job.last_restart_s)
                self.restart_durations.observe(job.last_restart_s)
                log.info("job %s running again (attempt %d) %.2fs after the failure", job.job_id, job.attempt,
                         job.last_restart_s)
            else:
                log.info("job %s running on %s", job.job_id, ", ".join(involved))
        except (NetstackError, KeyError) as exc:
            await self.on_failure(job, f"deployment failed: {exc}")

    def _start_checkpoints(self, job: JobRecord, involved: list[str]) -> None:
        plan = job.plan
        assert plan is not None
        tasks = frozenset(f"{v.id}:{i}" for v in plan.vertices for i in range(v.parallelism))
        job_info = {"entry": job.entry, "name": job.name,
                    "vertices": [{"id": v.id, "name": v.name, "parallelism": v.parallelism} for v in plan.vertices]}

        def on_complete(checkpoint_id: int, path: str, summary: dict[str, Any]) -> None:
            job.last_checkpoint = {"checkpoint_id": checkpoint_id, "path": path, **summary}
            job.next_checkpoint_id = max(job.next_checkpoint_id, checkpoint_id + 1)
            self.persist(job)
            if summary.get("duration_s") is not None:
                self.checkpoint_durations.observe(summary["duration_s"])

        def links() -> list[Link]:
            # a worker whose tasks have all finished may have released the job: it takes no part any more
            busy = {w for t, w in plan.placement.items() if t not in job.finished_tasks}
            return [self.workers[w].link for w in involved if w in self.workers and w in busy]

        job.checkpoints = CheckpointRunner(
            job_id=job.job_id, attempt=job.attempt, settings=job.checkpoint_settings or CheckpointSettings(None),
            tasks=tasks, storage=self.storage, links=links, job_info=job_info,
            fail_job=lambda reason: self.fail(job, reason), on_complete=on_complete,
            first_id=job.next_checkpoint_id)
        job.checkpoints.start()

    def _stop_checkpoints(self, job: JobRecord, reason: str, *, failed: bool = True) -> None:
        runner = job.checkpoints
        if runner is None:
            return
        if failed:
            runner.task_failed(reason)
        runner.stop(reason)
        job.earlier_checkpoints = job.checkpoint_history()[-200:]
        job.checkpoints = None
        st = runner.coordinator.statistics()
        last_id = max([st.in_flight_id or 0, st.last_completed_id or 0] + [h.checkpoint_id for h in
                                                                             runner.coordinator.history()])
        job.next_checkpoint_id = max(job.next_checkpoint_id, last_id + 1)

    # -- finishing ------------------------------------------------------------------

    def task_ended(self, job: JobRecord, task: str) -> None:
        job.ended_tasks.add(task)
        if len(job.ended_tasks | job.finished_tasks) == job.total_tasks() and not job.final_requested:
            job.final_requested = True
            self._spawn(self._final_checkpoint(job))

    async def _final_checkpoint(self, job: JobRecord) -> None:
        """Every task ended: take checkpoints until one completes (its commit finishes the tasks), unless the
        attempt ends first. Aborts count against tolerable_failures like any other."""
        attempt = job.attempt
        pause_s = 0.05  # doubles up to 2 s: a checkpoint that fails at once (full disk) must not spin the loop
        while job.state == JobState.RUNNING and job.attempt == attempt and job.checkpoints is not None:
            checkpoint_id, fut = job.checkpoints.request()
            result = await fut
            if result.get("status") == "COMPLETED":
                log.info("job %s: final checkpoint %d completed", job.job_id, checkpoint_id)
                return
            if result.get("reason") == "job failed":
                return  # too many failed checkpoints: the failover (already scheduled) takes over
            # an abort answered at once resolves without suspending: let the failover and the workers run first
            await asyncio.sleep(pause_s)
            pause_s = min(2.0, pause_s * 2)

    def task_finished(self, job: JobRecord, task: str) -> None:
        job.finished_tasks.add(task)
        if job.checkpoints is not None:
            job.checkpoints.task_finished(task)  # later checkpoints record it as finished
        if len(job.finished_tasks) == job.total_tasks():
            job.move(JobState.FINISHING)
            if job.checkpoints is not None:
                job.final_checkpoint_id = job.checkpoints.coordinator.statistics().last_completed_id
            self._stop_checkpoints(job, "job finished", failed=False)
            job.move(JobState.FINISHED)
            log.info("job %s finished (final checkpoint %s)", job.job_id, job.final_checkpoint_id)

    # -- failures ---------------------------------------------------------------------

    def fail(self, job: JobRecord, cause: str) -> None:
        """The one entry point for a failure of a running attempt: failover runs as a task of the manager's own,
        never inside a checkpoint runner or an attempt that the failover is about to stop (which would cancel
        the failover itself and leave the job RESTARTING forever)."""
        self._spawn(self.on_failure(job, cause))

    def worker_lost(self, worker_id: str, why: str) -> None:
        for job in list(self.jobs.values()):
            if job.state in (JobState.DEPLOYING, JobState.RUNNING, JobState.FINISHING) and job.plan is not None \
                    and worker_id in job.plan.placement.values():
                self.fail(job, f"worker {worker_id} lost: {why}")

    async def on_failure(self, job: JobRecord, error: str) -> None:
        """Cancel the attempt; restart from the latest checkpoint if the strategy allows, else fail the job.

        Whatever goes wrong on the way (other than a cancel of the coordinator itself), the job ends RESTARTING
        -> running again, or FAILED with its cause: never stuck in RESTARTING."""
        try:
            await self._failover(job, error)
        except Exception as exc:
            log.exception("job %s: failover failed", job.job_id)
            if not job.terminal:
                job.move(JobState.FAILED, f"{error} (failover failed: {type(exc).__name__}: {exc})")
                await self.cancel_tasks(job)

    async def _failover(self, job: JobRecord, error: str) -> None:
        if job.terminal or job.state == JobState.RESTARTING:
            return
        failed_at = time.monotonic()
        job.failures.append(error)
        self._stop_checkpoints(job, error)
        strategy = job.restart_strategy
        delay = strategy.delay_before(job.restarts + 1) if strategy is not None else None
        if delay is None:
            tried = f" after {job.restarts} restarts" if job.restarts else ""
            log.error("job %s failed%s: %s", job.job_id, tried, error)
            job.move(JobState.FAILED, f"{error}{' (restart attempts exhausted)' if job.restarts else ''}")
            await self.cancel_tasks(job)
            return
        log.error("job %s: %s; restarting in %.1fs (restart %d of %d)", job.job_id, error, delay,
                  job.restarts + 1, strategy.max_attempts)
        job.move(JobState.RESTARTING)  # the cause is in job.failures; job.error is kept for a final failure
        await self.cancel_tasks(job)
        await asyncio.sleep(delay)
        await self._restart(job, failed_at)

    async def _restart(self, job: JobRecord, failed_at: float | None, *, counted: bool = True,
                       run_at: dict[str, int] | None = None) -> None:
        """Plan the next attempt, attach the latest checkpoint and deploy; `failed_at` None and `counted` False
        for a rescale, which is no failure (its downtime is the rescale's own figure, not a restart's). `run_at`
        (operator name -> parallelism): the first attempt runs at it rather than at the ask (a scale-up)."""
        strategy = job.restart_strategy
        while job.state == JobState.RESTARTING:
            if counted:
                job.restarts += 1
            counted = True  # a redeploy that failed and is tried again is a restart like any other
            job.attempt += 1
            started = time.monotonic()
            deadline = started + strategy.slot_wait_s
            plan: Plan | None = None
            error = ""
            while job.state == JobState.RESTARTING and time.monotonic() < deadline:
                try:
                    plan = self._plan_attempt(job, waited_s=time.monotonic() - started, run_at=run_at)
                    break
                except RpcError as exc:  # typically: not enough slots until a worker comes back
                    error = str(exc)
                    await asyncio.sleep(0.2)
            if job.state != JobState.RESTARTING:
                return
            if plan is not None:
                try:
                    await self._attach_latest_checkpoint(job, plan)
                except RpcError as exc:
                    plan, error = None, f"cannot restore: {exc}"
            run_at = None  # a scale-up that did not deploy falls back to the usual policy
            if plan is not None:
                self._note_parallelism(job, job.plan, plan)
                job.plan = plan
                job.finished_tasks = set()
                job.ended_tasks = set()
                job.final_requested = False
                job.task_stats = {}
                await self.deploy(job, failed_at=failed_at)
                return
            job.failures.append(error)
            delay = strategy.delay_before(job.restarts + 1)
            if delay is None:
                job.move(JobState.FAILED, f"{error} (restart attempts exhausted)")
                return
            await asyncio.sleep(delay)

    async def _attach_latest_checkpoint(self, job: JobRecord, plan: Plan) -> None:
        """The newest retained checkpoint that is intact; a corrupt one is skipped (and logged) for the one
        before it, down to the checkpoint the job was submitted with."""
        completed = await asyncio.to_thread(self.storage.list_completed, job.job_id)
        candidates = [p for _, p in reversed(completed)] + ([job.restored_from] if job.restored_from else [])
        if not candidates:
            job.restored_checkpoint_id = None
            return  # no checkpoint yet: start from scratch; sinks drop the earlier attempt's uncommitted files
        for path in candidates[:-1]:
            try:
                plan.restore = await self.restore_spec(path, plan)
                break
            except RpcError as exc:
                if exc.remote_type != "CorruptCheckpoint":
                    raise
                log.error("job %s: skipping checkpoint %s for an older one: %s", job.job_id, path, exc)
        else:
            path = candidates[-1]
            plan.restore = await self.restore_spec(path, plan)
        job.restored_checkpoint_id = plan.restore.checkpoint_id
        log.info("job %s: attempt %d restores checkpoint %s", job.job_id, job.attempt, path)

    # -- rescaling a running job -------------------------------------------------------

    async def rescale(self, job: JobRecord, requested: dict[str, int], *, timeout_s: float = 600.0,
                      run_at: dict[str, int] | None = None) -> dict[str, Any]:
        """Checkpoint the running job in its own mode (unaligned stays unaligned: no savepoint, no draining), stop
        the attempt and redeploy the same job at the new parallelism from that checkpoint, through the failover's
        own restart path. Every refusal (not running, too few slots, a failed checkpoint, a plan that cannot be
        rescaled) is one RpcError line raised before anything is stopped: the job keeps running unchanged.
        With `run_at` (a scale-up: operator name -> parallelism, up to the ask) the ask is kept and the job
        redeploys at `run_at`."""
        if job.job_id in self._rescaling:
            raise RpcError(f"job {job.job_id} is being rescaled already", "JobNotRunning")
        if job.state != JobState.RUNNING or job.checkpoints is None or job.ended_tasks or job.finished_tasks:
            why = "finishing" if job.state == JobState.RUNNING else job.state
            raise RpcError(f"job {job.job_id} is {why}, not RUNNING: nothing to rescale", "JobNotRunning")
        if run_at is None:
            config = job.config.with_parallelism(merge_parallelism(job.config.parallelism, requested))
            trial = self.plan(job, config)  # too many slots, an unknown operator, a forward edge torn apart
        else:
            config = job.config
            trial = self.plan(job, config.with_parallelism(run_at))
        self._rescaling.add(job.job_id)
        try:
            runner = job.checkpoints
            checkpoint_id, fut = runner.request()
            result = await asyncio.wait_for(fut, timeout_s)
            if result.get("status") != "COMPLETED":
                raise RpcError(f"job {job.job_id} not rescaled: checkpoint {checkpoint_id} did not complete "
                               f"({result.get('reason') or result.get('status')}); it keeps running unchanged",
                               "RescaleCheckpointFailed")
            await self.restore_spec(str(result["path"]), trial)  # the restore refusals (sources, broadcast edges)
            if job.state != JobState.RUNNING or job.checkpoints is not runner:
                raise RpcError(f"job {job.job_id} is {job.state} (attempt {job.attempt}) after the checkpoint: "
                               "not rescaled", "JobNotRunning")
            stopped_at = time.monotonic()
            attempt = job.attempt
            log.info("job %s: stopping attempt %d to rescale it to %s from checkpoint %d", job.job_id, attempt,
                     describe_parallelism(trial), checkpoint_id)
            job.config = config
            job.move(JobState.RESTARTING)
            self._stop_checkpoints(job, f"rescale to {describe_parallelism(trial)}", failed=False)
            await self.cancel_tasks(job)
            await self._restart(job, None, counted=False, run_at=run_at)
        finally:
            self._rescaling.discard(job.job_id)
        if job.state != JobState.RUNNING or job.attempt <= attempt:
            raise RpcError(f"job {job.job_id} stopped for the rescale but is {job.state} now: {job.error or ''}"
                           .rstrip(": "), "RescaleFailed")
        downtime_s = time.monotonic() - stopped_at
        job.rescale_s.append(downtime_s)
        log.info("job %s rescaled to %s from checkpoint %s: down %.3fs", job.job_id,
                 describe_parallelism(job.plan), job.restored_checkpoint_id, downtime_s)
        used: dict[str, Any] = next((h for h in reversed(job.checkpoint_history())
                     if h.get("checkpoint_id") == job.restored_checkpoint_id), {})
        return {"job_id": job.job_id, "attempt": job.attempt, "downtime_s": downtime_s,
                "checkpoint_id": job.restored_checkpoint_id, "requested_checkpoint_id": checkpoint_id,
                "inflight_bytes": used.get("inflight_bytes"), "mode": used.get("mode"),
                "vertices": [{"name": v.name, "parallelism": v.parallelism}
                             for v in (job.plan.vertices if job.plan else [])]}

    # -- scaling down and up (the policy is coordinator/autoscale.py) ----------------------

    def _shape(self, job: JobRecord) -> Shape:
        """The job's operators at their asked parallelism; RpcError if the job no longer builds."""
        try:
            return policy.shape_of(build_job(job.entry, job.name, job.config.parallelism))
        except (JobLoadError, JobDefinitionError) as exc:
            raise RpcError(str(exc), type(exc).__name__) from None

    def _asked_vertices(self, job: JobRecord) -> dict[str, int]:
        """Task type name -> asked parallelism (the chaining of a shrunk job is the same: autoscale.py)."""
        try:
            vertices, _ = chain_graph(build_job(job.entry, job.name, job.config.parallelism))
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
                or job.checkpoints is None or job.ended_tasks or job.finished_tasks or job.job_id in self._rescaling:
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
        self._spawn(self._scale_up(job, target))

    async def _scale_up(self, job: JobRecord, target: dict[str, int]) -> None:
        log.info("job %s: workers are back; scaling up to %s", job.job_id,
                 ", ".join(f"{k}={v}" for k, v in target.items()))
        try:
            result = await self.rescale(job, {}, run_at=target)
        except RpcError as exc:
            log.warning("job %s: scale-up not done: %s", job.job_id, exc)
            return
        log.info("job %s scaled up to %s: down %.3fs", job.job_id, describe_parallelism(job.plan),
                 result["downtime_s"])

    # -- cancelling ---------------------------------------------------------------------

    async def cancel(self, job: JobRecord, why: str) -> None:
        if job.terminal:
            return
        job.move(JobState.CANCELLED, why)
        self._stop_checkpoints(job, why)
        await self.cancel_tasks(job)

    async def cancel_tasks(self, job: JobRecord) -> None:
        if job.plan is None:
            return
        calls = []
        for wid in set(job.plan.placement.values()):
            record = self.workers.get(wid)
            if record is not None and not record.link.is_closing():
                # the attempt fences the call: a worker already running a later attempt (of a new leader) keeps it
                calls.append(record.link.call("cancel", {"job_id": job.job_id, "attempt": job.attempt},
                                              timeout_s=15.0))
        results = await asyncio.gather(*calls, return_exceptions=True)
        for r in results:
            if isinstance(r, Exception):
                log.warning("cancelling job %s on a worker failed: %s", job.job_id, r)


def started_checkpoint_ids(storage: CheckpointStorage, job_id: str) -> list[int]:
    """Ids of the job's checkpoints on disk, completed or not (a directory is made when one is triggered)."""
    job_dir = getattr(storage, "job_dir", None)
    ids = [n for n, _ in storage.list_completed(job_id)]
    if job_dir is not None:
        with contextlib.suppress(OSError):
            ids += [int(name[4:]) for name in objectstore.list_children(job_dir(job_id))
                    if name.startswith("chk-") and name[4:].isdigit()]
    return ids
