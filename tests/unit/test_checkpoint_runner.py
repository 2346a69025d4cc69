"""CheckpointRunner on real files, without workers (no links): its stop waits for retention discards, and a
`_metadata` write that fails (injected around the storage, as the integration tests do) aborts one checkpoint."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from coordinator.checkpoint_runner import CheckpointRunner
from coordinator.checkpointing import CheckpointSettings
from coordinator.storage import LocalCheckpointStorage
from runtime.graph.checkpoint_figures import TaskCheckpointFigures
from runtime.graph.replies import CheckpointDone
from tests.support.faulty_coordinator import FaultyStorage


class Slow:
    """The real storage, with writes and discards that take a while (a slow disk)."""

    def __init__(self, inner: LocalCheckpointStorage) -> None:
        self._inner = inner

    def discard(self, path: str) -> None:
        time.sleep(0.3)
        self._inner.discard(path)

    def write_metadata(self, directory: str, metadata: dict[str, Any]) -> str:
        time.sleep(0.3)
        return self._inner.write_metadata(directory, metadata)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def runner(storage: Any, *, retain: int = 1, tolerable_failures: int = 0) -> CheckpointRunner:
    settings = CheckpointSettings(None, retain=retain, tolerable_failures=tolerable_failures)
    return CheckpointRunner(job_id="job-1", attempt=0, settings=settings,
                            tasks=frozenset({"1:0"}), storage=storage, links=lambda: [],
                            job_info={"entry": "m:f", "name": "f", "vertices": []}, fail_job=lambda reason: None,
                            on_complete=lambda completed: None)


async def checkpoint(r: CheckpointRunner) -> CheckpointDone:
    checkpoint_id, fut = r.request()
    deadline = time.monotonic() + 10
    while checkpoint_id not in r.directories:  # the trigger makes its directory in a thread
        assert time.monotonic() < deadline, "no checkpoint directory"
        await asyncio.sleep(0.01)
    r.ack(checkpoint_id, "1:0", {}, TaskCheckpointFigures())
    return await asyncio.wait_for(fut, 10)


def test_stop_waits_for_the_retention_discard_of_the_last_checkpoint(tmp_path: Path) -> None:
    inner = LocalCheckpointStorage(str(tmp_path))

    async def main() -> None:
        r = runner(Slow(inner))
        r.start()
        assert (await checkpoint(r)).status == "COMPLETED"
        assert (await checkpoint(r)).status == "COMPLETED"  # retains 1: chk-1 is being discarded
        await r.stop("job finished")
        assert [n for n, _ in inner.list_completed("job-1")] == [2]

    asyncio.run(main())
    assert not (tmp_path / "checkpoints" / "job-1" / "chk-1").exists()


def test_an_injected_metadata_failure_aborts_one_checkpoint_and_the_next_completes(tmp_path: Path) -> None:
    inner = LocalCheckpointStorage(str(tmp_path))

    async def main() -> None:
        r = runner(FaultyStorage(inner, metadata_fails=1), retain=3, tolerable_failures=1)
        r.start()
        first = await checkpoint(r)
        assert first.status == "ABORTED" and "No space left" in (first.reason or ""), first
        assert (await checkpoint(r)).status == "COMPLETED"
        await r.stop("done")
        assert [n for n, _ in inner.list_completed("job-1")] == [2]

    asyncio.run(main())


def test_when_the_job_finished_stop_lets_a_write_under_way_complete_and_applies_retention(tmp_path: Path) -> None:
    inner = LocalCheckpointStorage(str(tmp_path))

    async def main() -> None:
        r = runner(Slow(inner))
        r.start()
        assert (await checkpoint(r)).status == "COMPLETED"
        checkpoint_id, fut = r.request()  # its write is under way when the job finishes
        deadline = time.monotonic() + 10
        while checkpoint_id not in r.directories:
            assert time.monotonic() < deadline, "no checkpoint directory"
            await asyncio.sleep(0.01)
        r.ack(checkpoint_id, "1:0", {}, TaskCheckpointFigures())
        await r.stop("job finished", job_finished=True)
        assert (await fut).status == "ABORTED"  # its requester was answered at once, by the stop
        assert [n for n, _ in inner.list_completed("job-1")] == [2]  # completed after all; retains 1

    asyncio.run(main())


class Unreachable:
    """The real storage behind a bucket that fails every write and delete."""

    def __init__(self, inner: LocalCheckpointStorage) -> None:
        self._inner = inner

    def discard(self, path: str) -> None:
        raise OSError(5, "bucket unreachable")

    def write_metadata(self, directory: str, metadata: dict[str, Any]) -> str:
        raise OSError(5, "bucket unreachable")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def test_a_failing_store_leaves_one_line_per_discard_not_a_traceback(tmp_path: Path, caplog: Any) -> None:
    async def main() -> None:
        r = runner(Unreachable(LocalCheckpointStorage(str(tmp_path))), tolerable_failures=5)
        r.start()
        assert (await checkpoint(r)).status == "ABORTED"  # its directory is discarded, and that fails too
        await r.stop("done")

    caplog.set_level("WARNING")
    asyncio.run(main())
    import gc
    gc.collect()  # an exception nobody retrieved would be reported now
    lines = [r.getMessage() for r in caplog.records]
    assert not any(r.exc_info for r in caplog.records), lines
    assert not any("never retrieved" in line or "background task failed" in line for line in lines), lines
    [discard] = [line for line in lines if "not discarded" in line]
    assert "checkpoint 1 at " in discard and "bucket unreachable" in discard, discard
