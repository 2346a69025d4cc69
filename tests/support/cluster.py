"""A real cluster for the tests: coordinator and worker processes on port 0, always reaped; polling with
deadlines; job modules written next to it; its committed output read back."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from runtime.cli.client import call_coordinator
from runtime.cli.local_cluster import LocalCluster
from runtime.cli.processes import Managed
from runtime.connectors.generator import BLOCK, generate_block, key_names


class Cluster:
    """The tests' view of a `LocalCluster` (the harness `sluice local` uses): processes started one by one
    with extra flags, in `tmp_path` (their working directory and the job modules' place), logs kept there."""

    def __init__(self, tmp_path: Any) -> None:
        self.tmp_path = tmp_path
        self.log_dir = tmp_path / "logs"
        self.local = LocalCluster(workers=0, state_dir=str(tmp_path / "state"), log_dir=str(self.log_dir),
                                  workdir=str(tmp_path), restart_workers=False)
        self.token = self.local.token

    @property
    def env(self) -> dict[str, str]:
        """The environment the processes get (a copy: set `local.env_overrides` to change later starts)."""
        return self.local.env

    @property
    def coordinator(self) -> Managed | None:
        return self.local.coordinator

    @property
    def workers(self) -> list[Managed]:
        return self.local.worker_procs

    def start_coordinator(self, *extra: str, prefix: list[str] | None = None) -> Managed:
        return self.local.start_coordinator(*extra, prefix=prefix)

    def start_worker(self, *extra: str, worker_id: str | None = None) -> Managed:
        return self.local.start_worker(*extra, worker_id=worker_id)

    def start(self, workers: int = 2, *coordinator_args: str, worker_args: tuple[str, ...] = (),
              worker_ids: bool = False) -> Cluster:
        """A coordinator and `workers` workers (two slots each), registered; `worker_ids` names them
        worker-1, worker-2, ... (a test that restarts one under its id needs to know it)."""
        self.start_coordinator(*coordinator_args)
        for i in range(workers):
            self.start_worker(*worker_args, worker_id=f"worker-{i + 1}" if worker_ids else None)
        self.wait_workers(workers)
        return self

    @property
    def rpc(self) -> tuple[str, int]:
        assert self.coordinator is not None
        return self.coordinator.address("rpc")

    def call(self, method: str, args: dict[str, Any] | None = None, *, token: str | None = None) -> Any:
        host, port = self.rpc
        return asyncio.run(call_coordinator(host, port, token or self.token, method, args))

    def wait_workers(self, n: int, timeout_s: float = 30.0) -> None:
        poll(lambda: len(self.call("status")["workers"]) >= n, timeout_s, f"{n} workers to register")

    def submit(self, entry: str, config: dict[str, Any] | None = None) -> str:
        return self.call("submit", {"entry": entry, "config": config or {}, "sys_path": str(self.tmp_path)})["job_id"]

    def wait_job(self, job_id: str, timeout_s: float = 180.0) -> dict[str, Any]:
        result: dict[str, Any] = {}

        def ended() -> bool:
            result.update(self.call("status", {"job_id": job_id}))
            return result["state"] in ("FINISHED", "FAILED", "CANCELLED")

        poll(ended, timeout_s, f"job {job_id} to end", interval_s=0.25)
        return result

    def log(self, name: str) -> str:
        path = self.log_dir / f"{name}.log"
        return path.read_text() if path.exists() else ""

    def stop(self) -> None:
        self.local.stop()


def wait_for(predicate: Callable[[], Any], timeout_s: float, what: str = "the condition",
             interval_s: float = 0.1) -> None:
    """Wait until predicate() is true, or fail the test naming what was awaited. Tests wait with this (or
    another loop with a deadline), never with a fixed sleep."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


poll = wait_for  # the name most tests were written with


def logs(cluster: Cluster, tail: int = 3000) -> str:
    """The end of every process's log, for a failure message."""
    names = ["coordinator", *sorted(str(w.fields["id"]) for w in cluster.workers)]
    return "\n".join(f"--- {n}\n{cluster.log(n)[-tail:]}" for n in names)


def replace_dead_workers(cluster: Cluster, replaced: set[int], worker_args: tuple[str, ...] = ()) -> int:
    """Start a worker under the id of each worker process that died and is not in `replaced` (its pid is added);
    returns how many were started."""
    started = 0
    for w in list(cluster.workers):
        if w.proc.poll() is not None and w.pid not in replaced:
            replaced.add(w.pid)
            cluster.start_worker(*worker_args, worker_id=str(w.fields["id"]))
            started += 1
    return started


def kill_sink_worker_after_a_checkpoint(cluster: Cluster, job_id: str, timeout_s: float = 60.0) -> str:
    """SIGKILL the worker running the job's sink subtask 0 once a checkpoint has completed and the sink runs,
    and reap it (the connector tests' kill from outside); returns that worker's id, to start its successor
    under. The job must not end meanwhile."""
    found: dict[str, Any] = {}

    def checkpointed() -> bool:
        st = cluster.call("status", {"job_id": job_id})
        assert st["state"] in ("CREATED", "DEPLOYING", "RUNNING"), f"{st}\n{logs(cluster)}"
        found.update(st)
        return st["last_checkpoint"] is not None and any("Sink" in t["name"] for t in st["tasks"])

    wait_for(checkpointed, timeout_s, "a completed checkpoint")
    victim_id = next(t["worker"] for t in found["tasks"] if "Sink" in t["name"] and t["task"].endswith(":0"))
    victim = next(w for w in cluster.workers if w.fields["id"] == victim_id)
    os.kill(victim.pid, signal.SIGKILL)
    victim.proc.wait(10)
    return str(victim_id)


def holds_for(predicate: Callable[[], Any], duration_s: float, what: str, interval_s: float = 0.1) -> None:
    """Check that predicate() stays true for `duration_s` (how a test waits to see that nothing happens),
    failing as soon as it does not."""
    deadline = time.monotonic() + duration_s
    while time.monotonic() < deadline:
        assert predicate(), f"{what} stopped holding"
        time.sleep(interval_s)


@contextmanager
def reaped_cluster(tmp_path: Any) -> Iterator[Cluster]:
    """The one cluster fixture's body (tests/conftest.py; module-scoped fixtures use it too): a `Cluster` in
    `tmp_path`, stopped afterwards, and every process it started checked to be gone."""
    c = Cluster(tmp_path)
    try:
        yield c
    finally:
        c.stop()
        for proc in [*c.workers, *([c.coordinator] if c.coordinator else [])]:
            assert proc.proc.poll() is not None, f"process {proc.pid} survived the test"


def kill_worker(cluster: Cluster, worker_id: str) -> None:
    """SIGKILL the live worker process that announced `worker_id`, and wait until it is dead."""
    victim = next(w for w in cluster.workers if str(w.fields["id"]) == worker_id and w.proc.poll() is None)
    os.kill(victim.pid, signal.SIGKILL)
    victim.proc.wait(10)


def write_module(directory: Any, name: str, source: str) -> None:
    (directory / f"{name}.py").write_text(source)
    os.utime(directory / f"{name}.py")


def generator_counts(words: int, keys: int, seed: int) -> Counter[str]:
    """How often each key occurs in `GeneratorSource(count=words, keys=keys, seed=seed)`."""
    names = key_names(keys)
    counts: Counter[str] = Counter()
    for block in range(-(-words // BLOCK)):
        counts.update(k for k, _, _ in generate_block(block, seed=seed, keys=names, cum_weights=None, count=words))
    return counts


def assert_running_counts(out: Path, expected: Counter[str]) -> None:
    """The committed output of the keyed running count: every key's counts 1..n, each exactly once."""
    poll(lambda: not committed_output(out)[1], 15, "the final commit (no in-progress files left)")
    counts, _ = committed_output(out)
    assert set(counts) == set(expected), set(counts) ^ set(expected)
    for key, ns in counts.items():
        assert sorted(ns) == list(range(1, expected[key] + 1)), (
            f"{key}: expected 1..{expected[key]}, got {len(ns)} values, duplicates "
            f"{sorted(n for n, c in Counter(ns).items() if c > 1)[:10]}, missing "
            f"{sorted(set(range(1, expected[key] + 1)) - set(ns))[:10]}")
    assert sum(len(v) for v in counts.values()) == sum(expected.values())


def committed_output(out: Path) -> tuple[dict[str, list[int]], list[str]]:
    """Per key, the counts in visible part files (file by file, in order); and the hidden files."""
    counts: dict[str, list[int]] = defaultdict(list)
    hidden = []
    for path in sorted(out.iterdir()) if out.exists() else []:
        if path.name.startswith((".", "_")):
            hidden.append(path.name)
            continue
        for line in path.read_text().splitlines():
            key, n = json.loads(line)
            counts[key].append(n)
    return counts, hidden


def committed_rows(out: Path) -> tuple[Counter[str], list[str]]:
    """Every line of the visible part files (as a multiset); and the hidden files."""
    rows: Counter[str] = Counter()
    hidden = []
    for path in sorted(out.iterdir()) if out.exists() else []:
        if path.name.startswith((".", "_")):
            hidden.append(path.name)
            continue
        rows.update(path.read_text().splitlines())
    return rows, hidden


CLI_TIMEOUT_S = 120.0


def sluice(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    """`sluice <command> --coordinator <this cluster> <args...>` as a process; killed if it hangs."""
    host, port = cluster.rpc
    command = [sys.executable, "-m", "runtime.cli", args[0], "--coordinator", f"{host}:{port}", *args[1:]]
    proc = subprocess.Popen(command, cwd=cluster.tmp_path, env=cluster.env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=CLI_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.terminate()
        try:
            out, err = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        raise AssertionError(f"sluice {' '.join(args)} still running after {CLI_TIMEOUT_S}s: {out!r} {err!r}") from None
    return subprocess.CompletedProcess(command, proc.returncode, out, err)
