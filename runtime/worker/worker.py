"""The worker process: hosts task slots, runs subtasks on one event loop, talks to the coordinator.

It registers with the coordinator over an RPC link, heartbeats with its
task statistics, and serves the coordinator's calls: deploy (build tasks and
wire channels), start, cancel. Data flows over the `NetworkEnvironment`.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import resource
import secrets
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry

from netstack.connection import Connection
from netstack.errors import (
    CloseReason,
    Conflict,
    ConnectionLost,
    InvalidRequest,
    JobNotFound,
    MethodNotFound,
    NetstackError,
    NotLeader,
    RpcError,
)
from netstack.limits import ListenerLimits
from netstack.metrics_http import serve_metrics
from netstack.tls import TlsFiles, http_server_context
from netstack.transport import BaseLinkHandler, Link, dial
from runtime.checkpointing.barriers import BarrierSpec
from runtime.checkpointing.writer import CheckpointWriter
from runtime.common.addresses import advertised_host, local_address_towards
from runtime.common.backoff import backoff_delays
from runtime.common.dispatch import BadArguments, HandlerTable, UnknownMethod, typed_handlers
from runtime.common.tasks import BackgroundTasks
from runtime.execution.isolation import IsolationSettings
from runtime.execution.mailbox import InjectProbe
from runtime.execution.task import Task, TaskCancelled
from runtime.execution.user_code import CallWatchdog, RunningCall, SlowCall, stack_frames, user_function
from runtime.graph import protocol as p
from runtime.graph import replies as r
from runtime.graph.checkpoint_figures import TaskCheckpointFigures
from runtime.graph.enums import TaskState
from runtime.graph.plan import Plan
from runtime.worker.ack_batcher import AckBatcher
from runtime.worker.connector_metrics import task_figures
from runtime.worker.deployment import CheckpointHooks, DeployedJob, connect, deploy, teardown
from runtime.worker.heartbeat_reports import ReportDeltas
from runtime.worker.log_tail import LogTail, process_figures
from runtime.worker.metrics import WorkerCollector
from runtime.worker.network import NetworkEnvironment
from runtime.worker.profiler import Profiler, find_py_spy

log = logging.getLogger("sluice.worker")

EXIT_USER_CODE_STUCK = 70  # a cancelled task's user call never returned (Flink: a fatal error of the TaskManager)


COORDINATOR_CALL_TIMEOUT_S = 10.0  # see Worker._coordinator_call_timeout_s


@dataclass(frozen=True)
class WorkerConfig:
    coordinator_host: str
    coordinator_port: int
    token: str
    slots: int = 2
    host: str = "127.0.0.1"  # the address to bind (0.0.0.0: every interface)
    data_port: int = 0
    advertise: str = ""  # the data address other workers dial ("": host, or the one facing the coordinator)
    metrics_port: int | None = 0
    worker_id: str = ""
    heartbeat_interval_s: float = 1.0
    limits: ListenerLimits = field(default_factory=ListenerLimits)  # of the data listener
    tls: TlsFiles | None = None  # data links and the link to the coordinator; None: plain TCP
    link_timeout_s: float = 10.0  # a data link silent this long is closed and its tasks fail (0: never)
    # every coordinator that may lead (leader and standbys), tried in turn; empty: coordinator_host:port alone
    coordinator_addresses: tuple[tuple[str, int], ...] = ()
    register_timeout_s: float = 30.0  # at start-up, give up when no coordinator accepted us within this long
    # a heartbeat unanswered this long makes the worker ask the other coordinators of the list whether one of them
    # leads now: a paused leader's link stays open, and the call's own timeout would stall the job ~10 s more
    leader_check_s: float = 1.0
    # user code (runtime/execution/user_code.py): a call running this long is reported (log, metric, the job's
    # exception history); a cancelled task whose call has not returned this long after fails the worker
    slow_call_s: float = 5.0
    task_cancel_timeout_s: float = 60.0
    memory_limit_bytes: int | None = None  # RLIMIT_AS of the worker process: a leaking function gets MemoryError
    # where its tasks run user code and the loop's blocked wait for a run (SLUICE_TASK_ISOLATION, SLUICE_SYNC_WAIT_S)
    isolation: IsolationSettings = field(default_factory=IsolationSettings)

    def coordinators(self) -> tuple[tuple[str, int], ...]:
        return self.coordinator_addresses or ((self.coordinator_host, self.coordinator_port),)


class NoCoordinator(ConnectionLost):
    """No coordinator took this worker's registration; `transient` when another try may find one."""

    def __init__(self, message: str, *, transient: bool) -> None:
        super().__init__(message, CloseReason.IO_ERROR)
        self.transient = transient


def task_report(job_id: str, task: Task) -> dict[str, Any]:
    """A task's statistics as sent to the coordinator (heartbeats, task_finished), with its connectors' figures
    (Kafka lag per partition, open transactions, ...) as their metric samples: the REST API shows them."""
    return {**asdict(task.statistics()), "job": job_id, "task": task.task_id, "name": task.name,
            "state": task.state, "attempt": task.chain.attempt,
            "connectors": [f.document() for f in task_figures(task.source, task.chain.sinks)]}


class Worker(BaseLinkHandler):
    def __init__(self, config: WorkerConfig) -> None:
        self.config = config
        self.worker_id = config.worker_id or f"w-{socket.gethostname()[:12]}-{os.getpid()}-{secrets.token_hex(2)}"
        self.network = NetworkEnvironment(self.worker_id, token=config.token, host=config.host, limits=config.limits,
                                          tls=config.tls, link_timeout_s=config.link_timeout_s)
        self.network.on_link_lost = self._on_link_lost
        self.jobs: dict[str, DeployedJob] = {}
        self.coordinator: Link | None = None
        self._coordinator_address: tuple[str, int] | None = None  # where self.coordinator leads
        self._leader_hint: tuple[str, int] | None = None  # a coordinator that answered as the leader: tried first
        self.metrics_port: int | None = None
        self._stop = asyncio.Event()
        self._background = BackgroundTasks("worker")
        self.writer: CheckpointWriter | None = None
        # the tasks' checkpoint acknowledgements, one call per job attempt and millisecond
        self.acks = AckBatcher(lambda batch: self._spawn(self._report(batch)))
        self.reports = ReportDeltas()  # the heartbeats' task entries: whole reports, then only what changed
        self._leaving: list[asyncio.Future[Any]] = []  # cancels of the jobs of a coordinator that went away
        self.advertised = config.advertise or config.host  # settled in run(), before registering
        self.log_tail = LogTail()  # the recent log lines, for the worker's page in the web UI
        self.profiler = Profiler(executable=find_py_spy())  # py-spy on this process, for the UI's flame graph
        self.rpc = self._handlers()

    def all_tasks(self) -> Iterator[tuple[str, Task]]:
        for job_id, deployed in list(self.jobs.items()):
            for task in deployed.tasks.values():
                yield job_id, task

    # -- lifecycle --------------------------------------------------------------

    async def run(self) -> None:
        logging.getLogger().addHandler(self.log_tail)
        try:
            await self._run()
        finally:
            logging.getLogger().removeHandler(self.log_tail)

    async def _run(self) -> None:
        self.writer = CheckpointWriter()
        data_port = await self.network.start(self.config.data_port)
        if self.config.metrics_port is not None:
            registry = CollectorRegistry()
            registry.register(WorkerCollector(self))
            # over TLS with the data links' certificate when TLS is configured (Prometheus scrapes https)
            tls = self.config.tls
            self.metrics_port = (await serve_metrics(
                registry, self.config.host, self.config.metrics_port,
                ssl_context=http_server_context(tls) if tls and tls.cert else None)).port
        self.advertised = advertised_host(self.config.host, self.config.advertise, fallback=lambda: (
            local_address_towards(self.config.coordinator_host, self.config.coordinator_port)))
        await self._first_registration(data_port)
        metrics = f"{self.config.host}:{self.metrics_port}" if self.metrics_port is not None else "off"
        print(f"sluice worker ready id={self.worker_id} data={self.advertised}:{data_port} metrics={metrics} "
              f"bind={self.config.host}", flush=True)
        heartbeat = self._spawn(self._heartbeat_loop(data_port))
        watchdog = self._start_watchdog()
        try:
            await self._stop.wait()
        finally:
            watchdog.stop()
        heartbeat.cancel()
        await self.shutdown()

    # -- user code (runtime/execution/user_code.py) ----------------------------------------------

    def _start_watchdog(self) -> CallWatchdog:
        loop = asyncio.get_running_loop()

        def running_calls() -> Iterator[RunningCall]:  # on the watchdog's thread: reads only
            for _, task in self.all_tasks():
                call = task.running_call()
                if call is not None:
                    yield call

        def on_slow(slow: SlowCall) -> None:  # on the watchdog's thread
            loop.call_soon_threadsafe(self._on_slow_call, slow)

        watchdog = CallWatchdog(running_calls, slow_call_s=self.config.slow_call_s, on_slow=on_slow,
                                loop_thread=threading.get_ident())

        async def tell_alive() -> None:
            while True:
                watchdog.loop_alive()
                await asyncio.sleep(min(0.25, self.config.slow_call_s / 4))

        self._spawn(tell_alive())
        watchdog.start()
        return watchdog

    def _on_slow_call(self, slow: SlowCall) -> None:
        for job_id, task in self.all_tasks():
            if task.task_id == slow.task_id:
                task.slow_calls += 1
                self._spawn(self._report(p.SlowCall(job_id, task.chain.attempt, task.key.vertex_subtask,
                                                    function=slow.function, stack=slow.stack,
                                                    running_s=round(slow.running_s, 1))))
                return

    def _user_code_stuck(self, task: Task) -> None:
        """A stopped task's thread is still in a user call after the cancel timeout: Python cannot end a thread,
        and one left behind may hold the GIL, memory or a lock for good. Fail the worker, as Flink's task
        cancellation watchdog does; its supervisor starts a fresh process and the coordinator restarts the
        jobs that were on it from their checkpoints."""
        call = task.running_call()
        frames = sys._current_frames().get(call.thread_ident) if call is not None else None
        stack = "".join(traceback.format_stack(frames)) if frames is not None else "?"
        function = user_function(stack_frames(frames)) if frames is not None else "?"
        log.critical("task %s did not stop within %.0f s of its cancel: user call %s never returned; the worker "
                     "exits (status %d) so that a fresh one takes its place. Its stack:\n%s", task.task_id,
                     task.cancel_timeout_s, function, EXIT_USER_CODE_STUCK, stack)
        logging.shutdown()
        os._exit(EXIT_USER_CODE_STUCK)

    def stop(self) -> None:
        self._stop.set()

    async def shutdown(self) -> None:
        for job_id in list(self.jobs):
            await self._cancel_job(job_id, report=False)
        if self.coordinator is not None:
            self.coordinator.close("worker stopping")
        await self.network.close()
        await self._background.cancel_and_wait()  # reports and job cancellations end before the writer closes
        if self.writer is not None:
            await asyncio.to_thread(self.writer.close)

    def _spawn(self, coro: Any) -> asyncio.Future[Any]:
        return self._background.spawn(coro)

    async def _first_registration(self, data_port: int) -> None:
        """Register at start-up, trying again (a coordinator or its standby may still be starting) until
        register_timeout_s; then the worker exits with the last reason."""
        deadline = time.monotonic() + self.config.register_timeout_s
        delays = backoff_delays()
        while True:
            try:
                await self._connect_coordinator(data_port)
                return
            except NetstackError as exc:
                if time.monotonic() >= deadline or not (isinstance(exc, NoCoordinator) and exc.transient):
                    raise
                log.warning("%s; trying again", exc)
            await asyncio.sleep(next(delays))

    async def _connect_coordinator(self, data_port: int) -> None:
        """Register with the leading coordinator: the first address that takes the registration (a standby
        answers NotLeader, a dead coordinator refuses the connection). Raises ConnectionLost naming each."""
        if self._leaving:  # the old attempt's channels are torn down before a new coordinator may deploy
            await asyncio.wait(self._leaving)
            self._leaving = []
        errors = []
        transient = True  # every address refused the connection or is not the leader: worth trying again
        addresses = list(self.config.coordinators())
        if self._leader_hint in addresses:  # a paused former leader would hold the dial until its timeout
            addresses.remove(self._leader_hint)
            addresses.insert(0, self._leader_hint)
        self._leader_hint = None
        for host, port in addresses:
            conn = Connection(local_id=self.worker_id, role="worker", token=self.config.token, is_client=True)
            try:
                link = await dial(host, port, conn, self, ssl_context=self.network.client_ssl, timeout_s=5.0)
            except NetstackError as exc:
                transient &= coordinator_unavailable(exc)
                errors.append(f"{host}:{port}: {exc}")
                continue
            try:
                await p.call(link, p.Register(
                    slots=self.config.slots, host=self.advertised, data_port=data_port, id=self.worker_id,
                    metrics_port=self.metrics_port, pid=os.getpid()), timeout_s=10.0)
            except NetstackError as exc:
                link.close("not registered")
                transient &= coordinator_unavailable(exc)
                errors.append(f"{host}:{port}: {exc}")
                continue
            self.coordinator = link
            self._coordinator_address = (host, port)
            return
        raise NoCoordinator(f"no coordinator took the registration ({'; '.join(errors)})", transient=transient)

    async def _heartbeat_loop(self, data_port: int) -> None:
        # after a failure the worker dials again with jittered backoff (capped at 2 s), not in step with
        # every other worker of the cluster, until a coordinator (restarted, or a standby that took over) takes it
        delays: Iterator[float] | None = None
        while True:
            await asyncio.sleep(self.config.heartbeat_interval_s if delays is None else next(delays))
            try:
                if self.coordinator is None or self.coordinator.is_closing():
                    self.reports.reset()  # a new registration: the coordinator holds none of our reports
                    await self._connect_coordinator(data_port)
                    assert self.coordinator is not None
                    log.info("re-registered with %s", self.coordinator.describe())
                entries = self.reports.entries(self._task_report())
                beat = p.Heartbeat(self.worker_id, entries.whole, process=process_figures(), changes=entries.changes)
                await self._heartbeat(self.coordinator, beat)
                self.reports.confirmed()
                delays = None
            except NetstackError as exc:
                self.reports.reset()  # the coordinator may or may not have applied it: whole reports next
                log.warning("heartbeat to coordinator failed: %s", exc)
                if delays is None:
                    delays = backoff_delays(base_s=0.1, cap_s=2.0)
                if self.coordinator is not None:
                    self.coordinator.abort()
                    self.coordinator = None

    async def _heartbeat(self, link: Link, beat: p.Heartbeat) -> None:
        """One heartbeat. While it goes unanswered, ask every `leader_check_s` whether another coordinator of the
        list leads now (it took the lease of a paused leader): then leave the old one at once, like a failed
        heartbeat, and register with the new leader first."""
        call = asyncio.ensure_future(p.call(link, beat, timeout_s=self._coordinator_call_timeout_s()))
        try:
            while True:
                done, _ = await asyncio.wait({call}, timeout=self.config.leader_check_s)
                if done:
                    call.result()
                    return
                leader = await self._another_leader()
                if leader is not None:
                    self._leader_hint = leader
                    raise ConnectionLost(f"no answer for {self.config.leader_check_s:g}s, and "
                                         f"{leader[0]}:{leader[1]} leads now", CloseReason.TIMEOUT)
        finally:
            call.cancel()

    def _coordinator_call_timeout_s(self) -> float:
        """How long a heartbeat or report waits for the coordinator's answer: 10 s, or the link timeout when that
        is longer. A busy coordinator that answers late is not a lost one (100 workers deploying 1,000 tasks on 2
        cores kept it from answering for over 10 s; the worker then dropped its link, and the coordinator the
        worker and its job's attempt, although both had --heartbeat-timeout and --link-timeout 60 s)."""
        return max(COORDINATOR_CALL_TIMEOUT_S, self.config.link_timeout_s)

    async def _another_leader(self) -> tuple[str, int] | None:
        """The first other coordinator of the list that answers as the leader (a standby answers NotLeader)."""
        for host, port in self.config.coordinators():
            if (host, port) == self._coordinator_address:
                continue
            conn = Connection(local_id=self.worker_id, role="worker", token=self.config.token, is_client=True)
            try:
                link = await dial(host, port, conn, self, ssl_context=self.network.client_ssl, timeout_s=2.0)
            except NetstackError:
                continue
            try:
                await p.call(link, p.Overview(), timeout_s=2.0)
                return host, port
            except NotLeader:
                continue
            except RpcError:
                return host, port  # it served the call (and refused it): it leads
            except NetstackError:
                continue
            finally:
                link.close("leader probe")
        return None

    def _task_report(self) -> list[dict[str, Any]]:
        return [task_report(job_id, task) for job_id, task in self.all_tasks()]

    # -- RPC from the coordinator ------------------------------------------------

    def _handlers(self) -> HandlerTable[Link]:
        """Every call the coordinator makes on this worker."""
        # each call decoded into its typed message (runtime/graph/protocol.py) before its handler runs
        handlers: list[tuple[type[Any], Any]] = [
            (p.Deploy, lambda link, m: self._deploy(Plan.from_dict(dict(m.plan)))),
            (p.StartJob, lambda link, m: self._start(m.job_id)),
            (p.CancelJob, lambda link, m: self._rpc_cancel(m.job_id, m.attempt)),
            (p.TriggerCheckpoint, lambda link, m: self._trigger_checkpoint(m)),
            (p.CheckpointNotice, lambda link, m: self._notify_tasks(m.job_id, m.attempt, True, m.checkpoint_id)),
            (p.CheckpointAborted, lambda link, m: self._notify_tasks(m.job_id, m.attempt, False, m.checkpoint_id)),
            (p.InjectProbe, lambda link, m: self._inject_probe(m.job_id, m.probe_id)),
            (p.LogTail, lambda link, m: r.LogLines(self.log_tail.tail(m.lines), worker_id=self.worker_id)),
            (p.Profile, lambda link, m: self._profile(m.seconds)),
        ]
        return HandlerTable({**typed_handlers(handlers),
                             "ping": lambda link, args: {"id": self.worker_id, "time": time.time()}})

    async def on_rpc(self, link: Link, method: str, args: dict[str, Any]) -> Any:
        try:
            return await self.rpc.dispatch(link, method, args)
        except UnknownMethod as exc:
            raise MethodNotFound(str(exc)) from None
        except BadArguments as exc:
            raise InvalidRequest(str(exc), "BadArgs") from None

    async def _profile(self, seconds: int) -> r.Profile:
        """py-spy's collapsed stacks of this process over `seconds` (runtime/worker/profiler.py)."""
        profile = await self.profiler.record(seconds)
        return r.Profile(self.worker_id, profile.seconds, profile.rate_hz, profile.samples,
                         [stack.to_wire() for stack in profile.stacks], profile.dropped_samples)

    async def _rpc_cancel(self, job_id: str, attempt: int | None = None) -> r.CancelledHere:
        deployed = self.jobs.get(job_id)
        if attempt is not None and deployed is not None and deployed.plan.attempt > attempt:
            # from a coordinator that lost its lease while a new leader redeployed the job: not ours to stop
            log.warning("ignoring a cancel of job %s attempt %s: attempt %d runs here", job_id, attempt,
                        deployed.plan.attempt)
            return r.CancelledHere(False)
        await self._cancel_job(job_id, report=False)
        return r.CancelledHere(True)

    async def _deploy(self, plan: Plan) -> r.Deployed:
        if plan.job_id in self.jobs:
            await self._cancel_job(plan.job_id, report=False)
        deployed = await deploy(plan, self.worker_id, self.network, self._checkpoint_hooks(plan),
                                isolation=self.config.isolation)
        self.jobs[plan.job_id] = deployed
        try:
            await connect(deployed, self.network)
        except Exception:
            # a peer that died before it dialed us keeps this waiting up to connect's timeout; meanwhile the
            # coordinator may have cancelled this attempt and deployed the next: that one is not ours to drop
            if self.jobs.get(plan.job_id) is deployed:
                self.jobs.pop(plan.job_id)
                teardown(deployed, self.network)
            raise
        log.info("deployed %d tasks of job %s (attempt %d)", len(deployed.tasks), plan.job_id, plan.attempt)
        return r.Deployed(sorted(deployed.tasks))

    def _running_job(self, job_id: str) -> DeployedJob:
        deployed = self.jobs.get(job_id)
        if deployed is None:
            raise JobNotFound(f"job {job_id} is not deployed here")
        return deployed

    def _trigger_checkpoint(self, args: p.TriggerCheckpoint) -> r.SourcesReached:
        deployed = self._running_job(args.job_id)
        if args.attempt != deployed.plan.attempt:
            raise Conflict(f"attempt {args.attempt} is not the one running here", "WrongAttempt")
        spec = BarrierSpec(args.checkpoint_id, args.started_at, args.options, args.directory)
        # Running sources start the checkpoint; tasks past their end of input, or whose every input's end has
        # reached their gate, get no barrier any more, so they are triggered directly; finished tasks are
        # recorded as finished by the coordinator.
        triggered = 0
        for key, task in deployed.tasks.items():
            listener = deployed.checkpoints[key]
            if listener.latest_spec is None or spec.checkpoint_id > listener.latest_spec.checkpoint_id:
                listener.latest_spec = spec
            listener.remember(spec)
            if task.state in (TaskState.CREATED, TaskState.RUNNING) and (
                    task.source is not None or task.end_of_input or listener.inputs_ended()):
                listener.trigger(spec)
                triggered += 1
        return r.SourcesReached(triggered)

    def _notify_tasks(self, job_id: str, attempt: int | None, completed: bool, checkpoint_id: int) -> r.Notified:
        deployed = self.jobs.get(job_id)
        if deployed is None or deployed.plan.attempt != attempt:
            return r.Notified(0)  # another attempt's notification: its sinks must not commit ours
        for checkpoints in deployed.checkpoints.values():
            if completed:
                checkpoints.notify_complete(checkpoint_id)
            else:
                checkpoints.notify_aborted(checkpoint_id)
        return r.Notified(len(deployed.tasks))

    def _checkpoint_hooks(self, plan: Plan) -> CheckpointHooks:
        assert self.writer is not None
        job_id, attempt = plan.job_id, plan.attempt

        def on_ack(task: Task, spec: BarrierSpec, files: dict[str, Any], figures: TaskCheckpointFigures) -> None:
            self.acks.add(p.AckCheckpoint(job_id, attempt, task.key.vertex_subtask, spec.checkpoint_id, files,
                                          figures))

        def on_decline(task: Task, checkpoint_id: int, reason: str) -> None:
            log.warning("task %s declined checkpoint %d: %s", task.task_id, checkpoint_id, reason)
            self._spawn(self._report(p.DeclineCheckpoint(job_id, attempt, task.key.vertex_subtask, checkpoint_id,
                                                         reason)))

        return CheckpointHooks(self.writer, on_ack, on_decline)

    def _inject_probe(self, job_id: str, probe_id: int) -> r.SourcesReached:
        deployed = self.jobs.get(job_id)
        if deployed is None:
            raise JobNotFound(f"job {job_id} is not deployed here")
        sources = [t for t in deployed.tasks.values() if t.source is not None and t.state == TaskState.RUNNING]
        for task in sources:
            task.post(InjectProbe(probe_id))
        return r.SourcesReached(len(sources))

    def _probe_complete(self, job_id: str, attempt: int, task: Task, probe_id: int, overtaken_out: int,
                        overtaken_in: int) -> None:
        self._spawn(self._report(p.ProbeDone(job_id, attempt, task.task_id, probe_id, overtaken_out, overtaken_in)))

    def _start(self, job_id: str) -> r.Started:
        deployed = self.jobs.get(job_id)
        if deployed is None:
            raise JobNotFound(f"job {job_id} is not deployed here")
        for key, task in deployed.tasks.items():
            task.on_probe_complete = functools.partial(self._probe_complete, job_id, deployed.plan.attempt)
            task.on_end_of_input = functools.partial(self._task_ended, job_id, key, deployed.plan.attempt)
            task.cancel_timeout_s = self.config.task_cancel_timeout_s
            if self.config.task_cancel_timeout_s > 0:
                task.on_stuck = self._user_code_stuck
            runner = asyncio.create_task(task.run(), name=task.task_id)
            deployed.running[key] = runner
            runner.add_done_callback(functools.partial(self._on_task_done, job_id, key))
        return r.Started(len(deployed.tasks))

    def _task_ended(self, job_id: str, key: str, attempt: int, task: Task) -> None:
        """The coordinator takes the job's final checkpoint once every task has ended."""
        self._spawn(self._report(p.TaskEnded(job_id, attempt, key)))

    def _on_task_done(self, job_id: str, key: str, runner: asyncio.Task[None]) -> None:
        deployed = self.jobs.get(job_id)
        if deployed is None or deployed.running.get(key) is not runner:
            return
        if runner.cancelled():
            return
        exc = runner.exception()
        if isinstance(exc, TaskCancelled):
            return
        task = deployed.tasks[key]
        stats = task_report(job_id, task)
        if exc is None:
            self._spawn(self._report(p.TaskFinished(job_id, deployed.plan.attempt, key, stats=stats)))
        else:
            log.error("task %s/%s failed: %s: %s", job_id, key, type(exc).__name__, exc, exc_info=exc)
            self._spawn(self._report(p.TaskFailed(job_id, deployed.plan.attempt, key,
                                                  error=f"{type(exc).__name__}: {exc}",
                                                  traceback="".join(traceback.format_exception(exc)),
                                                  fatal=bool(getattr(exc, "unrecoverable", False)))))
        if all(t.state == TaskState.FINISHED for t in deployed.tasks.values()):
            self._spawn(self._release_when_drained(job_id, deployed))

    async def _release_when_drained(self, job_id: str, deployed: DeployedJob) -> None:
        # finished tasks keep their stats visible for a while for status and metrics
        await asyncio.sleep(30.0)
        if self.jobs.get(job_id) is deployed:
            teardown(deployed, self.network)
            del self.jobs[job_id]

    async def _report(self, report: p.Message[r.Ok]) -> None:
        deadline = time.monotonic() + 30.0
        while time.monotonic() < deadline:
            try:
                if self.coordinator is not None and not self.coordinator.is_closing():
                    await p.call(self.coordinator, report, timeout_s=self._coordinator_call_timeout_s())
                    return
            except NetstackError as exc:
                log.warning("reporting %s failed: %s", report.method, exc)
            await asyncio.sleep(0.5)
        log.error("gave up reporting %s for %s", report.method, report.to_wire())

    async def _cancel_job(self, job_id: str, *, report: bool) -> None:
        deployed = self.jobs.pop(job_id, None)
        if deployed is None:
            return
        for runner in deployed.running.values():
            runner.cancel()
        if deployed.running:
            _, pending = await asyncio.wait(list(deployed.running.values()), timeout=10.0)
            if pending:  # a task that does not serve its mailbox: name it, it delays every restart
                log.warning("job %s: tasks %s did not stop within 10 s of the cancel", job_id,
                            ", ".join(sorted(t.get_name() for t in pending)))
        teardown(deployed, self.network)

    def _on_link_lost(self, peer_id: str, why: str) -> None:
        for job_id, deployed in list(self.jobs.items()):
            if peer_id in deployed.peers and any(not r.done() for r in deployed.running.values()):
                log.error("job %s: lost data connection to %s (%s)", job_id, peer_id, why)
                self._spawn(self._report(p.JobError(job_id, deployed.plan.attempt,
                                                    error=f"lost data connection to {peer_id}: {why}")))
                self._spawn(self._cancel_job(job_id, report=False))

    def on_closed(self, link: Link, reason: Any, message: str) -> None:
        if link is self.coordinator:
            log.warning("connection to coordinator lost: %s", message)
            self.coordinator = None
            # The coordinator now counts this worker as lost and restarts its jobs elsewhere (or a restarted
            # coordinator or a standby recovers them as a new attempt): running on would only produce output
            # nobody will commit. The worker itself stays up; its heartbeat loop dials again and re-registers.
            for job_id in list(self.jobs):
                log.warning("cancelling job %s: its coordinator is gone", job_id)
                self._leaving.append(self._spawn(self._cancel_job(job_id, report=False)))


def coordinator_unavailable(exc: NetstackError) -> bool:
    """A coordinator that is not there (refused, unreachable) or not leading: another try may find one. A wrong
    token or certificate is not: trying again would only hide the error."""
    if isinstance(exc, NotLeader):
        return True
    return isinstance(exc, ConnectionLost) and exc.reason in (CloseReason.IO_ERROR, CloseReason.TIMEOUT)


async def run_worker(config: WorkerConfig) -> None:
    # CPython's 5 ms switch interval, said explicitly (SLUICE_GIL_SWITCH_S overrides it). Before tasks ran on
    # threads, the loop ran the records and held the GIL for long stretches, and a checkpoint writer's few
    # writes waited up to a second behind it: workers used 0.5 ms. Now a task's run (about 2 ms) ends by
    # releasing the GIL, so a 5 ms wait rarely has to force a switch, while at 0.5 ms the loop forced one for
    # each buffer or credit it took from the network during a run: 30 % more CPU per record on the keyed
    # count, no faster checkpoints (docs/BENCHMARKS.md, User code off the event loop).
    sys.setswitchinterval(float(os.environ.get("SLUICE_GIL_SWITCH_S", "0.005")))
    if config.memory_limit_bytes:
        # the whole process's address space: a function that leaks gets MemoryError in its task before the
        # machine runs out (the task fails and restarts; what it leaked stays in the worker, see README)
        resource.setrlimit(resource.RLIMIT_AS, (config.memory_limit_bytes, config.memory_limit_bytes))
    worker = Worker(config)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, worker.stop)
    try:
        await worker.run()
    except ConnectionLost as exc:
        raise SystemExit(f"sluice worker: {exc}") from None
