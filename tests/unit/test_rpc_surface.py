"""Every RPC method a process calls is one its peer serves: the calls are read from the source and checked
against the handler tables, so a new call without a registered handler fails here, not as a job that hangs."""

from __future__ import annotations

import re
from pathlib import Path

from coordinator.server import Coordinator, CoordinatorConfig
from runtime.worker.worker import Worker, WorkerConfig

ROOT = Path(__file__).resolve().parents[2]
CALL = re.compile(r"""(?:\.call|_report)\(\s*["']([a-z_]+)["']""")


def called_in(package: str) -> set[str]:
    return {m for path in (ROOT / package).rglob("*.py") for m in CALL.findall(path.read_text())}


def test_what_workers_and_clients_call_the_coordinator_serves(tmp_path: Path) -> None:
    served = set(Coordinator(CoordinatorConfig(token="t", metrics_port=None, state_dir=str(tmp_path))).rpc)
    called = called_in("runtime")
    assert "task_ended" in called and "submit" in called  # the pattern still finds the calls
    assert called - served == set()


def test_what_the_coordinator_calls_workers_serve() -> None:
    served = set(Worker(WorkerConfig(coordinator_host="127.0.0.1", coordinator_port=1, token="t")).rpc)
    called = called_in("coordinator")
    assert "deploy" in called
    assert called - served == set()
