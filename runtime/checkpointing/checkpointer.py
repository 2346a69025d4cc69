"""One task's side of a checkpoint: snapshot, forward the barrier, persist, acknowledge.

The barrier handler (runtime/barriers.py) decides *when*; this module does
it. The synchronous part on the event loop is small: copy the state tables,
put the barrier on every output (on the priority lane for unaligned
checkpoints, which hands back the overtaken buffers) and capture the input
buffers that precede the barrier. The sinks' pre-commit is user code: the
task makes it on its thread before anything else of it runs
(Task.defer_user_call), and the state file is written once it returned.
Encoding and writing happen in the worker's checkpoint writer thread while
processing goes on.

Concurrent checkpoints: a run per checkpoint. A newer snapshot gives up an
older run only while that one's inputs are still incomplete (an aligned
checkpoint subsumed by the next); one that is persisting goes on beside it.

The task acknowledges when its inputs are complete (every barrier arrived),
its outputs are complete (every barrier left its queue, or was promoted to
the priority lane at the aligned-timeout deadline), and every file is
durable.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from netstack.credit import Buffer, Event
from runtime.checkpointing import backend_snapshots
from runtime.checkpointing.barriers import BarrierSpec, InflightBudget
from runtime.checkpointing.channel_files import ChannelStateFiles, input_capture, output_capture
from runtime.checkpointing.channel_segments import ChannelCapture
from runtime.checkpointing.snapshots import encode_operator_state
from runtime.checkpointing.writer import CheckpointWriter, Encoded, Written
from runtime.execution.channels import Subpartition
from runtime.execution.mailbox import Mail
from runtime.execution.task import CheckpointStatistics, Task
from runtime.graph.checkpoint_figures import TaskCheckpointFigures
from runtime.graph.enums import CheckpointMode

log = logging.getLogger("sluice.checkpoint")

AckCallback = Callable[[Task, BarrierSpec, dict[str, Any], TaskCheckpointFigures], None]
DeclineCallback = Callable[[Task, int, str], None]


@dataclass
class CheckpointRun:
    spec: BarrierSpec
    unaligned: bool
    barrier: Event
    started: float  # monotonic, first barrier (or trigger) at this task
    first_barrier_wall: float
    sync_s: float = 0.0
    inputs_done: bool = False
    # subpartitions whose in-band barrier (or, past the end of input, end of partition) is still queued, each
    # with that event and when it was queued (wall clock): aligned_timeout promotes them at the deadline, a
    # switching checkpoint each one at its channel timeout or byte threshold
    outputs_waiting: list[tuple[Subpartition, Event, float]] = field(default_factory=list)
    in_prefix: dict[int, bytes] = field(default_factory=dict)
    in_buffers: dict[int, list[Buffer]] = field(default_factory=dict)
    out_state: dict[str, ChannelCapture] = field(default_factory=dict)
    writes: list[asyncio.Task[Written]] = field(default_factory=list)
    # writes whose done callback has run: a write may be done before its callback has added its bytes (and the
    # backend handle), so the ack waits for the callbacks, not only for the writes
    settled: int = 0
    files: dict[str, Any] = field(default_factory=dict)
    state_bytes: int = 0
    inflight_bytes: int = 0
    alignment_s: float = 0.0
    out_written: bool = False
    acked: bool = False
    backend: dict[str, Any] | None = None  # the state backend's snapshot handle, once uploaded
    backend_sync_s: float = 0.0
    async_captured: int | None = None  # an asynchronous operator's records captured in flight
    # the sinks' pre-commit is still to be made (user code, on the task's thread: Task.defer_user_call); the
    # state file is written once it returned, and the task acknowledges nothing before
    awaiting_sinks: bool = False


class TaskCheckpointer:
    def __init__(self, task: Task, writer: CheckpointWriter, *, task_key: str, max_parallelism: int,
                 on_ack: AckCallback, on_decline: DeclineCallback, incremental_channel_state: bool = True) -> None:
        self.task = task
        self.writer = writer
        self.task_key = task_key
        self.max_parallelism = max_parallelism
        self.on_ack = on_ack
        self.on_decline = on_decline
        # channel state written incrementally: buffers still queued at the next checkpoint are referenced
        self.channel_files = ChannelStateFiles(task_key, incremental=incremental_channel_state)
        self.runs: dict[int, CheckpointRun] = {}  # by checkpoint id: those not acknowledged, and the latest
        # checkpoint id -> (monotonic, wall) of its first barrier (or trigger) here, until its snapshot: a savepoint
        # may align beside a newer unaligned checkpoint, which starts and snapshots first
        self._first_barriers: dict[int, tuple[float, float]] = {}
        self._newest_snapshot = 0  # the newest checkpoint snapshotted here (the sinks' labels: `_sink_label`)
        self._fences: dict[int, Event] = {}  # savepoints' barriers put on the outputs as fences, by checkpoint id
        self.last_alignment_s = 0.0
        self.last_start_delay_s = 0.0
        self.last_inflight_bytes = 0
        self.inflight_bytes_total = 0
        self.budget = InflightBudget()  # shared with the task's BarrierHandler (the input side)

    @property
    def run(self) -> CheckpointRun | None:
        """The latest checkpoint's run."""
        return self.runs[max(self.runs)] if self.runs else None

    def statistics(self) -> CheckpointStatistics:
        return CheckpointStatistics(self.last_alignment_s, self.last_start_delay_s, self.last_inflight_bytes,
                                    self.inflight_bytes_total, self.budget.switched, self.budget.refused)

    # -- snapshot ---------------------------------------------------------------

    def mark_first_barrier(self, checkpoint_id: int) -> None:
        """A barrier (or trigger) of `checkpoint_id` reached the task: its clocks start now if it is the first."""
        marks = self._first_barriers
        if checkpoint_id not in marks:
            marks[checkpoint_id] = (time.monotonic(), time.time())
            while len(marks) > 8:  # barriers of checkpoints given up before their snapshot
                del marks[min(marks)]

    def _sink_label(self, checkpoint_id: int) -> int:
        """The id the sinks pre-commit `checkpoint_id`'s output under. Its own, but for a savepoint snapshotted
        after a newer unaligned checkpoint that overtook it here (runtime/checkpointing/barriers.py): the
        newer one's id + 1, which the coordinator never gives a checkpoint (coordinator/checkpointing.py). A
        sink commits what it pre-committed under ids up to the completed one, and a restore drops output
        under later ids: the savepoint's output, written after the newer snapshot, then belongs after it (that
        checkpoint's completion must not publish it, a restore from it must drop it) and before the next one."""
        newest = self._newest_snapshot
        self._newest_snapshot = max(newest, checkpoint_id)
        return checkpoint_id if checkpoint_id > newest else newest + 1

    def snapshot(self, spec: BarrierSpec, *, unaligned: bool, record_inputs: bool = False) -> None:
        """Snapshot for `spec`; `unaligned`: barriers overtake the outputs and the inputs are recorded;
        `record_inputs` alone: a mixed checkpoint (switched channels recorded, outputs aligned)."""
        task = self.task
        for older in list(self.runs.values()):
            # not a newer one: a savepoint snapshots after the unaligned checkpoint that overtook it, still recording
            if not older.inputs_done and older.spec.checkpoint_id < spec.checkpoint_id:
                self.abandon(older.spec.checkpoint_id, "superseded by a newer checkpoint")
        t0 = time.perf_counter()
        pending = task.chain.begin_state_snapshot(spec.checkpoint_id)  # a state backend's synchronous part
        async_inflight = task.chain.take_async_inflight()  # an asynchronous operator's records in flight
        keyed = task.snapshot_keyed_state()
        source = task.source_position()
        lists = task.chain.snapshot_lists()
        time_state = task.time_state()
        barrier = Event(spec.to_body())
        waits = spec.mode == CheckpointMode.ALIGNED_TIMEOUT or spec.switching  # outputs may be promoted later
        now_wall = time.time()
        started, first_barrier_wall = self._first_barriers.pop(spec.checkpoint_id, (time.monotonic(), now_wall))
        run = CheckpointRun(spec, unaligned, barrier, started=started, first_barrier_wall=first_barrier_wall)
        self.channel_files.begin(spec.checkpoint_id, savepoint=spec.savepoint, full=spec.options.full)
        if async_inflight is not None:  # records in flight captured for replay (0 when drained first)
            run.async_captured = sum(1 for doc in async_inflight.values() for e in doc["replay"] if e[0] == "r")
        self.runs[spec.checkpoint_id] = run
        for done in [r for r in self.runs.values() if r.acked and r is not run]:
            del self.runs[done.spec.checkpoint_id]
        for sub in task.subpartitions:
            if task.end_of_input:
                self._overtake_end(run, sub)
                continue
            if unaligned:
                capture = output_capture(sub.add_event(barrier, priority=True))
                if capture is not None:
                    run.out_state[sub.key] = capture
            else:
                # a savepoint's barrier is a fence: a newer unaligned one queued behind it overtakes only the
                # buffers after it, and reaches downstream right after it (runtime/checkpointing/barriers.py)
                sub.add_event(barrier, fence=spec.savepoint)
                if waits:
                    run.outputs_waiting.append((sub, barrier, now_wall))
        if spec.savepoint and not unaligned and not task.end_of_input:
            self._fences[spec.checkpoint_id] = barrier
            while len(self._fences) > 4:
                del self._fences[min(self._fences)]
        if (unaligned or record_inputs) and task.gate is not None:
            run.in_buffers = task.gate.start_recording(spec.checkpoint_id)
            run.in_prefix = task.unprocessed_bytes()
        run.sync_s = time.perf_counter() - t0
        path = self._path(spec, "state")
        run.files["state"] = os.path.basename(path)
        mp = self.max_parallelism
        if pending is not None:
            run.backend_sync_s = pending.sync_seconds

        def write_state(sinks: list[Any]) -> None:
            def produce_state() -> bytes:  # on the writer thread: the backend's upload first, then the state file
                backend = None
                if pending is not None:
                    backend = run.backend = backend_snapshots.upload(pending, spec.directory,
                                                                     savepoint=spec.savepoint,
                                                                     full=spec.options.full)
                return encode_operator_state(keyed, max_parallelism=mp, source=source, sinks=sinks, lists=lists,
                                             time=time_state, backend=backend, async_inflight=async_inflight)

            self._write(run, path, produce_state, "state")

        if task.chain.sinks:
            # the sinks' pre-commit is user code (a client that may block): made on the task's thread before the
            # task serves its next message or runs another record, so it still sees the state of this snapshot
            run.awaiting_sinks = True
            task.defer_user_call(_timed_pre_commit, (task, self._sink_label(spec.checkpoint_id)),
                                 functools.partial(self._sinks_pre_committed, run, write_state))
        else:
            write_state([])
        if task.gate is None:
            run.inputs_done = True
        self.poll_outputs(time.time())

    def _sinks_pre_committed(self, run: CheckpointRun, write_state: Callable[[list[Any]], None],
                             outcome: tuple[list[Any], float]) -> None:
        sinks, took_s = outcome
        run.awaiting_sinks = False
        run.sync_s += took_s
        if self.runs.get(run.spec.checkpoint_id) is not run:  # given up meanwhile (a failed write of its own)
            return
        write_state(sinks)
        self._maybe_finish(run)

    def _overtake_end(self, run: CheckpointRun, sub: Subpartition) -> None:
        """A task past its end of input put "end" on every output, and no barrier may follow it. While the end
        still waits in the queue behind data (downstream is backpressured), an unaligned barrier overtakes both
        and the data becomes output channel state, as in Flink's FLIP-147: the checkpoint does not wait until
        downstream has taken the backlog. Once the end has left, downstream counts it when it arrives
        (BarrierHandler.on_end_arrival). Aligned: downstream takes the data and the end, then counts it."""
        end = sub.end_event
        if end is None or not sub.sender.holds(end):
            return
        if run.unaligned:
            capture = output_capture(sub.add_event(run.barrier, priority=True))
            if capture is not None:
                run.out_state[sub.key] = capture
        elif run.spec.mode == CheckpointMode.ALIGNED_TIMEOUT or run.spec.switching:
            run.outputs_waiting.append((sub, end, time.time()))

    def inputs_complete(self, spec: BarrierSpec, *, unaligned: bool) -> None:
        run = self.runs.get(spec.checkpoint_id)
        if run is None:
            return
        run.inputs_done = True
        run.alignment_s = time.monotonic() - run.started
        if self.task.gate is not None:
            self.task.gate.stop_recording(spec.checkpoint_id)
        if unaligned and (run.in_prefix or any(run.in_buffers.values())):
            run.unaligned = True  # a mixed checkpoint (switched channels) carries in-flight data too
            gate = self.task.gate
            assert gate is not None
            captures, ends = {}, {}
            for cid, buffers in run.in_buffers.items():
                key = gate.channels[cid].key
                captures[key], ends[key] = input_capture(run.in_prefix.get(cid, b""), buffers)
            encode_inputs = self.channel_files.produce(spec.directory, spec.checkpoint_id, "in", captures, ends)
            path = self._path(spec, "in")
            run.files["in"] = os.path.basename(path)
            self._write(run, path, encode_inputs, "in")
        self._maybe_finish(run)

    def poll_outputs(self, now: float) -> None:
        """Outputs are complete when every barrier has left its queue. At the deadline (aligned_timeout),
        promote the rest; with per-channel switching, each one that is due and fits the in-flight cap."""
        for run in list(self.runs.values()):
            if not run.out_written:
                self._poll_run(run, now)

    def _poll_run(self, run: CheckpointRun, now: float) -> None:
        spec = run.spec
        still = []
        for sub, ev, since in run.outputs_waiting:
            ahead = sub.sender.bytes_before(ev)
            if ahead is None:
                continue  # sent
            at_deadline = spec.deadline is not None and now >= spec.deadline  # aligned_timeout: all of them
            if at_deadline or (spec.channel_due(now - since, ahead) and self.budget.charge(spec, ahead)):
                self._promote(run, sub, ev)
            else:
                still.append((sub, ev, since))  # a channel the cap refused is asked again at the next poll
        run.outputs_waiting = still
        if still:
            return
        run.out_written = True
        if run.out_state:
            encode_outputs = self.channel_files.produce(run.spec.directory, run.spec.checkpoint_id, "out",
                                                        dict(run.out_state))
            path = self._path(run.spec, "out")
            run.files["out"] = os.path.basename(path)
            self._write(run, path, encode_outputs, "out")
        self._maybe_finish(run)

    def _promote(self, run: CheckpointRun, sub: Subpartition, ev: Event) -> None:
        """Let the barrier overtake the data queued ahead of it, which becomes output channel state: the
        barrier itself, or (past the end of input) a priority barrier ahead of the queued end."""
        overtaken = sub.promote(ev) if ev is run.barrier else sub.add_event(run.barrier, priority=True)
        run.unaligned = True  # this checkpoint now carries in-flight data
        capture = output_capture(overtaken or [])
        if capture is not None:
            run.out_state[sub.key] = capture

    def waiting_outputs(self) -> bool:
        return any(not run.out_written for run in self.runs.values())

    # -- completion -------------------------------------------------------------

    def _path(self, spec: BarrierSpec, kind: str) -> str:
        return os.path.join(spec.directory, f"{self.task_key.replace(':', '-')}.{kind}")

    def _write(self, run: CheckpointRun, path: str, produce: Callable[[], bytes | Encoded], kind: str) -> None:
        write = asyncio.ensure_future(self.writer.write(path, produce))
        run.writes.append(write)

        def done(fut: asyncio.Task[Written]) -> None:
            if fut.cancelled():
                return
            exc = fut.exception()  # retrieved even for an abandoned run: asyncio would log it as never retrieved
            if self.runs.get(run.spec.checkpoint_id) is not run:
                return
            if exc is not None:
                self.abandon(run.spec.checkpoint_id, f"writing {kind} failed: {exc}")
                if getattr(exc, "unrecoverable", False):  # a value no checkpoint can hold: fail now, not later
                    self.task.post(Mail(functools.partial(_raise, exc), f"checkpoint {kind} cannot be written"))
                return
            written = fut.result()
            run.settled += 1
            if kind == "state":
                run.state_bytes += written.bytes
                if run.backend is not None:
                    run.files["backend"] = run.backend
                    run.state_bytes += int(run.backend.get("uploaded_bytes", 0))
            else:
                run.inflight_bytes += written.bytes
            self._maybe_finish(run)

        write.add_done_callback(done)

    def _maybe_finish(self, run: CheckpointRun) -> None:
        if (run.acked or run.awaiting_sinks or not run.inputs_done or not run.out_written
                or run.settled < len(run.writes)):
            return
        run.acked = True
        async_s = max(0.0, time.monotonic() - run.started - run.sync_s)
        first_barrier_s = max(0.0, run.first_barrier_wall - run.spec.started_at)
        backend = run.backend
        figures = TaskCheckpointFigures(  # the figures are declared in runtime/graph/checkpoint_figures.py
            sync_s=run.sync_s, async_s=async_s, alignment_s=run.alignment_s, start_delay_s=first_barrier_s,
            first_barrier_s=first_barrier_s, last_barrier_s=first_barrier_s + run.alignment_s,
            state_bytes=run.state_bytes, inflight_bytes=run.inflight_bytes, unaligned=run.unaligned,
            backend_sync_s=run.backend_sync_s if backend is not None else None,
            backend_uploaded_bytes=int(backend.get("uploaded_bytes", 0)) if backend is not None else None,
            backend_total_bytes=int(backend.get("total_bytes", 0)) if backend is not None else None,
            async_captured_records=run.async_captured,
            switched_channels=self.budget.channels.get(run.spec.checkpoint_id, 0) if run.spec.switching else None)
        self.last_alignment_s = run.alignment_s
        self.last_start_delay_s = figures.start_delay_s
        self.last_inflight_bytes = run.inflight_bytes
        self.inflight_bytes_total += run.inflight_bytes
        files: dict[str, Any] = dict(run.files)
        # from the writes themselves: another write's done callback may ack before this one's has run
        checksums = {os.path.basename(w.result().path): w.result().checksum for w in run.writes
                     if not w.cancelled() and w.exception() is None}
        if checksums:
            files["checksums"] = checksums
        segments = self.channel_files.segments(run.spec.checkpoint_id)
        if segments:  # the shared channel-state segments its files reference (retention keeps them)
            files["segments"] = segments
        self.on_ack(self.task, run.spec, files, figures)

    def lift_fence(self, checkpoint_id: int) -> None:
        """Savepoint `checkpoint_id` was aborted: its barriers, still queued on some outputs, are fences no more
        (later unaligned barriers would wait behind them for nothing). A checkpoint whose barrier already waited
        behind one overtook only the data after it: this task gives it up (declines it)."""
        barrier = self._fences.pop(checkpoint_id, None)
        if barrier is None:
            return
        dropped: set[int] = set()
        for sub in self.task.subpartitions:
            dropped.update(int(ev.body["id"]) for ev in sub.lift_fence(barrier) if ev.body.get("t") == "barrier")
        for n in sorted(dropped):
            reason = f"its barrier waited behind savepoint {checkpoint_id}'s, which was aborted"
            acked = n not in self.runs or self.runs[n].acked  # downstream still waits for its barrier: decline
            self.abandon(n, reason)
            if acked:
                self.on_decline(self.task, n, reason)

    def abandon(self, checkpoint_id: int, reason: str) -> None:
        run = self.runs.pop(checkpoint_id, None)
        if run is None:
            return
        if self.task.gate is not None and not run.inputs_done:  # it was the one recording (if any)
            self.task.gate.stop_recording(checkpoint_id)
        for write in run.writes:
            write.cancel()
        if not run.acked:
            self.on_decline(self.task, checkpoint_id, reason)


def _raise(exc: BaseException) -> None:
    raise exc


def _timed_pre_commit(task: Task, checkpoint_id: int) -> tuple[list[Any], float]:
    """On the task's thread: the sinks' pre-committed states for `checkpoint_id`, and how long they took."""
    t0 = time.perf_counter()
    sinks = task.chain.snapshot_sinks(checkpoint_id)
    return sinks, time.perf_counter() - t0
