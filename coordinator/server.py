"""The coordinator process: its table of RPC handlers and the heartbeat monitor.

Workers and CLI clients dial in over the same framed protocol; a worker's
link is also how the coordinator calls it (deploy, start, cancel, checkpoint
triggers). The worker records live in coordinator/registry.py, job
lifecycle and failover in coordinator/job_manager.py. A job module that does
not import, a graph that cannot run, or a cluster without enough slots fails
the submission with a clear error and nothing else.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import secrets
import signal
import socket
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry

from coordinator.autoscale import AutoscaleSettings
from coordinator.checkpointing import CheckpointSettings
from coordinator.exception_history import Detail
from coordinator.job_manager import JobManager
from coordinator.job_store import JobStore, superseded
from coordinator.jobs import JobRecord
from coordinator.lease import Leadership, LeaseHeld
from coordinator.metrics import CoordinatorCollector, LeadershipCollector, LeadershipStatistics
from coordinator.registry import WorkerRecord, WorkerRegistry
from coordinator.rest import REST_LIMITS, RestApi
from coordinator.rest_views import autoscaler_view, process_sample, task_sample
from coordinator.restarts import RestartStrategy
from coordinator.storage import CheckpointStorage, LocalCheckpointStorage
from coordinator.telemetry import OtlpSettings, Telemetry
from coordinator.trust import TrustError, TrustPolicy
from coordinator.upgrade import stop_with_savepoint, upgrade, upgraded_config
from netstack.connection import Connection
from netstack.errors import (
    CloseReason,
    Conflict,
    Forbidden,
    InvalidRequest,
    JobNotFound,
    MethodNotFound,
    NetstackError,
    NotLeader,
    RpcError,
)
from netstack.http import HttpServer
from netstack.limits import ListenerLimits
from netstack.metrics_http import serve_metrics
from netstack.tls import TlsFiles, http_server_context, server_context
from netstack.transport import BaseLinkHandler, Link, serve
from runtime.common import objectstore
from runtime.common.addresses import advertised_host
from runtime.common.dispatch import BadArguments, HandlerTable, UnknownMethod, typed_handlers
from runtime.common.extras import MissingExtra
from runtime.common.tasks import BackgroundTasks
from runtime.graph import protocol as p
from runtime.graph import replies as r
from runtime.graph.admission import SubmissionRefused, SubmitContext, check_connectors, check_extras
from runtime.graph.enums import JobState
from runtime.graph.job_config import JobConfig
from runtime.graph.plan import Plan

log = logging.getLogger("sluice.coordinator")

WAIT_JOB_MAX_S = 300.0  # the longest one wait_job call blocks; clients call again to wait longer


@dataclass(frozen=True)
class CoordinatorConfig:
    token: str
    host: str = "127.0.0.1"  # the address to bind (0.0.0.0: every interface)
    port: int = 0
    advertise: str = ""  # the address others reach it at ("": host, or this machine's name when host is a wildcard)
    checkpoint_dir: str = ""  # checkpoints go under it: a local path or s3://bucket/prefix ("": state_dir)
    metrics_port: int | None = 0
    http_port: int | None = 0  # the REST API and web UI (coordinator/rest.py); None: off
    state_dir: str = "./sluice-state"
    heartbeat_timeout_s: float = 10.0
    allowed_job_paths: tuple[str, ...] = ()  # empty: the working directory
    savepoint_roots: tuple[str, ...] = ()  # empty: <state_dir>/savepoints
    limits: ListenerLimits = field(default_factory=ListenerLimits)  # of the RPC listener
    tls: TlsFiles | None = None  # None: plain TCP
    standby: bool = False  # wait for the state directory's lease, answering NotLeader meanwhile
    # a lease not renewed this long is taken over (coordinator/lease.py); Flink's Kubernetes leader election
    # also leases for 15 s: a loaded machine stalled renewals past a 5 s lease, and the lone leader stopped
    lease_s: float = 15.0
    autoscale: AutoscaleSettings = field(default_factory=AutoscaleSettings)  # scale-down / scale-up delays
    otlp: OtlpSettings | None = None  # traces and metrics over OTLP (coordinator/telemetry.py); None: off

    def trust_policy(self) -> TrustPolicy:
        """The roots resolved once, at start-up (realpath: a symlinked root is judged by its target)."""
        jobs = self.allowed_job_paths or (os.getcwd(),)
        savepoints = self.savepoint_roots or (objectstore.join(self.checkpoint_root, "savepoints"),)
        return TrustPolicy(tuple(os.path.realpath(p) for p in jobs),
                           tuple(p if objectstore.is_url(p) else os.path.realpath(p) for p in savepoints))

    @property
    def checkpoint_root(self) -> str:
        return objectstore.absolute(self.checkpoint_dir or self.state_dir)

    @property
    def advertised_host(self) -> str:
        return advertised_host(self.host, self.advertise, fallback=socket.gethostname)


@dataclass
class PendingProbe:
    job_id: str
    expected: int
    started: float = field(default_factory=time.monotonic)
    reports: dict[str, dict[str, Any]] = field(default_factory=dict)
    done: asyncio.Event = field(default_factory=asyncio.Event)


class Coordinator(BaseLinkHandler):
    def __init__(self, config: CoordinatorConfig, *, storage: CheckpointStorage | None = None,
                 on_step: Callable[[str], Awaitable[None]] | None = None) -> None:
        self.config = config
        self.trust = config.trust_policy()
        self.workers = WorkerRegistry()
        self._stop = asyncio.Event()
        self._probe_ids = itertools.count(1)
        self._probes: dict[int, PendingProbe] = {}
        # `storage`: the tests' fault injection wraps it (tests/support/faulty_coordinator.py); --checkpoint-dir
        # holds the job directories itself, the state directory keeps them in checkpoints/
        self.storage = storage if storage is not None else LocalCheckpointStorage(
            config.checkpoint_root, subdirectory="" if config.checkpoint_dir else "checkpoints")
        self._background = BackgroundTasks("coordinator")
        self.port = 0
        self.metrics_port: int | None = None
        self.http_port: int | None = None
        self._rest: HttpServer | None = None
        self.holder_id = f"c-{socket.gethostname()[:12]}-{os.getpid()}-{secrets.token_hex(2)}"
        self.leadership: Leadership | None = None  # made once the RPC port is known (the lease names it)
        self.store = JobStore(config.state_dir, may_write=self.leading)
        self._on_step = on_step  # tests/support/faulty_coordinator.py: stop at a step of an upgrade or rescale
        self.manager = JobManager(workers=self.workers, storage=self.storage, autoscale=config.autoscale,
                                  persist=self.store.save, record_written=self.store.written,
                                  on_step=self._step if on_step is not None else None)
        self.lost_leadership = ""
        self.telemetry: Telemetry | None = None  # the OTLP export, when configured (started in run)
        self.rpc = self._handlers()

    async def _step(self, name: str) -> None:
        """A step of an upgrade or rescale: the records queued so far are written, then the tests' hook runs."""
        await self.store.flush()
        assert self._on_step is not None
        await self._on_step(name)

    async def _rest_call(self, method: str, args: dict[str, Any]) -> Any:
        """The REST API calls the RPC handlers themselves (no link: the token was checked by the API); a
        standby refuses them like an RPC."""
        if not self.leading():
            where = self.leadership.leader_address() if self.leadership else "unknown"
            raise NotLeader(f"coordinator {self.holder_id} is not the leader; the leader is {where}")
        return await self.rpc.dispatch(None, method, args)  # type: ignore[arg-type]

    def leading(self) -> bool:
        return self.leadership is not None and self.leadership.valid()

    def leadership_statistics(self) -> LeadershipStatistics:
        return LeadershipStatistics(self.leading(), self.leadership.epoch if self.leadership else 0,
                                    self.manager.recovered, self.store.writes, self.store.failed_writes)

    @property
    def jobs(self) -> dict[str, JobRecord]:
        return self.manager.jobs

    # -- lifecycle --------------------------------------------------------------

    async def run(self) -> None:
        state_dir = os.path.abspath(self.config.state_dir)  # noqa: ASYNC240 - once, at start-up
        # REST and metrics over TLS with RPC's certificate when TLS is configured: no plain-text port
        self._http_ssl = http_server_context(self.config.tls) if self.config.tls else None
        os.makedirs(state_dir, exist_ok=True)
        await asyncio.to_thread(self._check_object_stores)
        server, self.port = await serve(self.config.host, self.config.port, self._connection, self,
                                        limits=self.config.limits,
                                        ssl_context=server_context(self.config.tls) if self.config.tls else None)
        collectors = (CoordinatorCollector(workers=self.workers.statistics, jobs=self.manager.statistics),
                      LeadershipCollector(self.leadership_statistics))
        if self.config.metrics_port is not None:
            registry = CollectorRegistry()
            for collector in collectors:
                registry.register(collector)
            self.metrics_port = (await serve_metrics(registry, self.config.host, self.config.metrics_port,
                                                     ssl_context=self._http_ssl)).port
        if self.config.otlp is not None:  # off: no telemetry object, nothing builds a span
            try:
                self.telemetry = Telemetry(self.config.otlp, collectors=collectors, instance_id=self.holder_id)
            except MissingExtra as exc:
                server.close()
                raise SystemExit(f"sluice coordinator: --otlp-endpoint: {exc}") from None
            self.manager.submit_span = self.telemetry.submit
            self._spawn(self.telemetry.sample_forever())
        if self.config.http_port is not None:
            # the REST API calls the RPC handlers themselves (no link: the token was checked by the API)
            api = RestApi(jobs=lambda: self.jobs, workers=self.workers, token=self.config.token,
                          call=self._rest_call, scheme="https" if self._http_ssl else "http")
            self._rest = HttpServer(api, REST_LIMITS, name="rest")
            self.http_port = await self._rest.start(self.config.host, self.config.http_port,
                                                    ssl_context=self._http_ssl)
        metrics = f"{self.config.host}:{self.metrics_port}" if self.metrics_port is not None else "off"
        http = f"{self.config.host}:{self.http_port}" if self.http_port is not None else "off"
        otlp = self.config.otlp.endpoint if self.config.otlp is not None else "off"
        ready = (f"rpc={self.config.host}:{self.port} metrics={metrics} state={state_dir} http={http} otlp={otlp} "
                 f"id={self.holder_id} advertise={self.config.advertised_host}:{self.port} "
                 f"checkpoints={self.config.checkpoint_root}")
        self.leadership = Leadership(state_dir, holder=self.holder_id,
                                     address=f"{self.config.advertised_host}:{self.port}",
                                     lease_s=self.config.lease_s, renew_s=min(1.0, self.config.lease_s / 4))
        if self.config.standby:
            print(f"sluice coordinator ready {ready} role=standby", flush=True)
        try:
            if not await self._lead_unless_stopped(state_dir):  # a standby stopped before it ever led
                server.close()
                await server.wait_closed()
                await self.manager.stop()
                await self._background.cancel_and_wait()
                if self.telemetry is not None:
                    await self.telemetry.shutdown()
                return
        except LeaseHeld as exc:
            server.close()
            raise SystemExit(f"sluice coordinator: {exc}") from None
        except OSError as exc:  # a state directory we cannot write: say which, in one line
            server.close()
            raise SystemExit(f"sluice coordinator: cannot take the lease of state directory {state_dir}: "
                             f"{exc}") from None
        print(f"sluice coordinator {'leading' if self.config.standby else 'ready'} {ready} role=leader "
              f"epoch={self.leadership.epoch}", flush=True)
        monitor = self._spawn(self._monitor_heartbeats())
        autoscaler = self._spawn(self.manager.run_autoscaler())
        await self._stop.wait()
        monitor.cancel()
        autoscaler.cancel()
        if not self.lost_leadership:  # a graceful stop cancels the jobs; a coordinator that lost the lease
            for job in list(self.jobs.values()):  # leaves them to the new leader, untouched
                if not job.terminal:
                    await self.manager.cancel(job, "coordinator shutting down")
            await self.store.flush()
        server.close()
        if self._rest is not None:
            self._rest.close()
        for w in list(self.workers.values()):
            w.link.close("coordinator stopping")
        await server.wait_closed()
        await self.manager.stop()  # failovers, deploys, checkpoint runners: their cleanup runs before exit
        await self._background.cancel_and_wait()
        if self.telemetry is not None:  # the spans of the checkpoints that ended last go out too
            await self.telemetry.shutdown()

    def stop(self) -> None:
        self._stop.set()

    def _check_object_stores(self) -> None:
        """A bucket that does not exist, or an endpoint or credentials that do not work, stop the coordinator
        at start-up with one line, instead of failing the first checkpoint of every job."""
        roots = [self.config.checkpoint_root, *self.trust.savepoint_roots]
        for root in dict.fromkeys(url for url in roots if objectstore.is_url(url)):
            try:
                objectstore.check_reachable(root)
            except (OSError, ValueError) as exc:  # ValueError: ObjectStoreUnavailable, the s3 extra is missing
                raise SystemExit(f"sluice coordinator: {exc}") from None

    async def _lead_unless_stopped(self, state_dir: str) -> bool:
        """Take the lease and the jobs (True), unless the coordinator is stopped while it waits (False)."""
        lead = asyncio.ensure_future(self._lead(state_dir))
        stopped = asyncio.ensure_future(self._stop.wait())
        await asyncio.wait({lead, stopped}, return_when=asyncio.FIRST_COMPLETED)
        stopped.cancel()
        if not lead.done():
            lead.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await lead
            return False
        lead.result()  # LeaseHeld, OSError
        return True

    async def _lead(self, state_dir: str) -> None:
        """Wait for the lease, then take over what the previous leader left: its jobs run again."""
        assert self.leadership is not None
        await self.leadership.acquire(standby=self.config.standby)
        self._spawn(self._hold_lease())
        jobs, problems = await asyncio.to_thread(self.store.load)
        for problem in problems:
            log.error("skipping a job record: %s", problem)
        self._spawn(self.store.run())
        successors = superseded(jobs)
        for job in jobs:
            self.manager.adopt(job, superseded_by=successors.get(job.job_id, ""))
        if jobs:
            log.info("recovered %d job records from %s (%d to restart)", len(jobs), state_dir, self.manager.recovered)

    async def _hold_lease(self) -> None:
        assert self.leadership is not None
        why = await self.leadership.hold()
        # someone else may lead now: stop acting at once, touch no job, write nothing, and exit non-zero
        log.error("lost leadership: %s; stopping", why)
        self.lost_leadership = why
        self.manager.lease_lost()
        self._stop.set()

    def _connection(self) -> Connection:
        return Connection(local_id="coordinator", role="coordinator", token=self.config.token, is_client=False)

    def _spawn(self, coro: Any) -> asyncio.Future[Any]:
        return self._background.spawn(coro)

    async def _monitor_heartbeats(self) -> None:
        while True:
            await asyncio.sleep(min(1.0, self.config.heartbeat_timeout_s / 4))
            if not self.leading():  # a leader past its lease (paused) judges no worker: it is about to stop
                continue
            now = time.monotonic()
            for w in self.workers.overdue(now=now, timeout_s=self.config.heartbeat_timeout_s):
                log.error("worker %s missed heartbeats for %.1fs; removing it", w.worker_id, now - w.last_heartbeat)
                w.link.abort()
                self._worker_lost(w.worker_id, "heartbeat timeout")

    # -- links ----------------------------------------------------------------------

    def on_closed(self, link: Link, reason: CloseReason, message: str) -> None:
        if self.workers.registered_on(link.peer_id, link):
            self._worker_lost(link.peer_id, f"connection lost: {message}")

    def _worker_lost(self, worker_id: str, why: str) -> None:
        if self.workers.remove(worker_id) is None:
            return
        log.warning("worker %s lost (%s)", worker_id, why)
        self.manager.worker_lost(worker_id, why)

    # -- RPC ------------------------------------------------------------------------

    def _handlers(self) -> HandlerTable[Link]:
        """Every RPC the coordinator serves, to workers and clients alike."""
        handlers: list[tuple[type[Any], Any]] = [
            # from workers
            (p.Register, self.rpc_register),
            (p.Heartbeat, self.rpc_heartbeat),
            (p.AckCheckpoint, self.rpc_ack_checkpoint),
            (p.AckCheckpoints, self.rpc_ack_checkpoints),
            (p.DeclineCheckpoint, self.rpc_decline_checkpoint),
            (p.ProbeDone, self.rpc_probe_done),
            (p.TaskFinished, self.rpc_task_finished),
            (p.TaskEnded, self.rpc_task_ended),
            (p.TaskFailed, self.rpc_task_failed),
            (p.SlowCall, self.rpc_slow_call),
            (p.JobError, self.rpc_job_error),
            # from clients
            (p.Submit, self.rpc_submit),
            (p.Status, self.rpc_status),
            (p.Cancel, self.rpc_cancel),
            (p.WaitJob, self.rpc_wait_job),
            (p.TakeCheckpoint, self.rpc_checkpoint),
            (p.Checkpoints, self.rpc_checkpoints),
            (p.Rescale, self.rpc_rescale),
            (p.Upgrade, self.rpc_upgrade),
            (p.Probe, self.rpc_probe),
            (p.WorkerLog, self.rpc_worker_log),
            (p.WorkerProfile, self.rpc_worker_profile),
        ]
        # each handler gets its typed message (runtime/graph/protocol.py), decoded and checked here
        return HandlerTable(typed_handlers(handlers))

    async def on_rpc(self, link: Link, method: str, args: dict[str, Any]) -> Any:
        if not self.leading():
            where = self.leadership.leader_address() if self.leadership else "unknown"
            raise NotLeader(f"coordinator {self.holder_id} is not the leader; the leader is {where}")
        try:
            return await self.rpc.dispatch(link, method, args)
        except UnknownMethod as exc:
            raise MethodNotFound(str(exc)) from None
        except BadArguments as exc:
            raise InvalidRequest(str(exc), "BadArgs") from None

    async def rpc_register(self, link: Link, args: p.Register) -> r.Ok:
        if link.connection.peer_role != "worker":
            raise Forbidden("only workers register", "NotAWorker")
        wid = link.peer_id
        old = self.workers.get(wid)
        if old is not None and old.link is not link:
            old.link.close("replaced by a new registration")
        self.workers.register(WorkerRecord(wid, link, args.slots, args.host, args.data_port, args.metrics_port,
                                           args.pid))
        log.info("worker %s registered with %d slots at %s:%s", wid, args.slots, args.host, args.data_port)
        return r.Ok()

    async def rpc_heartbeat(self, link: Link, args: p.Heartbeat) -> r.Ok:
        now = time.monotonic()
        if not self.workers.heartbeat(link.peer_id, link, now=now):
            raise Conflict("unknown worker: register first", "NotRegistered")
        record = self.workers[link.peer_id]
        if args.process is not None:  # memory and CPU, for the worker's page
            record.process = process_sample(record.process, args.process, now)
        applied = record.reports.apply(args.tasks, args.changes)  # whole reports, rebuilt from the changes
        if applied.without_base:
            log.warning("worker %s: changes for %d task(s) whose report it never sent, e.g. %s; they show again "
                        "with its next whole reports", link.peer_id, len(applied.without_base),
                        applied.without_base[0])
        for st in applied.reports:
            job = self.jobs.get(st["job"])
            if job is not None and st.get("attempt") == job.attempt and not job.terminal:
                # with rates since the previous heartbeat, for the REST API's graph
                job.task_stats[st["task"]] = task_sample(job.task_stats.get(st["task"]),
                                                         {**st, "worker": link.peer_id}, now)
        return r.Ok()

    async def rpc_submit(self, link: Link, args: p.Submit) -> r.Submitted:
        submitted = dict(args.config or {})
        try:
            settings = checkpoint_settings(submitted.pop("checkpoint", None) or {})
            strategy = restart_strategy(submitted.pop("restart", None) or {})
            config = JobConfig.from_document(submitted)
        except (ValueError, TypeError) as exc:
            raise InvalidRequest(f"bad job settings: {exc}", "BadSettings") from None
        job, plan = self._new_job(args.entry, args.name, args.sys_path, config, settings, strategy,
                                  restore=args.restore)
        with self._forget_if_refused(job):
            await self._check_connectors(job, SubmitContext(settings.interval_s, restore=bool(args.restore)))
            if args.restore:
                plan = await self.manager.restored_plan(job, args.restore, plan)
                self._restored(job, args.restore, plan)
            self._admit(job, plan)
        return r.Submitted(job.job_id, job.total_tasks())

    @contextlib.contextmanager
    def _forget_if_refused(self, job: JobRecord) -> Iterator[None]:
        """A submission refused (or an upgrade that failed) before its job was admitted: drop the graphs built
        for it (coordinator/job_graphs.py), which nothing would ever ask for again."""
        try:
            yield
        except BaseException:
            if job.job_id not in self.manager.jobs:
                self.manager.graphs.forget(job.job_id)
            raise

    def _new_job(self, entry: str, name: str | None, sys_path: str | None, config: JobConfig,
                 settings: CheckpointSettings, strategy: RestartStrategy,
                 restore: str | None) -> tuple[JobRecord, Plan]:
        """A job record and its first plan; every refusal (a path not allowed, a module that does not import,
        a missing extra) is raised before anything runs."""
        job_id = f"job-{secrets.token_hex(4)}"
        try:
            sys_path = self.trust.check_job_path(os.path.realpath(sys_path) if sys_path else "")
        except TrustError as exc:
            raise Forbidden(str(exc)) from None
        job = JobRecord(job_id, entry, name or entry, sys_path, config)
        job.checkpoint_settings = settings
        job.restart_strategy = strategy
        with self._forget_if_refused(job):
            plan = self.manager.plan(job)
            try:  # an extra missing here is refused now, not after the workers failed it attempt by attempt
                check_extras(self.manager.graph(job), backend=config.state.backend,
                             restore=str(restore) if restore else None)
            except SubmissionRefused as exc:
                raise InvalidRequest(str(exc), "MissingExtra") from None
        return job, plan

    async def _check_connectors(self, job: JobRecord, context: SubmitContext) -> None:
        """Connectors that check their configuration against their system (a path, a table, privileges, a
        broker) say what is wrong now, in one line; on a thread, since they wait on the network. The graph is
        the one planning built (coordinator/job_graphs.py): the coordinator never runs its operators."""
        definition = self.manager.graph(job)
        if not any(hasattr(node.payload, "check_at_submit") for node in definition.nodes):
            return
        try:
            await asyncio.to_thread(check_connectors, definition, context)
        except SubmissionRefused as exc:
            raise InvalidRequest(str(exc), exc.kind) from None

    @staticmethod
    def _restored(job: JobRecord, restore_path: str, plan: Plan) -> None:
        assert plan.restore is not None
        job.restored_from = restore_path
        job.restored_checkpoint_id = plan.restore.checkpoint_id
        # ids go on after the restored one: sinks name committed files by checkpoint id, and a later restore
        # deletes those of ids after it, so an id must never be reused along one line of restores
        job.next_checkpoint_id = job.restored_checkpoint_id + 1

    def _admit(self, job: JobRecord, plan: Plan) -> None:
        job.plan = plan
        log.info("job %s (%s) submitted: %d tasks", job.job_id, job.entry, job.total_tasks())
        self.manager.add(job)

    async def rpc_upgrade(self, link: Link, args: p.Upgrade) -> r.Upgraded:
        """Stop a running job with a savepoint and start a new version of it from that savepoint (README,
        Evolving a job); every refusal comes before the running job is stopped. Answers with the downtime."""
        old = self._job(args)
        if old.state != JobState.RUNNING or old.checkpoints is None:
            raise Conflict(f"job {old.job_id} is {old.state}, not RUNNING: nothing to upgrade")
        requested = dict(args.parallelism or {})
        if not all(isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and v >= 1
                   for k, v in requested.items()):
            raise InvalidRequest("upgrade needs parallelism {NAME or '*': N >= 1, ...}", "BadSettings")
        try:
            directory = self.trust.check_savepoint_dir(_resolved(args.directory) if args.directory else None)
        except TrustError as exc:
            raise Forbidden(str(exc)) from None
        config = upgraded_config(old.config, requested, args.allow_non_restored_state)
        new, plan = self._new_job(args.entry, args.name or old.name, args.sys_path or old.sys_path, config,
                                  old.checkpoint_settings, old.restart_strategy, restore=directory)
        with self._forget_if_refused(new):
            return await upgrade(self.manager, old, new, plan, directory=directory, timeout_s=args.timeout_s,
                                 restored=self._restored, admit=self._admit)

    def _job(self, args: p.JobQuery) -> JobRecord:
        job = self.jobs.get(args.job_id)
        if job is None:
            raise JobNotFound(f"no job {args.job_id}")
        return job

    async def rpc_checkpoint(self, link: Link, args: p.TakeCheckpoint) -> r.CheckpointDone:
        """Take a checkpoint now (or a savepoint with savepoint=True and a directory); wait for its end."""
        job = self._job(args)
        if job.state != JobState.RUNNING or job.checkpoints is None:
            raise Conflict(f"job {job.job_id} is {job.state}, not RUNNING")
        savepoint = args.savepoint
        directory = args.directory
        if savepoint:
            try:  # realpath reads links, once per request
                directory = self.trust.check_savepoint_dir(
                    _resolved(directory) if directory else None)
            except TrustError as exc:
                raise Forbidden(str(exc)) from None
        try:
            _, fut = job.checkpoints.request(savepoint=savepoint, directory=directory, mode=args.mode)
        except ValueError as exc:
            raise InvalidRequest(str(exc), "BadCheckpointRequest") from None
        return await asyncio.wait_for(fut, args.timeout_s)

    async def rpc_rescale(self, link: Link, args: p.Rescale) -> r.Rescaled:
        """Rescale a running job through a checkpoint of its own mode; answer once it runs again (downtime)."""
        job = self._job(args)
        requested = args.parallelism
        if not requested or not all(
                isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and v >= 1
                for k, v in requested.items()):
            raise InvalidRequest("rescale needs parallelism {NAME or '*': N >= 1, ...}", "BadRescaleRequest")
        return await self.manager.rescale(job, dict(requested), timeout_s=args.timeout_s)

    async def rpc_checkpoints(self, link: Link, args: p.Checkpoints) -> r.CheckpointList:
        job = self._job(args)
        history = job.checkpoint_history()
        completed = await asyncio.to_thread(self.storage.list_completed, job.job_id)
        return r.CheckpointList(job.job_id, history, [{"checkpoint_id": n, "path": path} for n, path in completed],
                                last_completed=job.last_checkpoint_document())

    def _attempt(self, report: p.TaskReport | p.JobError | p.AckCheckpoints) -> JobRecord | None:
        """The report's job while the attempt it is about is the current one (None: a stale report)."""
        job = self.jobs.get(report.job_id)
        return job if job is not None and job.attempt == report.attempt else None

    async def rpc_ack_checkpoint(self, link: Link, args: p.AckCheckpoint) -> r.Ok:
        self._acknowledge(args, [args])  # a worker of an earlier version: one acknowledgement per call
        return r.Ok()

    async def rpc_ack_checkpoints(self, link: Link, args: p.AckCheckpoints) -> r.Ok:
        """A worker's acknowledgements of one job attempt, batched (runtime/worker/ack_batcher.py)."""
        self._acknowledge(args, args.acks)
        return r.Ok()

    def _acknowledge(self, report: p.AckCheckpoint | p.AckCheckpoints, acks: list[p.AckCheckpoint]) -> None:
        job = self._attempt(report)
        if job is not None and job.checkpoints is not None:
            for ack in acks:
                job.checkpoints.ack(ack.checkpoint_id, ack.task, dict(ack.state), ack.figures)

    async def rpc_decline_checkpoint(self, link: Link, args: p.DeclineCheckpoint) -> r.Ok:
        job = self._attempt(args)
        if job is not None and job.checkpoints is not None:
            job.checkpoints.decline(args.checkpoint_id, args.task, args.reason)
        return r.Ok()

    async def rpc_status(self, link: Link, args: p.Status) -> r.JobSummary | r.ClusterOverview:
        job_id = args.job_id
        if job_id:
            job = self.jobs.get(job_id)
            if job is None:
                raise JobNotFound(f"no job {job_id}")
            summary = job.summary()
            scaling = self.manager.scaling_status(job)
            summary["scaling"] = scaling
            summary["autoscaler"] = autoscaler_view(job, time.time() - time.monotonic())
            for v in summary["vertices"]:
                v["asked_parallelism"] = scaling["asked"].get(v["name"], v["parallelism"])
            return r.JobSummary.from_wire(summary)
        return r.ClusterOverview(
            [w.describe() for w in self.workers.values()],
            [{"job_id": j.job_id, "name": j.name, "state": j.state, "error": j.error} for j in self.jobs.values()],
            coordinator={"id": self.holder_id, "epoch": self.leadership.epoch if self.leadership else 0,
                         "recovered_jobs": self.manager.recovered})

    async def rpc_cancel(self, link: Link, args: p.Cancel) -> r.Cancelled:
        job = self._job(args)
        if args.savepoint:
            if job.state != JobState.RUNNING or job.checkpoints is None:
                raise Conflict(f"job {job.job_id} is {job.state}, not RUNNING: no savepoint to stop it with")
            try:
                directory = self.trust.check_savepoint_dir(_resolved(args.directory) if args.directory else None)
            except TrustError as exc:
                raise Forbidden(str(exc)) from None
            return await stop_with_savepoint(self.manager, job, directory=directory, timeout_s=args.timeout_s)
        if not job.terminal:
            await self.manager.cancel(job, "cancelled by user")
        return r.Cancelled(job.state)

    async def rpc_wait_job(self, link: Link, args: p.WaitJob) -> r.JobSummary:
        """Return the job's summary once it has ended, or when `timeout_s` has passed (then it is still going)."""
        job = self._job(args)
        timeout_s = WAIT_JOB_MAX_S if args.timeout_s is None else args.timeout_s
        # capped: the wait outlives a client that went away, so it must end on its own
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(job.ended.wait(), max(0.0, min(timeout_s, WAIT_JOB_MAX_S)))
        if job.terminal:  # its last checkpoint counted and its record on disk: a restarted coordinator agrees
            await self.manager.settled(job)
        return r.JobSummary.from_wire(job.summary())

    async def rpc_probe(self, link: Link, args: p.Probe) -> r.ProbeResult:
        """Send a probe through a running job on the priority lane; return when every task saw it."""
        job = self._job(args)
        if job.state != JobState.RUNNING or job.plan is None:
            raise Conflict(f"job {job.job_id} is {job.state}, not RUNNING")
        probe_id = next(self._probe_ids)
        pending = PendingProbe(job.job_id, job.total_tasks())
        self._probes[probe_id] = pending
        timeout_s = args.timeout_s
        try:
            workers = [self.workers[w].link for w in set(job.plan.placement.values()) if w in self.workers]
            await asyncio.gather(*(p.call(w, p.InjectProbe(job.job_id, probe_id)) for w in workers))
            try:
                await asyncio.wait_for(pending.done.wait(), timeout_s)
            except TimeoutError:
                pass
        finally:
            self._probes.pop(probe_id, None)
        return r.ProbeResult(probe_id, pending.done.is_set(), pending.expected,
                             sorted(pending.reports.values(), key=lambda report: report["arrival_s"]),
                             duration_s=max((report["arrival_s"] for report in pending.reports.values()),
                                            default=None))

    async def rpc_probe_done(self, link: Link, args: p.ProbeDone) -> r.Ok:
        pending = self._probes.get(args.probe_id)
        if pending is not None and pending.job_id == args.job_id:
            pending.reports[args.task] = {
                "task": args.task, "arrival_s": time.monotonic() - pending.started,
                "overtaken_output_buffers": args.overtaken_output_buffers,
                "overtaken_input_buffers": args.overtaken_input_buffers}
            if len(pending.reports) >= pending.expected:
                pending.done.set()
        return r.Ok()

    async def rpc_task_finished(self, link: Link, args: p.TaskFinished) -> r.Ok:
        job = self._attempt(args)
        if job is None or job.state != JobState.RUNNING:
            return r.Ok(ignored=True)
        stats = args.stats
        if stats is not None and "task" in stats:
            job.task_stats[stats["task"]] = {**stats, "worker": link.peer_id}
        self.manager.task_finished(job, args.task)
        return r.Ok()

    async def rpc_task_ended(self, link: Link, args: p.TaskEnded) -> r.Ok:
        job = self._attempt(args)
        if job is not None and job.state == JobState.RUNNING:
            self.manager.task_ended(job, args.task)
        return r.Ok()

    async def rpc_task_failed(self, link: Link, args: p.TaskFailed) -> r.Ok:
        job = self._attempt(args)
        if job is not None and not job.terminal:
            cause = f"task {args.task} failed: {args.error}"
            # the traceback waits for the failure the lifecycle records (JobRecord.note_failure) to take it
            job.exceptions.stash(cause, Detail(args.task, link.peer_id, args.traceback))
            self.manager.task_failed(job, job.attempt, cause, fatal=args.fatal)
        return r.Ok()

    async def rpc_slow_call(self, link: Link, args: p.SlowCall) -> r.Ok:
        """A user call running past the worker's threshold: an entry in the job's history, not a failover."""
        job = self._attempt(args)
        if job is not None and not job.terminal:
            cause = f"task {args.task}: user call {args.function} running for {args.running_s:.1f} s"
            job.exceptions.report(cause, Detail(args.task, link.peer_id, args.stack), now=time.time(),
                                  attempt=job.attempt)
            log.warning("job %s: %s on %s", job.job_id, cause, link.peer_id)
        return r.Ok()

    async def rpc_job_error(self, link: Link, args: p.JobError) -> r.Ok:
        job = self._attempt(args)
        if job is not None and not job.terminal:
            self.manager.task_failed(job, job.attempt, f"on {link.peer_id}: {args.error}")
        return r.Ok()

    async def rpc_worker_log(self, link: Link, args: p.WorkerLog) -> r.LogLines:
        """The last `lines` lines a worker logged (its in-memory tail: runtime/worker/log_tail.py)."""
        worker = self.workers.get(args.worker_id)
        if worker is None:
            raise JobNotFound(f"no worker {args.worker_id}", "UnknownWorker")
        try:
            return await p.call(worker.link, p.LogTail(max(1, min(args.lines, 1000))), timeout_s=5.0)
        except NetstackError as exc:  # gone, timed out, or of a version without a log tail
            raise Conflict(f"worker {worker.worker_id} did not give its log: {exc}", "WorkerLogUnavailable") from None


    async def rpc_worker_profile(self, link: Link, args: p.WorkerProfile) -> r.Profile:
        """A worker's profile of itself over `seconds` (py-spy: runtime/worker/profiler.py). The worker's
        refusals (one profile at a time, py-spy missing or not permitted) come back as they are."""
        low, high = p.PROFILE_SECONDS
        if not low <= args.seconds <= high:
            raise InvalidRequest(f"a profile lasts {low} to {high} seconds, not {args.seconds}", "BadProfileRequest")
        worker = self.workers.get(args.worker_id)
        if worker is None:
            raise JobNotFound(f"no worker {args.worker_id}", "UnknownWorker")
        try:
            return await p.call(worker.link, p.Profile(args.seconds), timeout_s=args.seconds + 30.0)
        except RpcError:
            raise
        except NetstackError as exc:  # gone, timed out, or of a version without a profiler
            raise Conflict(f"worker {worker.worker_id} did not give its profile: {exc}",
                           "WorkerProfileUnavailable") from None


def restart_strategy(raw: dict[str, Any]) -> RestartStrategy:
    """The restart strategy from a submission's config."""
    known = RestartStrategy.__dataclass_fields__.keys()
    unknown = set(raw) - set(known)
    if unknown:
        raise ValueError(f"unknown restart settings: {', '.join(sorted(unknown))}")
    return RestartStrategy(**raw)


def checkpoint_settings(raw: dict[str, Any]) -> CheckpointSettings:
    """Checkpoint settings from a submission's config (durations in seconds)."""
    known = CheckpointSettings.__dataclass_fields__.keys()
    unknown = set(raw) - set(known)
    if unknown:
        raise ValueError(f"unknown checkpoint settings: {', '.join(sorted(unknown))}")
    return CheckpointSettings(**{"interval_s": None, **raw})


async def run_coordinator(config: CoordinatorConfig, *, storage: CheckpointStorage | None = None,
                          on_step: Callable[[str], Awaitable[None]] | None = None) -> None:
    coordinator = Coordinator(config, storage=storage, on_step=on_step)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, coordinator.stop)
    await coordinator.run()
    if coordinator.lost_leadership:
        raise SystemExit(f"sluice coordinator: lost leadership ({coordinator.lost_leadership})")


def _resolved(directory: str) -> str:
    """A local directory with its links resolved (realpath reads them: a few syscalls, once per request); an
    object-store URL as given (the trust policy rejects `..` in it)."""
    return directory if objectstore.is_url(directory) else os.path.realpath(directory)
