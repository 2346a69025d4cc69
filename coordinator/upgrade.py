"""`sluice upgrade`: stop a running job with a savepoint and start a new version of it from that savepoint; and
`sluice cancel --savepoint`: stop a running job with a savepoint.

One call, in this order, so that every refusal comes while the old version still runs unchanged:

1. the new version's module is imported and planned (server._new_job: path, import, graph, extras);
2. a savepoint of the running job is taken (aligned, self-contained; the job keeps running meanwhile);
3. the new version is checked against it: operators matched by uid, removed ones refused without
   `allow_non_restored_state`, changed state kinds refused (runtime/graph/evolution.py);
4. the new job's record is written (CREATED, restoring the savepoint, `upgrade_of` the old job) and waited for;
5. the old job is cancelled, and the new one submitted from the savepoint;
6. the answer comes once the new job runs: the downtime is 5's cancel to the new job's RUNNING.

One step in the job lifecycle whoever leads: 4 is the commit point. A leader that dies before it leaves the old
job's record as it was, and the next leader recovers the old job (the savepoint is left unused); from 4 on the
next leader finds the new record, cancels the old job if its record does not say so yet
(job_store.superseded, lifecycle `Recovered(superseded_by)`) and starts the new one from the savepoint
(`restored_from`, like any recovered job). Each step is a `JobManager.step`, where the tests' launcher kills the
coordinator (tests/integration/test_lifecycle_failover.py).

A stop with a savepoint is steps 2 and 5 without a new job: the savepoint, then the cancel, whose CANCELLED
record (naming the savepoint) is on disk before the answer. A leader that dies before that record is written
leaves the job RUNNING in its record, and the next leader recovers it (the savepoint is left unused).

Exactly once across the switch as with any restore: output the old job committed after the savepoint (a
periodic checkpoint completing between 2 and 4) carries checkpoint ids after the savepoint's, and the new
job's sinks delete those files on restore (the ids go on after the savepoint's along the line of restores).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

from coordinator.jobs import JobRecord
from coordinator.scheduler import describe_parallelism, merge_parallelism
from netstack.errors import RpcError
from runtime.graph import replies as r
from runtime.graph.enums import JobState
from runtime.graph.job_config import JobConfig
from runtime.graph.plan import Plan

if TYPE_CHECKING:
    from coordinator.job_manager import JobManager

log = logging.getLogger("sluice.coordinator")

POLL_S = 0.005  # how often the wait for the new job's RUNNING looks (bounded by the call's timeout)


def upgraded_config(old: JobConfig, requested: Mapping[str, int], allow_non_restored_state: bool) -> JobConfig:
    """The new version's configuration: the old one's, with parallelism requests merged as a rescale's."""
    config = old.with_parallelism(merge_parallelism(old.parallelism, requested))
    return replace(config, allow_non_restored_state=allow_non_restored_state)


async def upgrade(manager: JobManager, old: JobRecord, new: JobRecord, plan: Plan, *, directory: str,
                  timeout_s: float, restored: Callable[[JobRecord, str, Plan], None],
                  admit: Callable[[JobRecord, Plan], None]) -> r.Upgraded:
    """Steps 2-6 of the module docstring; RpcError (the old job still running) for every refusal before 5."""
    started = time.monotonic()
    checkpoint_id, path = await _savepoint(old, directory, timeout_s, "upgraded")
    savepoint_s = time.monotonic() - started
    try:
        plan = await manager.restored_plan(new, path, plan)
    except RpcError as exc:
        raise RpcError(f"job {old.job_id} not upgraded (it keeps running unchanged; savepoint {path} taken): "
                       f"{exc}", exc.remote_type or "IncompatibleCheckpoint") from None
    await manager.step("upgrade:savepoint-taken")
    restored(new, path, plan)
    new.upgrade_of = old.job_id
    try:
        await manager.write_ahead(new)
    except OSError as exc:
        raise RpcError(f"job {old.job_id} not upgraded (it keeps running unchanged; savepoint {path} taken): "
                       f"the record of its new version {new.job_id} could not be written: {exc}",
                       "JobRecordFailed") from None
    await manager.step("upgrade:successor-recorded")
    stopped_at = time.monotonic()
    await manager.cancel(old, f"upgraded to {new.job_id} ({new.entry}) from savepoint {checkpoint_id}")
    await manager.step("upgrade:predecessor-cancelled")
    admit(new, plan)
    deadline = stopped_at + timeout_s
    while new.state != JobState.RUNNING:
        if new.terminal or time.monotonic() > deadline:
            raise RpcError(f"job {old.job_id} was stopped with savepoint {path}, but its new version {new.job_id} "
                           f"is {new.state}: {new.error or 'it did not start in time'}", "RescaleFailed")
        await asyncio.sleep(POLL_S)
    downtime_s = time.monotonic() - stopped_at
    log.info("job %s upgraded to %s (%s, %s) from savepoint %s: down %.3fs", old.job_id, new.job_id, new.entry,
             describe_parallelism(new.plan), path, downtime_s)
    return r.Upgraded(new.job_id, old.job_id, path, checkpoint_id, savepoint_s, downtime_s,
                      [{"name": v.name, "parallelism": v.parallelism} for v in (new.plan.vertices if new.plan
                                                                                else [])])


async def stop_with_savepoint(manager: JobManager, job: JobRecord, *, directory: str,
                              timeout_s: float) -> r.Cancelled:
    """Take a savepoint, then cancel the job naming it; answer once the CANCELLED record is on disk. Every
    refusal (a savepoint that failed) comes while the job still runs unchanged."""
    checkpoint_id, path = await _savepoint(job, directory, timeout_s, "stopped")
    await manager.step("stop:savepoint-taken")
    await manager.cancel(job, f"stopped with savepoint {path}")
    if manager.record_written is not None:
        try:
            await manager.record_written(job.job_id)
        except OSError as exc:  # the job is stopped; only a crash now would recover it
            log.error("job %s: its record as stopped could not be written: %s", job.job_id, exc)
    await manager.step("stop:stopped")
    log.info("job %s stopped with savepoint %s", job.job_id, path)
    return r.Cancelled(job.state, savepoint=path, checkpoint_id=checkpoint_id)


async def _savepoint(job: JobRecord, directory: str, timeout_s: float, what: str) -> tuple[int, str]:
    """A completed savepoint of the running job: (its id, its path); RpcError naming why not."""
    runner = job.checkpoints
    if runner is None:
        raise RpcError(f"job {job.job_id} is {job.state}, not RUNNING: nothing to "
                       f"{'upgrade' if what == 'upgraded' else 'stop'}", "JobNotRunning")
    try:
        checkpoint_id, fut = runner.request(savepoint=True, directory=directory, stopping=True)
        result = await asyncio.wait_for(fut, timeout_s)
    except (ValueError, TimeoutError) as exc:
        raise RpcError(f"job {job.job_id} not {what}: its savepoint failed ({exc or 'timed out'}); it keeps "
                       "running unchanged", "RescaleCheckpointFailed") from None
    if not result.completed:
        raise RpcError(f"job {job.job_id} not {what}: savepoint {checkpoint_id} did not complete "
                       f"({result.reason or result.status}); it keeps running unchanged",
                       "RescaleCheckpointFailed")
    return checkpoint_id, str(result.path)
