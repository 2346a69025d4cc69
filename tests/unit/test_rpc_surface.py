"""Every RPC method a process calls is one its peer serves: the calls are read from the source and checked
against the handler tables, so a new call without a registered handler fails here, not as a job that hangs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from coordinator.server import Coordinator, CoordinatorConfig
from netstack.errors import Conflict, Forbidden, InvalidRequest, JobNotFound, MethodNotFound, NotLeader, RpcError
from runtime.cli.client import EXIT_INVALID, EXIT_NO_JOB, EXIT_REFUSED, refusal
from runtime.graph import protocol
from runtime.worker.worker import Worker, WorkerConfig

ROOT = Path(__file__).resolve().parents[2]
CALL = re.compile(r"""\.call\(\s*["']([a-z_]+)["']""")
TYPED = re.compile(r"""\bp\.([A-Z][A-Za-z]+)\(""")  # a typed message of runtime/graph/protocol.py, built to send


# the REST API's `call` reaches the coordinator's own handler table, not a worker
REST = ROOT / "coordinator" / "rest.py"


def called_in(package: str) -> set[str]:
    texts = [path.read_text() for path in (ROOT / package).rglob("*.py") if path != REST]
    return ({m for text in texts for m in CALL.findall(text)}
            | {method for text in texts for name in TYPED.findall(text) if (method := _method(name))})


def _method(name: str) -> str:
    """The RPC method of the protocol message called `name` ("" for a base class or another name)."""
    kind = getattr(protocol, name, None)
    return getattr(kind, "method", "") if isinstance(kind, type) and issubclass(kind, protocol.Message) else ""


def test_what_workers_and_clients_call_the_coordinator_serves(tmp_path: Path) -> None:
    served = set(Coordinator(CoordinatorConfig(token="t", metrics_port=None, state_dir=str(tmp_path))).rpc)
    called = called_in("runtime")
    assert {"task_ended", "submit", "cancel", "rescale"} <= called  # the patterns still find the calls
    assert called - served == set()
    assert set(CALL.findall(REST.read_text())) - served == set()


def test_what_the_coordinator_calls_workers_serve() -> None:
    served = set(Worker(WorkerConfig(coordinator_host="127.0.0.1", coordinator_port=1, token="t")).rpc)
    called = called_in("coordinator")
    assert "deploy" in called
    assert called - served == set()


# every error code the processes raise, read from the source: literal codes and the classes' own
RAISED = re.compile(r"""(?:RpcError|JobNotFound|InvalidRequest|Forbidden|Conflict|NotLeader|MethodNotFound)\(
                        (?:[^()]|\((?:[^()]|\([^()]*\))*\))*?,\s*["']([A-Za-z]+)["']\)""", re.X | re.S)


def test_every_error_code_raised_belongs_to_an_error_class() -> None:
    codes = {c for package in ("coordinator", "runtime", "netstack")
             for path in (ROOT / package).rglob("*.py") for c in RAISED.findall(path.read_text())}
    assert {"BadSettings", "RescaleCheckpointFailed", "NotRegistered"} <= codes  # the pattern finds them
    unowned = {c for c in codes if type(RpcError.from_wire("", c)) is RpcError}
    assert unowned == set(), "add these codes to a class in netstack/errors.py"


@pytest.mark.parametrize(("code", "kind", "status"), [
    ("UnknownJob", JobNotFound, EXIT_NO_JOB), ("BadSettings", InvalidRequest, EXIT_INVALID),
    ("JobDefinitionError", InvalidRequest, EXIT_INVALID), ("JobNotRunning", Conflict, EXIT_REFUSED),
    ("PathNotAllowed", Forbidden, EXIT_REFUSED), ("NotLeader", NotLeader, EXIT_REFUSED),
    ("UnknownMethod", MethodNotFound, EXIT_REFUSED), ("ZeroDivisionError", RpcError, EXIT_REFUSED),
])
def test_a_code_on_the_wire_comes_back_as_its_class_and_exit_status(code: str, kind: type[RpcError],
                                                                    status: int) -> None:
    error = RpcError.from_wire("refused", code)
    assert type(error) is kind and error.code == code and str(error) == "refused"
    assert refusal(error)[0] == status
    assert isinstance(error, RpcError) and error.retriable == (kind is NotLeader)
    if kind is JobNotFound:
        assert "sluice status" in refusal(error)[1]
