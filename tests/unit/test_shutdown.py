"""Shutdown of the coordinator and the worker: background tasks are cancelled *and awaited*.

Before BackgroundTasks, both only cancelled them: their cleanup (a `finally`
that awaits) ran, if at all, after shutdown had returned and the checkpoint
writer had closed.
"""

from __future__ import annotations

import asyncio
import time

from coordinator.server import Coordinator, CoordinatorConfig
from runtime.worker.worker import Worker, WorkerConfig


def sleeper(cleaned: list[str], name: str):
    async def run() -> None:
        try:
            await asyncio.sleep(3600)
        finally:
            await asyncio.sleep(0)  # cleanup that awaits, like a report or a job cancellation
            cleaned.append(name)

    return run()


def test_worker_shutdown_waits_for_its_cancelled_background_tasks():
    cleaned: list[str] = []

    async def main() -> None:
        worker = Worker(WorkerConfig("127.0.0.1", 1, "token", metrics_port=None))
        worker._spawn(sleeper(cleaned, "report"))
        worker._spawn(sleeper(cleaned, "cancel-job"))
        await asyncio.sleep(0)
        await worker.shutdown()
        assert sorted(cleaned) == ["cancel-job", "report"]

    asyncio.run(main())


def test_coordinator_run_returns_only_after_its_background_tasks_ended(tmp_path):
    cleaned: list[str] = []

    async def main() -> None:
        coordinator = Coordinator(CoordinatorConfig(token="token", metrics_port=None, state_dir=str(tmp_path)))
        running = asyncio.create_task(coordinator.run())
        deadline = time.monotonic() + 10.0
        while coordinator.port == 0:  # bound to port 0: the real port is known once it listens
            assert time.monotonic() < deadline, "coordinator did not start listening"
            await asyncio.sleep(0.01)
        coordinator._spawn(sleeper(cleaned, "failover"))
        await asyncio.sleep(0)
        coordinator.stop()
        await asyncio.wait_for(running, 30.0)
        assert cleaned == ["failover"]

    asyncio.run(main())
