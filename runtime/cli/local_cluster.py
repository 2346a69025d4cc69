"""`sluice local`: a coordinator and N workers as separate OS processes on loopback.

Starts them on port 0 (or the given metrics ports), submits the job, shows
progress until the job ends or Ctrl-C, then stops every process by PID.
With `keep_running` the cluster and its web UI stay up after the job ended
(or for as long as an unbounded job runs), until Ctrl-C or SIGTERM, so the
job's pages can be read.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from netstack.errors import NetstackError
from netstack.tls import TlsFiles
from netstack.transport import run
from runtime.api import JobDefinitionError
from runtime.cli.client import call_coordinator, open_link
from runtime.cli.processes import Managed, ProcessStartError, child_env, start_process, stop_process
from runtime.graph import protocol as p
from runtime.graph import replies as r
from runtime.graph.admission import SubmissionRefused, check_submission
from runtime.graph.plan import JobLoadError, build_job, load_entry

R = TypeVar("R", bound=r.Reply)


@dataclass(frozen=True)
class WorkerPlace:
    """Where worker i runs: a launcher prefix, the address it serves data on, the coordinator address it dials."""

    prefix: list[str]
    host: str
    coordinator_host: str


@dataclass
class LocalCluster:
    """A coordinator and worker processes on loopback, all on port 0; `sluice local`, the demo and the tests.

    `start()` starts the coordinator and `workers` workers; the tests call
    `start_coordinator` and `start_worker` themselves to pass extra flags.
    `stop()` stops every process by PID and removes the log directory when
    this object created it, unless `keep_logs`.
    """

    workers: int = 2
    slots: int = 2
    state_dir: str | None = None
    metrics_port_base: int | None = None
    log_dir: str | None = None
    quiet_logs: bool = True
    restart_workers: bool = True  # like a supervisor: a worker process that dies is started again
    token: str = field(default_factory=lambda: secrets.token_hex(16))
    workdir: str | None = None  # the processes' working directory, put on their sys.path (default: ours)
    keep_logs: bool = False
    tls: TlsFiles | None = None  # passed to every process and used by our own calls
    coordinator: Managed | None = None
    worker_procs: list[Managed] = field(default_factory=list)
    worker_restarts: int = 0
    link_timeout_s: float = 10.0
    coordinator_host: str = "127.0.0.1"  # 0.0.0.0 when workers run in other network namespaces
    place_worker: Callable[[int], WorkerPlace] | None = None  # default: this namespace, loopback
    env_overrides: dict[str, str] = field(default_factory=dict)  # e.g. a test's fault hooks, for the next starts
    _worker_args: list[tuple[str, tuple[str, ...]]] = field(default_factory=list)
    _own_log_dir: bool = False

    def _metrics_port(self, index: int) -> str:
        return str(self.metrics_port_base + index) if self.metrics_port_base else "0"

    @property
    def env(self) -> dict[str, str]:
        return child_env(self.token, self.workdir or os.getcwd()) | self.env_overrides

    @property
    def token_path(self) -> str:
        assert self.state_dir is not None
        return os.path.join(self.state_dir, "token")

    def _prepare(self) -> None:
        if self.log_dir is None:
            self.log_dir = tempfile.mkdtemp(prefix="sluice-logs-")
            self._own_log_dir = True
        self.state_dir = self.state_dir or os.path.join(self.log_dir, "state")
        os.makedirs(self.log_dir, exist_ok=True)
        os.makedirs(self.state_dir, exist_ok=True)
        # The client commands find the token here (`--state-dir`); only this user may read it.
        fd = os.open(self.token_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(self.token + "\n")
        os.chmod(self.token_path, 0o600)  # an existing file keeps its mode through O_CREAT

    def start(self) -> None:
        try:
            self.start_coordinator()
            for _ in range(self.workers):
                self.start_worker()
        except Exception:
            self.keep_logs = True  # the error names a log file
            self.stop()
            raise

    def start_coordinator(self, *extra: str, prefix: list[str] | None = None) -> Managed:
        """`prefix`: run the command under a launcher (the tests' fault injection wraps the coordinator)."""
        self._prepare()
        assert self.log_dir is not None and self.state_dir is not None
        self.coordinator = start_process(
            "coordinator", ["--host", self.coordinator_host, "--port", "0", "--metrics-port", self._metrics_port(0),
                            "--state-dir", self.state_dir, *self._tls_args(), *extra],
            env=self.env, cwd=self.workdir, log_path=os.path.join(self.log_dir, "coordinator.log"), prefix=prefix)
        return self.coordinator

    def start_worker(self, *extra: str, worker_id: str | None = None) -> Managed:
        wid = worker_id or f"worker-{len(self.worker_procs) + 1}"
        self._worker_args.append((wid, extra))
        w = self._launch_worker(len(self.worker_procs))
        self.worker_procs.append(w)
        return w

    def _launch_worker(self, index: int) -> Managed:
        assert self.coordinator is not None and self.log_dir is not None
        wid, extra = self._worker_args[index]
        coordinator = self.coordinator.fields["rpc"]
        place = self.place_worker(index) if self.place_worker else None
        where: list[str] = []
        if place is not None:
            coordinator = f"{place.coordinator_host}:{self.rpc[1]}"
            where = ["--host", place.host]
        return start_process(
            "worker", ["--coordinator", coordinator, "--slots", str(self.slots), "--data-port",
                       "0", "--metrics-port", self._metrics_port(index + 1), "--id", wid,
                       "--link-timeout", str(self.link_timeout_s), *where, *self._tls_args(), *extra],
            env=self.env, cwd=self.workdir, log_path=os.path.join(self.log_dir, f"{wid}.log"),
            prefix=place.prefix if place else None)

    def _tls_args(self) -> list[str]:
        return self.tls.as_args() if self.tls else []

    def supervise(self) -> list[str]:
        """Start again every worker process that died; returns what was done, for the progress display."""
        events: list[str] = []
        if not self.restart_workers:
            return events
        for i, w in enumerate(self.worker_procs):
            code = w.proc.poll()
            if code is None:
                continue
            events.append(f"{w.fields.get('id', f'worker-{i + 1}')} (pid {w.pid}) exited with status {code}; "
                          "starting it again")
            self.worker_procs[i] = self._launch_worker(i)
            self.worker_restarts += 1
            events.append(f"{self.worker_procs[i].fields['id']} is back as pid {self.worker_procs[i].pid}")
        return events

    @property
    def rpc(self) -> tuple[str, int]:
        assert self.coordinator is not None
        return self.coordinator.address("rpc")

    async def call(self, method: str, args: dict[str, Any] | None = None) -> Any:
        """A call by name with a hand-written document (tests and benchmarks); `ask` is the typed twin."""
        host, port = self.rpc
        return await call_coordinator(host, port, self.token, method, args, tls=self.tls)

    async def ask(self, message: p.Message[R], *, timeout_s: float = 30.0) -> R:
        """Send `message` to the coordinator on a short-lived connection; its typed reply."""
        host, port = self.rpc
        link = await open_link(host, port, self.token, timeout_s, self.tls)
        try:
            return await p.call(link, message, timeout_s=timeout_s)
        finally:
            link.close("done")

    async def wait_workers(self, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            status = await self.ask(p.Overview())
            if len(status.workers) >= self.workers:
                return
            await asyncio.sleep(0.1)
        raise TimeoutError(f"{self.workers} workers did not register within {timeout_s}s")

    @property
    def scheme(self) -> str:
        """Of the REST API, the UI and metrics: HTTPS with the cluster's certificate when TLS is on."""
        return "https" if self.tls else "http"

    def describe(self) -> list[str]:
        lines = []
        if self.coordinator:
            lines.append(f"  coordinator pid {self.coordinator.pid:>7}  rpc {self.coordinator.fields['rpc']}"
                         f"  metrics {self.coordinator.fields['metrics']}")
            if self.coordinator.fields.get("http", "off") != "off":
                lines.append(f"  web UI and REST API  {self.scheme}://{self.coordinator.fields['http']}/")
        for w in self.worker_procs:
            lines.append(f"  {w.fields['id']:<11} pid {w.pid:>7}  data {w.fields['data']}"
                         f"  metrics {w.fields['metrics']}")
        kept = "" if self.keep_logs or not self._own_log_dir else " (removed at exit; --keep-logs keeps them)"
        lines.append(f"  logs in {self.log_dir}{kept}")
        lines.append(f"  token in {self.token_path}: pass --state-dir {self.state_dir} to sluice status, "
                     "checkpoint, probe...")
        return lines

    def stop(self) -> None:
        for w in self.worker_procs:
            stop_process(w)
        if self.coordinator is not None:
            stop_process(self.coordinator)
        if self._own_log_dir and not self.keep_logs and self.log_dir:
            shutil.rmtree(self.log_dir, ignore_errors=True)


def summarise_progress(summary: dict[str, Any], elapsed_s: float) -> str:
    by_vertex: dict[str, dict[str, float]] = {}
    for t in summary.get("tasks", []):
        name = t["name"].rsplit(" (", 1)[0]
        agg = by_vertex.setdefault(name, {"in": 0, "out": 0, "bp": 0.0, "n": 0})
        agg["in"] += t["records_in"]
        agg["out"] += t["records_out"]
        agg["bp"] += t["backpressured_s"]
        agg["n"] += 1
    parts = []
    for name, agg in by_vertex.items():
        bp_pct = 100.0 * agg["bp"] / max(elapsed_s * agg["n"], 1e-9)
        parts.append(f"{name}: in {int(agg['in']):,} out {int(agg['out']):,} bp {min(bp_pct, 100):.0f}%")
    if not parts and summary.get("state") not in ("FINISHED", "FAILED", "CANCELLED"):
        parts.append("(tasks starting)")
    done, failed = summary.get("checkpoints_completed", 0), summary.get("checkpoints_failed", 0)
    if done or failed:
        last = summary.get("last_checkpoint") or {}
        detail = ""
        if last.get("duration_s") is not None:
            detail = (f" (last #{last['checkpoint_id']}: {last['duration_s']:.2f}s, "
                      f"{last.get('inflight_bytes', 0) / 1024:.0f} KiB in flight)")
        parts.append(f"checkpoints {done} ok {failed} failed{detail}")
    return " | ".join(parts)


async def run_job_on_cluster(cluster: LocalCluster, entry: str, *, config: dict[str, Any], name: str | None,
                             progress: Callable[[str], None] | None, timeout_s: float | None = None,
                             on_tick: Callable[[dict[str, Any], float], Awaitable[None]] | None = None,
                             restore: str | None = None) -> dict[str, Any]:
    await cluster.wait_workers()
    submitted = await cluster.ask(p.Submit(entry, name, config, os.getcwd(), restore))
    job_id = submitted.job_id
    if progress:
        progress(f"submitted {entry} as {job_id} ({submitted.tasks} tasks)")
    start = time.monotonic()
    last_print = 0.0
    while True:
        summary = (await cluster.ask(p.JobStatus(job_id))).to_wire()  # the document the progress lines read
        elapsed = time.monotonic() - start
        if on_tick:
            await on_tick(summary, elapsed)
        if summary["state"] in ("FINISHED", "FAILED", "CANCELLED"):
            summary["elapsed_s"] = elapsed
            return summary
        if progress and elapsed - last_print >= 1.0:
            last_print = elapsed
            progress(f"[{elapsed:6.1f}s] {summary['state']:<9} {summarise_progress(summary, elapsed)}")
        for line in await asyncio.to_thread(cluster.supervise):
            if progress:
                progress(line)
        if timeout_s is not None and elapsed > timeout_s:
            await cluster.ask(p.Cancel(job_id))
            raise TimeoutError(f"job {job_id} did not end within {timeout_s}s")
        await asyncio.sleep(0.25)


def import_from_working_directory() -> None:
    """Let this process import what the cluster's processes will (the coordinator and the workers put the
    submitter's working directory on their path): job modules, SQL functions."""
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())


def check_entry(entry: str, config: dict[str, Any] | None = None, restore: str | None = None) -> str | None:
    """Import the job's module and build the job here first, so a wrong name, a missing extra or an earlier
    run's output in a sink's directory is one error before any process starts."""
    import_from_working_directory()
    try:
        load_entry(entry)
        if config is not None:
            backend = (config.get("state") or {}).get("backend")
            check_submission(build_job(entry, None, config.get("parallelism")), backend=backend, restore=restore)
    except (JobLoadError, JobDefinitionError, SubmissionRefused) as exc:
        return str(exc)
    return None


def ui_hint(cluster: LocalCluster) -> str:
    """Where the web UI is, for the lines `sluice local` prints ("" when the coordinator serves none)."""
    http = cluster.coordinator.fields.get("http", "off") if cluster.coordinator else "off"
    return "" if http == "off" else f" with its web UI at {cluster.scheme}://{http}/"


def run_local(entry: str, *, workers: int, slots: int, config: dict[str, Any], metrics_port_base: int | None,
              state_dir: str | None, name: str | None = None, restore: str | None = None,
              restart_workers: bool = True, keep_logs: bool = False, tls: TlsFiles | None = None,
              link_timeout_s: float = 10.0, keep_running: bool = False) -> int:
    """The body of `sluice local`; returns the exit code."""
    problem = check_entry(entry, config, restore)
    if problem:
        print(f"sluice local: {problem}", file=sys.stderr, flush=True)
        return 2
    cluster = LocalCluster(workers=workers, slots=slots, metrics_port_base=metrics_port_base, state_dir=state_dir,
                           restart_workers=restart_workers, keep_logs=keep_logs, tls=tls,
                           link_timeout_s=link_timeout_s)
    print(f"sluice local: starting a coordinator and {workers} workers", flush=True)
    try:
        cluster.start()
    except ProcessStartError as exc:
        print(f"sluice local: {exc}", file=sys.stderr, flush=True)
        return 1
    interrupted = False
    summary: dict[str, Any] = {}
    ended: dict[str, Any] = {}  # the job's end, once it came (with keep_running the cluster stays up after it)

    async def run_until_signalled() -> dict[str, Any]:
        # SIGTERM and SIGINT cancel the job's task from inside the event loop: a KeyboardInterrupt raised by a
        # plain signal handler can land inside a transport callback, which then drops a connection and turns
        # the interruption into a failed job
        loop = asyncio.get_running_loop()
        job = asyncio.current_task()
        assert job is not None
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, job.cancel)
        try:
            result = await run_job_on_cluster(cluster, entry, config=config, name=name,
                                              progress=lambda s: print(s, flush=True), restore=restore)
            if keep_running:
                ended.update(result)
                print(f"sluice local: job {result['state']}; the cluster stays up{ui_hint(cluster)} until Ctrl-C",
                      flush=True)
                await asyncio.Event().wait()  # until a signal cancels this task
            return result
        except asyncio.CancelledError:
            raise KeyboardInterrupt from None
        finally:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)  # back to the defaults: the handlers below are set again
            signal.signal(signal.SIGTERM, on_signal)
            signal.signal(signal.SIGINT, signal.default_int_handler)

    def on_signal(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt  # outside the event loop (starting, stopping): nothing to corrupt

    old = signal.signal(signal.SIGTERM, on_signal)
    try:
        for line in cluster.describe():
            print(line, flush=True)
        summary = run(run_until_signalled())
    except KeyboardInterrupt:
        if ended:  # kept running after the job's end: stopping now is what was asked
            print("\nsluice local: stopping the cluster", flush=True)
            summary = ended
        else:
            interrupted = True
            print("\nsluice local: interrupted, stopping the cluster", flush=True)
            summary = {"state": "CANCELLED", "error": "interrupted"}
    except (NetstackError, TimeoutError, OSError) as exc:
        print(f"sluice local: {exc}", file=sys.stderr, flush=True)
        summary = {"state": "FAILED", "error": str(exc)}
    finally:
        if summary.get("state") not in ("FINISHED", "CANCELLED"):
            cluster.keep_logs = True  # the logs say why it failed
        cluster.stop()
        signal.signal(signal.SIGTERM, old)
    if summary["state"] == "FINISHED":
        print(f"sluice local: job FINISHED in {summary['elapsed_s']:.1f}s; "
              f"{summarise_progress(summary, summary['elapsed_s'])}", flush=True)
        return 0
    print(f"sluice local: job {summary['state']}: {summary.get('error', '')}", file=sys.stderr, flush=True)
    if cluster.keep_logs:
        print(f"sluice local: logs kept in {cluster.log_dir}", file=sys.stderr, flush=True)
    return 130 if interrupted else 1
