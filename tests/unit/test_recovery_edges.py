"""Recovery's edges on one process, without a cluster: a file sink whose directory was cleared refuses its
restore as unrecoverable (the job fails at once instead of after its restarts), and a worker whose deploy of
an attempt fails late (a peer died before it dialed) leaves the next attempt, deployed meanwhile, in place."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from runtime.connectors.files import FileSink
from runtime.connectors.sinks import OutputGone
from runtime.worker import worker as worker_module
from runtime.worker.worker import Worker, WorkerConfig


def test_a_file_sink_whose_directory_was_cleared_refuses_the_restore_as_unrecoverable(tmp_path: Path) -> None:
    sink = FileSink(str(tmp_path / "out"))
    sink.open(0, 1, 0)
    sink.write(["k", 1])
    state = sink.snapshot_state(3)  # pre-committed for checkpoint 3, which completed
    sink.close()
    for p in (tmp_path / "out").iterdir():  # the user clears the output directory
        p.unlink()
    again = FileSink(str(tmp_path / "out"))
    again.open(0, 1, 1)
    with pytest.raises(OutputGone, match="was never published: the sink's directory was cleared") as caught:
        again.restore_state(state)
    assert getattr(caught.value, "unrecoverable", False)  # the worker reports it as fatal: no restarts


@dataclass
class FakePlan:
    job_id: str
    attempt: int


@dataclass
class FakeDeployed:
    plan: FakePlan
    tasks: dict[str, Any] = field(default_factory=dict)
    running: dict[str, Any] = field(default_factory=dict)


def test_a_late_failing_deploy_of_an_earlier_attempt_leaves_the_next_attempt_deployed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Attempt 0's deploy waits for a peer that died before dialing (connect's 30 s); the coordinator cancels
    it and deploys attempt 1 on this worker; then attempt 0's wait fails. Before, that failure dropped attempt 1
    from the worker's jobs while its tasks ran on: a job the worker no longer knew (no checkpoints, no cancel)."""
    torn_down: list[int] = []

    async def scenario() -> None:
        gate = asyncio.Event()  # the wait for the dead peer ends (with connect's timeout)

        async def fake_deploy(plan: Any, *args: Any, **kwargs: Any) -> FakeDeployed:
            return FakeDeployed(plan)

        async def fake_connect(deployed: FakeDeployed, network: Any) -> None:
            if deployed.plan.attempt == 0:
                await gate.wait()
                raise ConnectionError("worker w-1 did not connect within 30.0s")

        monkeypatch.setattr(worker_module, "deploy", fake_deploy)
        monkeypatch.setattr(worker_module, "connect", fake_connect)
        monkeypatch.setattr(worker_module, "teardown", lambda deployed, network: torn_down.append(
            deployed.plan.attempt))
        w = Worker(WorkerConfig(coordinator_host="127.0.0.1", coordinator_port=1, token="t", metrics_port=None))
        monkeypatch.setattr(w, "_checkpoint_hooks", lambda plan: None)
        first = asyncio.ensure_future(w._deploy(FakePlan("job-1", 0)))  # type: ignore[arg-type]
        await asyncio.sleep(0.01)
        await w._deploy(FakePlan("job-1", 1))  # type: ignore[arg-type]
        assert w.jobs["job-1"].plan.attempt == 1
        gate.set()
        with pytest.raises(ConnectionError):
            await first
        assert w.jobs["job-1"].plan.attempt == 1  # attempt 1 runs on
        assert torn_down == [0]  # attempt 0 torn down once, by the cancel; attempt 1 untouched

    asyncio.run(scenario())
