"""Fixtures that start real coordinator and worker processes on port 0 and always reap them."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

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


def poll(predicate: Any, timeout_s: float, what: str, interval_s: float = 0.1) -> None:
    """Wait until predicate() is true, or fail the test naming what was awaited."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


@pytest.fixture
def cluster(tmp_path: Any) -> Iterator[Cluster]:
    c = Cluster(tmp_path)
    try:
        yield c
    finally:
        c.stop()
        for proc in [*c.workers, *([c.coordinator] if c.coordinator else [])]:
            assert proc.proc.poll() is not None, f"process {proc.pid} survived the test"


@pytest.fixture
def running_cluster(cluster: Cluster) -> Cluster:
    """A coordinator and two workers with two slots each, registered."""
    cluster.start_coordinator()
    cluster.start_worker()
    cluster.start_worker()
    cluster.wait_workers(2)
    return cluster


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
