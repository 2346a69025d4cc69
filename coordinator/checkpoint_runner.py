"""The I/O shell around one job's pure CheckpointCoordinator.

It turns clock ticks and worker messages into stimuli, and carries out the
instructions that come back: trigger RPCs to the workers that host sources,
`_metadata` written atomically through the storage (in a thread), complete /
abort notifications to every worker, deletion of aborted or retired
checkpoints, and reporting to the job manager when too many checkpoints fail
in a row. That report is a plain call (`fail_job`), never a task of this
runner: the failover it starts stops this runner, which cancels every task
the runner owns, and a failover running as one of them would cancel itself.
Whoever asked for a checkpoint (`sluice checkpoint`, `sluice savepoint`)
waits on a future that resolves when it completes or aborts.

Every task of the runner belongs to its one `BackgroundTasks` (which logs a
failure nobody awaits). `stop_nowait` ends it for its callers at once;
`stop` then lets retention discards finish and, when the job has finished,
`_metadata` writes under way too (bounded by `SETTLE_S`): a checkpoint that
completes as the job ends is durable whatever we do, so it still has
retention applied. Then it cancels and awaits the rest (a write of a failed
attempt's checkpoint is abandoned, as before: its workers are being
cancelled).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from coordinator.checkpointing import (
    CheckpointCoordinator,
    CheckpointSettings,
    CompletedCheckpoint,
    DiscardCheckpoint,
    FailJob,
    Instruction,
    NotifyAborted,
    NotifyComplete,
    Trigger,
    WriteMetadata,
)
from coordinator.storage import CheckpointStorage
from coordinator.trace_spans import SpanSink, checkpoint_span
from netstack.errors import NetstackError
from netstack.transport import Link
from runtime.common.tasks import BackgroundTasks
from runtime.graph import protocol as p
from runtime.graph import replies as r
from runtime.graph.checkpoint_figures import TaskCheckpointFigures
from runtime.graph.checkpoint_metadata import CheckpointMetadata

log = logging.getLogger("sluice.checkpoints")

SETTLE_S = 10.0  # how long `stop` waits for `_metadata` writes and retention discards under way


class CheckpointRunner:
    def __init__(self, *, job_id: str, attempt: int, settings: CheckpointSettings, tasks: frozenset[str],
                 storage: CheckpointStorage, links: Callable[[], list[Link]], job_info: dict[str, Any],
                 fail_job: Callable[[str], None], on_complete: Callable[[CompletedCheckpoint], None],
                 first_id: int = 1, submit_span: SpanSink | None = None) -> None:
        self.job_id = job_id
        self.attempt = attempt
        self.settings = settings
        self.storage = storage
        self._links = links
        self._job_info = job_info
        self._fail_job = fail_job
        self._on_complete = on_complete
        self.coordinator = CheckpointCoordinator(settings, tasks, first_id=first_id, now=time.monotonic())
        self.directories: dict[int, str] = {}
        self.waiters: dict[int, asyncio.Future[r.CheckpointDone]] = {}
        self._tasks = BackgroundTasks(f"checkpoints of {job_id}")
        self._ticker: asyncio.Future[None] | None = None
        # discards and writes outlive `stop_nowait`: a checkpoint that completes as the job ends or restarts is
        # recorded COMPLETED and still has retention applied
        self._discards: set[asyncio.Future[Any]] = set()
        self._writes: set[asyncio.Future[Any]] = set()
        self._closed = False  # `stop` has ended every task: nothing more is started
        # the OTLP export (coordinator/telemetry.py): each checkpoint's trace when it ends, built on its thread;
        # None: none is built
        self._submit_span = submit_span
        self._trigger_wall: dict[int, float] = {}  # the wall clock each trigger carried (tasks measure from it)
        # Triggers reach the workers one after the other, in id order: a source skips a trigger older than one it
        # took, and checkpoints may overlap (coordinator/checkpointing.py, may_overlap) only because every
        # source injects their barriers in id order. Each trigger's storage step runs in a thread, so without
        # this a savepoint's trigger could overtake the periodic checkpoint's started just before it.
        self._trigger_order = asyncio.Lock()

    def start(self) -> None:
        # ticks also run without periodic checkpoints: they time out manual ones
        self._ticker = self._tasks.spawn(self._tick_loop(), name=f"{self.job_id} checkpoint ticks")

    def stop_nowait(self, reason: str) -> None:
        """No more ticks; whoever waits for a checkpoint gets ABORTED with `reason`."""
        if self._ticker is not None:
            self._ticker.cancel()
        self.execute(self.coordinator.stopped(time.monotonic(), reason))
        for fut in self.waiters.values():
            if not fut.done():
                fut.set_result(r.CheckpointDone("ABORTED", reason=reason))

    async def stop(self, reason: str, *, job_finished: bool = False) -> None:
        """`stop_nowait`, then wait for retention discards and `_metadata` writes under way, bounded (a finished
        job's runner then sweeps unreferenced shared files); then cancel and await every other task."""
        self.stop_nowait(reason)
        deadline = time.monotonic() + SETTLE_S
        while time.monotonic() < deadline:
            # a `_metadata` write under way lands in storage whatever happens (a thread), so it is always
            # awaited: a restart may restore it, and its history entry must say COMPLETED, not IN_PROGRESS
            settling = self._discards | self._writes
            if not settling:
                break
            await asyncio.wait(settling, timeout=max(0.0, deadline - time.monotonic()))  # a write adds discards
        if self._discards:
            log.warning("job %s: %d checkpoint discards did not end within %.0fs", self.job_id,
                        len(self._discards), SETTLE_S)
        elif job_finished and not self._writes:
            await self._sweep_shared()
        await self._tasks.cancel_and_wait()
        self._closed = True

    async def _tick_loop(self) -> None:
        # 20 ticks a second: timeouts and intervals are honoured to within 50 ms
        while True:
            await asyncio.sleep(0.05)
            self.execute(self.coordinator.tick(time.monotonic()))

    # -- stimuli ----------------------------------------------------------------

    def request(self, *, savepoint: bool = False, directory: str | None = None, mode: str | None = None,
                stopping: bool = False) -> tuple[int, asyncio.Future[r.CheckpointDone]]:
        """A manual checkpoint or savepoint (CheckpointCoordinator.request: `stopping` for a savepoint the job stops
        with, whose completion commits) and the future of its end."""
        checkpoint_id, instructions = self.coordinator.request(time.monotonic(), savepoint=savepoint,
                                                               directory=directory, mode=mode, stopping=stopping)
        fut: asyncio.Future[r.CheckpointDone] = asyncio.get_running_loop().create_future()
        self.waiters[checkpoint_id] = fut
        self.execute(instructions)
        return checkpoint_id, fut

    def ack(self, checkpoint_id: int, task: str, state: dict[str, Any], figures: TaskCheckpointFigures) -> None:
        self.execute(self.coordinator.ack(time.monotonic(), checkpoint_id, task, state, figures))

    def decline(self, checkpoint_id: int, task: str, reason: str) -> None:
        self.execute(self.coordinator.decline(time.monotonic(), checkpoint_id, task, reason))

    def task_finished(self, task: str) -> None:
        self.execute(self.coordinator.task_finished(time.monotonic(), task))

    def task_failed(self, reason: str) -> None:
        self.execute(self.coordinator.task_failed(time.monotonic(), reason))

    # -- instructions -----------------------------------------------------------------

    def execute(self, instructions: list[Instruction]) -> None:
        for ins in instructions:
            if isinstance(ins, Trigger):
                self._spawn(self._trigger(ins))
            elif isinstance(ins, WriteMetadata):
                self._spawn(self._write_metadata(ins), self._writes)
            elif isinstance(ins, NotifyComplete):
                self._trace(ins.checkpoint_id)
                if ins.tasks:
                    self._notify(p.CheckpointNotice(self.job_id, ins.checkpoint_id, self.attempt))
                self._resolve(r.CheckpointDone("COMPLETED", ins.checkpoint_id,
                                               path=self.directories.get(ins.checkpoint_id, "")))
            elif isinstance(ins, NotifyAborted):
                log.warning("job %s: checkpoint %d aborted: %s", self.job_id, ins.checkpoint_id, ins.reason)
                self._trace(ins.checkpoint_id)
                self._notify(p.CheckpointAborted(self.job_id, ins.checkpoint_id, self.attempt))
                self._resolve(r.CheckpointDone("ABORTED", ins.checkpoint_id, reason=ins.reason))
            elif isinstance(ins, DiscardCheckpoint):
                path = self.directories.pop(ins.checkpoint_id, None)
                if path:
                    self._spawn(self._discard(ins.checkpoint_id, path), self._discards)
            elif isinstance(ins, FailJob):
                self._fail_job(f"checkpoints failing: {ins.reason}")

    def _trace(self, checkpoint_id: int) -> None:
        """The ended checkpoint's spans (coordinator/trace_spans.py) to the OTLP export, when there is one."""
        trigger_wall = self._trigger_wall.pop(checkpoint_id, None)
        if self._submit_span is None:
            return
        ended = self.coordinator.ended(checkpoint_id)  # None: a queued request dropped before it started
        if ended is None:
            return
        summary, tasks = ended  # frozen figures in a dict of their own: safe to read on the telemetry's thread
        job_id, attempt, offset = self.job_id, self.attempt, time.time() - time.monotonic()
        self._submit_span(lambda: checkpoint_span(summary, tasks, job_id=job_id, attempt=attempt,
                                                  wall_offset_s=offset, trigger_wall_s=trigger_wall))

    async def _sweep_shared(self) -> None:
        """The job finished and every discard ended: shared files nothing completed references go (storage)."""
        try:
            swept = await asyncio.to_thread(self.storage.sweep_shared, self.job_id)
        except OSError as exc:
            log.warning("job %s: shared checkpoint files not swept: %s", self.job_id, exc)
            return
        if swept:
            log.info("job %s: swept %d shared checkpoint files no completed checkpoint references", self.job_id,
                     swept)

    async def _discard(self, checkpoint_id: int, path: str) -> None:
        """Delete a retired or aborted checkpoint. A store that fails (an unreachable bucket) leaves it behind
        with one line: nothing depends on the deletion, and it is no error of the job's."""
        try:
            await asyncio.to_thread(self.storage.discard, path)
        except (OSError, ValueError) as exc:
            log.warning("job %s: checkpoint %d at %s not discarded: %s", self.job_id, checkpoint_id, path, exc)

    async def _record_retained(self) -> None:
        """Tell the remote state backend which checkpoints are retained (storage.record_retained). A failure
        only delays its garbage collection, which keeps everything newer than the last record."""
        try:
            await asyncio.to_thread(self.storage.record_retained, self.job_id, self.coordinator.retained)
        except (OSError, ValueError) as exc:
            log.warning("job %s: cannot record the retained checkpoints: %s", self.job_id, exc)

    def _spawn(self, coro: Any, tasks: set[asyncio.Future[Any]] | None = None) -> None:
        if self._closed:
            coro.close()
            return
        task = self._tasks.spawn(coro)
        if tasks is not None:
            tasks.add(task)
            task.add_done_callback(tasks.discard)

    def _resolve(self, result: r.CheckpointDone) -> None:
        assert result.checkpoint_id is not None
        fut = self.waiters.pop(result.checkpoint_id, None)
        if fut is not None and not fut.done():
            fut.set_result(result)

    async def _trigger(self, ins: Trigger) -> None:
        # acquired before the first await: tasks start in the order they were spawned, so the lock's FIFO
        # waiters are in id order
        async with self._trigger_order:
            await self._trigger_in_order(ins)

    async def _trigger_in_order(self, ins: Trigger) -> None:
        try:
            if ins.savepoint:
                assert ins.directory is not None
                directory = await asyncio.to_thread(self.storage.savepoint_dir, ins.directory, self.job_id,
                                                    ins.checkpoint_id)
            else:
                directory = await asyncio.to_thread(self.storage.checkpoint_dir, self.job_id, ins.checkpoint_id)
        except (OSError, ValueError) as exc:
            # an unwritable state directory declines this checkpoint (NotifyAborted logs one line with the
            # reason); the job goes on, and tolerable_failures decides when it has had enough
            why = (f"cannot create its directory under {exc.filename}: {exc.strerror}"
                   if isinstance(exc, OSError) and exc.strerror else str(exc))
            self.execute(self.coordinator.storage_failed(time.monotonic(), ins.checkpoint_id, why))
            return
        self.directories[ins.checkpoint_id] = directory
        message = p.TriggerCheckpoint(job_id=self.job_id, attempt=self.attempt, checkpoint_id=ins.checkpoint_id,
                                      options=ins.options, started_at=time.time(), directory=directory)
        if self._submit_span is not None:
            self._trigger_wall[ins.checkpoint_id] = message.started_at
        try:
            await asyncio.gather(*(p.call(link, message, timeout_s=10.0) for link in self._links()))
        except NetstackError as exc:
            self.execute(self.coordinator.trigger_failed(time.monotonic(), ins.checkpoint_id, str(exc)))

    async def _write_metadata(self, ins: WriteMetadata) -> None:
        directory = self.directories.get(ins.checkpoint_id)
        if directory is None:
            self.execute(self.coordinator.metadata_failed(time.monotonic(), ins.checkpoint_id, "no directory"))
            return
        info = self._job_info
        metadata = CheckpointMetadata(
            ins.checkpoint_id, ins.acks, job_id=self.job_id, attempt=self.attempt, savepoint=ins.savepoint,
            mode=ins.mode.value, created_at=time.time(), duration_s=ins.completed_at - ins.started_at,
            entry=str(info.get("entry", "")), name=str(info.get("name", "")),
            vertices=tuple(info.get("vertices", ())), operators=tuple(info.get("operators", ())),
            edges=tuple(info.get("edges", ())))
        try:
            lost = await asyncio.to_thread(self._write_if_complete, directory, metadata)
        except (OSError, ValueError) as exc:
            self.execute(self.coordinator.metadata_failed(time.monotonic(), ins.checkpoint_id, str(exc)))
            return
        if lost:
            reason = (f"storage lost {len(lost)} file(s) the checkpoint names, e.g. {lost[0]} (a wiped or expired "
                      f"store?); the next checkpoints write every file anew")
            self.execute(self.coordinator.metadata_failed(time.monotonic(), ins.checkpoint_id, reason,
                                                          files_lost=True))
            return
        instructions = self.coordinator.metadata_written(time.monotonic(), ins.checkpoint_id)
        if not ins.savepoint:  # retention hook: the record first, then the discards it implies
            await self._record_retained()
        summary = next((s for s in reversed(self.coordinator.history()) if s.checkpoint_id == ins.checkpoint_id),
                       None)
        self._on_complete(CompletedCheckpoint(ins.checkpoint_id, directory, summary))
        self.execute(instructions)

    def _write_if_complete(self, directory: str, metadata: CheckpointMetadata) -> list[str]:
        """Write `_metadata` if storage holds every file it names; returns those it does not (then nothing is
        written). On the storage thread."""
        lost = self.storage.missing_files(directory, metadata)
        if not lost:
            self.storage.write_metadata(directory, metadata)
        return lost

    def _notify(self, notice: p.CheckpointNotice) -> None:
        async def notify_all() -> None:
            results = await asyncio.gather(*(p.call(link, notice, timeout_s=10.0) for link in self._links()),
                                           return_exceptions=True)
            for result in results:
                if isinstance(result, Exception):
                    log.warning("job %s: %s %d not delivered: %s", self.job_id, notice.method,
                                notice.checkpoint_id, result)

        self._spawn(notify_all())
