"""A running subtask: its input gate, operator chain, outputs and mailbox.

The hot loop takes one input buffer at a time, decodes its records with the
input channel's msgpack Unpacker (which also joins records that span buffers)
a chunk at a time, and runs the chain once per chunk, with no await per
record. Before each chunk it checks two things: is the output blocked (a
subpartition queue at its limit) and is there mail (barriers, checkpoint
triggers and notifications, probes, cancellation). Only then does it await,
so a backpressured task still answers its mailbox within one chunk's time, and
never starts a chunk it has no output buffer for (a started chunk may overdraw
its buffer; the queue limit is soft by one chunk).

The chunk size adapts to the cost of a record: it doubles while a chunk takes
less than CHUNK_S / 4 and halves when one takes more than CHUNK_S, up to
MAX_CHUNK. Cheap records go a few hundred per call; slow ones (a throttled
sink) one at a time, exactly as before, so mail is never kept waiting.

A task whose chain blocks (runtime/execution/isolation.py) makes the same
calls on a thread of its own and awaits each one (`_offload`): everything
between the calls (mailbox, snapshots, credit, waiting for output) stays
here on the event loop, in the same order as inline.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import msgpack

from netstack.credit import Buffer, Event
from runtime.api.time import MAX_WATERMARK, MIN_WATERMARK
from runtime.connectors.source import Source
from runtime.execution.channels import ChannelReader, InputChannel, InputGate, OutputGate, Subpartition, event
from runtime.execution.isolation import IsolationPolicy, TaskThread
from runtime.execution.mailbox import Cancel, InjectProbe, Mail, Message, PriorityEvent
from runtime.execution.operators import Chain
from runtime.execution.probes import ProbeTracker
from runtime.execution.time_accounting import BACKPRESSURED_TIME, IDLE_TIME, TimeAccounting
from runtime.execution.timers import current_time_ms
from runtime.execution.watermarks import ACTIVE, IDLE, NOTHING, WatermarkCombiner, WatermarkGenerator
from runtime.graph.enums import TaskState

log = logging.getLogger("sluice.task")

YIELD_AFTER_S = 0.002
SOURCE_BATCH = 512
CHUNK_S = 0.0005  # the longest a chunk of records should keep mail waiting
MAX_CHUNK = 256  # keeps a chunk's output (and so the overdraft of a blocked output) well under one buffer
TIMER_CHUNK = 64  # timers fired between two turns of the mailbox (a timer storm must not hold a barrier back)


def _next_chunk(chunk: int, took_s: float) -> int:
    """The next chunk size, from how long the last chunk took (see the module docstring)."""
    if took_s > CHUNK_S:
        return chunk // 2 or 1
    if took_s < CHUNK_S / 4 and chunk < MAX_CHUNK:
        return chunk * 2
    return chunk


class TaskCancelled(Exception):
    pass


@dataclass(frozen=True)
class TaskKey:
    """Which subtask this is, as structured fields (metrics labels, checkpoint files, logs)."""

    job_id: str
    vertex: int
    subtask: int
    operator: str  # the vertex's display name
    parallelism: int

    @property
    def vertex_subtask(self) -> str:
        """"<vertex>:<subtask>", stable across attempts (checkpoint files and acknowledgements use it)."""
        return f"{self.vertex}:{self.subtask}"

    @property
    def task_id(self) -> str:
        return f"{self.job_id}/{self.vertex}:{self.subtask}"

    @property
    def display_name(self) -> str:
        return f"{self.operator} ({self.subtask + 1}/{self.parallelism})"


@dataclass(frozen=True)
class CheckpointStatistics:
    last_alignment_s: float = 0.0
    last_start_delay_s: float = 0.0
    last_inflight_bytes: int = 0
    inflight_bytes_total: int = 0
    # per-channel switching (InflightBudget): channels switched to unaligned, switches the in-flight cap refused
    channels_switched: int = 0
    switches_refused: int = 0


@dataclass
class TaskStatistics:
    records_in: int
    records_out: int
    busy_s: float
    idle_s: float
    backpressured_s: float
    watermarks_in: int  # watermark and idle/active status markers received (event time only; not in records_in)
    measured_at: float  # this process's monotonic clock when the figures were read: rates are timed by it
    input_queue: int
    output_queue: int
    output_buffers_limit: int
    output_pool_usage: float  # the fullest output channel's queue over its limit: what blocks the task
    bytes_in: int
    bytes_out: int
    last_alignment_s: float
    last_start_delay_s: float
    last_inflight_bytes: int
    inflight_bytes_total: int
    current_watermark: int | None = None  # None: the job has no event time
    # an asynchronous keyed operator (None without one): records in flight now, time input waited for admission,
    # records checkpoints captured in flight for replay
    async_in_flight: int | None = None
    async_blocked_s: float = 0.0
    async_captured_records: int = 0
    channels_switched: int = 0  # over the task's life: channels switched to unaligned (input and output side)
    switches_refused: int = 0  # switches the checkpoint's in-flight cap refused


@dataclass
class RestoredState:
    """What a task restores before it processes anything new."""

    keyed: dict[int, dict[str, dict[Any, Any]]] | None = None  # node id -> state name -> key -> value
    # snapshot handles of a state backend (SnapshotHandle.to_dict plus "store", the layout: see
    # runtime/checkpointing/backend_snapshots.py): one, or several old subtasks' when rescaled; the worker
    # restores them into the task's backend before the task runs
    backend: list[dict[str, Any]] | None = None
    # after the backend's restore: entries of old node id k move to node id v (None: dropped), for operators
    # matched by uid under another node id (runtime/checkpointing/restore_plan.py Cut.backend_moves)
    backend_moves: dict[int, int | None] | None = None
    source: Any = None  # [position before the batch, records of it already emitted]
    sinks: list[Any] | None = None  # the sinks' pre-committed state, in chain order
    inputs: dict[int, bytes] | None = None  # channel id -> whole records
    outputs: dict[str, bytes] | None = None  # subpartition key -> whole records
    finished: bool = False  # the task had finished when the checkpoint was taken: it has nothing left to do
    ended: bool = False  # it was past its end of input (operators finished): only its last commit is left
    lists: dict[int, dict[str, list[Any]]] | None = None  # node id -> name -> [mode, items] (list state)
    time: dict[str, Any] | None = None  # event time: watermark state (Task.time_state), restored before replay
    # an asynchronous operator's in-flight documents, node id -> one per old subtask (runtime/execution/
    # async_checkpoint.py): replayed before the restored input channel state
    async_inflight: dict[int, list[dict[str, Any]]] | None = None


class CheckpointListener(Protocol):
    """What a task tells the checkpointing layer. The task calls these on its own turn (between
    records), except `on_barrier_queued`, which the input gate calls from a network callback."""

    def on_barrier(self, channel_id: int, body: dict[str, Any], *, priority: bool) -> None: ...

    def on_barrier_queued(self, channel_id: int, body: dict[str, Any]) -> None: ...

    def on_channel_ended(self, channel_id: int) -> None: ...

    def poll(self, now: float) -> None: ...

    def on_end_of_input(self) -> None: ...

    def final_committed(self) -> bool: ...

    def close(self) -> None: ...

    def statistics(self) -> CheckpointStatistics: ...


@dataclass(frozen=True)
class Credits:
    exclusive: int
    floating: int


class Task:
    """One subtask. Built complete by the worker's task factory; `checkpoints` makes its listener."""

    def __init__(self, *, key: TaskKey, chain: Chain, outputs: list[Subpartition], output_gate: OutputGate,
                 inputs: list[InputChannel], credits: Credits, source: Source | None, flush_timeout_s: float,
                 restore: RestoredState | None = None,
                 checkpoints: Callable[[Task], CheckpointListener] | None = None, isolation: str = "auto") -> None:
        self.key = key
        self.task_id = key.task_id
        self.name = key.display_name
        self.chain = chain
        self.subpartitions = outputs
        self.source = source
        self.flush_timeout_s = flush_timeout_s
        self.output = output_gate
        output_gate.bind(self.wake)
        self.gate: InputGate | None = (InputGate(self, inputs, exclusive=credits.exclusive, floating=credits.floating)
                                       if inputs else None)
        self.restore = restore
        self.mailbox: deque[Message] = deque()
        self._wakeup = asyncio.Event()
        self._readers: dict[int, ChannelReader] = {}
        # restored input channel state not processed yet: it precedes everything on its channel
        self._restored_readers: dict[int, ChannelReader] = {}
        self._probes: ProbeTracker | None = None
        self._overtaken_out = 0
        self._chunk = 1  # records per chain call; adapts, see the module docstring
        # called with (task, probe_id, overtaken output buffers, overtaken input buffers) when a probe completes
        self.on_probe_complete: Callable[[Task, int, int, int], None] = lambda *args: None
        # called once the task has processed all its input and sent "end" downstream
        self.on_end_of_input: Callable[[Task], None] = lambda task: None
        self.end_of_input = False
        self._batch_position: Any = None
        self._batch_emitted = 0
        self._skip_on_restore = 0
        self.records_in = 0  # records only: watermark and status markers are counted in watermarks_in
        self.watermarks_in = 0
        self.times = TimeAccounting()  # idle, backpressured and busy time, the wait in progress included
        self.state = TaskState.CREATED
        # event time (see runtime/execution/watermarks.py); restored from the checkpoint before any replay
        self.event_time = chain.event_time
        self._generator: WatermarkGenerator | None = None  # a source with watermarks
        self._combiner: WatermarkCombiner | None = None  # a task with inputs
        self._channel_keys = {cid: ch.key for cid, ch in self.gate.channels.items()} if self.gate else {}
        # the chain input each channel feeds: a two-input head takes its two inputs' channels on two paths
        self._batch_of = ({cid: chain.input_batch(ch.input_index) for cid, ch in self.gate.channels.items()}
                          if self.gate else {})
        self._forwarded = MIN_WATERMARK  # the last watermark sent downstream
        self._idle_forwarded = False  # the status last sent downstream
        self._processing_timers_posted = False
        if self.event_time:
            self._init_time(restore.time if restore is not None else None)
        # an asynchronous keyed operator: input waits for its admission, drain checkpoints for its quiet
        self._async_op = chain.async_operator
        if self._async_op is not None:
            self._async_op.bind(wake=self.wake, on_failure=self._async_failed)
        # blocking user code: the chain's calls on a thread of the task's own (runtime/execution/isolation.py)
        self.isolation = IsolationPolicy(
            isolation, declared_blocking=any(getattr(node.payload, "blocking", False) is True for node in chain.nodes),
            asynchronous=self._async_op is not None)
        self._thread: TaskThread | None = None
        self._deferred: list[tuple[Subpartition, Buffer]] = []  # buffers cut by the thread, queued on its return
        self._on_thread = False  # a call is on the thread: the loop must not touch the subpartitions' builders
        self._tick_due = False  # the periodic flush came during a call: it runs when the call returns
        self._processing_timers_due = False  # an isolated task's processing-time timers wait for its thread
        self.checkpoints: CheckpointListener | None = checkpoints(self) if checkpoints is not None else None

    # -- signals from outside (network callbacks, the worker) -----------------

    def wake(self) -> None:
        self._wakeup.set()

    def post(self, message: Message) -> None:
        self.mailbox.append(message)
        self._wakeup.set()

    def on_priority_event(self, channel_id: int, seq: int, ev: Event) -> None:
        """The gate's listener: a priority event goes ahead of queued input (the mailbox is served first)."""
        self.post(PriorityEvent(channel_id, seq, ev))

    def on_barrier_queued(self, channel_id: int, body: dict[str, Any]) -> None:
        """The gate's listener: an in-band barrier reached the gate (it may wait there behind data)."""
        if self.checkpoints is not None:
            self.checkpoints.on_barrier_queued(channel_id, body)

    def cancel(self) -> None:
        self.post(Cancel())

    # -- statistics -------------------------------------------------------------

    def statistics(self) -> TaskStatistics:
        now = time.monotonic()
        times = self.times.read(now)
        cp = self.checkpoints.statistics() if self.checkpoints is not None else CheckpointStatistics()
        return TaskStatistics(
            records_in=self.records_in,
            records_out=self.chain.records_out,
            busy_s=times.busy_s,
            idle_s=times.idle_s,
            backpressured_s=times.backpressured_s,
            watermarks_in=self.watermarks_in,
            measured_at=now,
            input_queue=self.gate.queued_buffers() if self.gate else 0,
            output_queue=sum(s.sender.queued_buffers for s in self.subpartitions),
            output_buffers_limit=sum(s.limit for s in self.subpartitions),
            # capped: a full channel may hold one buffer past its limit (the one that filled it)
            output_pool_usage=min(1.0, max((s.sender.queued_buffers / s.limit for s in self.subpartitions
                                            if s.limit), default=0.0)),
            bytes_in=self.gate.bytes_in if self.gate else 0,
            bytes_out=sum(s.bytes_out for s in self.subpartitions),
            last_alignment_s=cp.last_alignment_s,
            last_start_delay_s=cp.last_start_delay_s,
            last_inflight_bytes=cp.last_inflight_bytes,
            inflight_bytes_total=cp.inflight_bytes_total,
            current_watermark=self.current_watermark() if self.event_time else None,
            async_in_flight=self._async_op.in_flight if self._async_op is not None else None,
            async_blocked_s=self._async_op.blocked_s if self._async_op is not None else 0.0,
            async_captured_records=self._async_op.captured_records if self._async_op is not None else 0,
            channels_switched=cp.channels_switched,
            switches_refused=cp.switches_refused,
        )

    # -- the loop -----------------------------------------------------------------

    async def run(self) -> None:
        self.times.start(time.monotonic())
        self.state = TaskState.RUNNING
        flusher = asyncio.create_task(self._flush_periodically())
        try:
            self._restore_operator_state()
            self.chain.open()
            await self.chain.open_async()
            self._restore_outputs()
            finished_before = self.restore is not None and self.restore.finished
            ended_before = finished_before or (self.restore is not None and self.restore.ended)
            if self.source is not None:
                if not ended_before:  # a source at its end must not emit again
                    await self._run_source()
            else:
                if self.event_time and not ended_before:
                    await self._resume_watermark()  # a timer burst the checkpoint was taken in the middle of
                await self._restore_inputs()
                await self._run_inputs()  # when it had ended, so had its upstream: only "end" arrives
            if not ended_before:  # operators that emit at the end (aggregates) must not emit twice
                await self._finish_async()
                await self._call(self.chain.finish)
            for sub in self.subpartitions:
                sub.add_event(event("end"))
            # From here on a checkpoint records this task as at its end: no barrier follows "end" downstream.
            self.end_of_input = True
            if self.checkpoints is not None:
                self.checkpoints.on_end_of_input()
            self.on_end_of_input(self)
            await self._wait_drained()
            if self.checkpoints is not None and not finished_before:
                await self._wait_final_checkpoint()
            self.state = TaskState.FINISHED
        except (TaskCancelled, asyncio.CancelledError):
            self.state = TaskState.CANCELLED
            raise
        except BaseException:
            self.state = TaskState.FAILED
            raise
        finally:
            self.times.finish(time.monotonic())
            flusher.cancel()
            # a cancelled task's call may still run on its thread: closing must wait for it
            if self._thread is not None and not await self._thread.stop():
                log.warning("task %s: its thread is still in a call after it stopped", self.task_id)
            if self.checkpoints is not None:
                self.checkpoints.close()
            if self._async_op is not None:
                try:
                    await self.chain.aclose_async()
                except Exception as exc:
                    log.warning("task %s: error while stopping asynchronous state: %s", self.task_id, exc)
            try:
                self.chain.close()
            except Exception as exc:  # closing must not hide the task's own outcome
                log.warning("task %s: error while closing: %s", self.task_id, exc)
            if self.source is not None:
                try:
                    self.source.close()  # a source may hold a connection and a thread
                except Exception as exc:
                    log.warning("task %s: error while closing its source: %s", self.task_id, exc)

    async def _flush_periodically(self) -> None:
        # bounds latency: a partly filled buffer waits at most flush_timeout_s
        while True:
            await asyncio.sleep(self.flush_timeout_s)
            if self._on_thread:
                self._tick_due = True  # the thread writes the builders now: the tick runs when its call returns
            else:
                self._tick()

    def _tick(self) -> None:
        """The periodic work on the task's outputs and timers (never while a call is on the task's thread)."""
        for sub in self.subpartitions:
            if sub.buf:
                sub.flush()
        if self.checkpoints is not None:
            self.checkpoints.poll(time.time())
        timers = self.chain.timers
        if (timers is not None and not self._processing_timers_posted
                and timers.processing_due(current_time_ms())):
            self._processing_timers_posted = True
            self.post(Mail(self._fire_processing_timers, "processing-time timers"))

    # -- isolation (runtime/execution/isolation.py) -------------------------------------

    async def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """`fn(*args)`: on the task's thread when the task is isolated, else here."""
        if self.isolation.isolated:
            return await self._offload(fn, *args)
        return fn(*args)

    async def _offload(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run `fn(*args)` (chain work) on the task's thread and wait for it. The buffers it cuts are queued for
        sending when it returns, in order, before anything else of the task runs."""
        thread = self._thread
        if thread is None:
            thread = self._thread = TaskThread(f"sluice-task {self.task_id}")
        deferred = self._deferred
        subs = self.subpartitions
        for sub in subs:
            sub.deferred = deferred
        self._on_thread = True
        try:
            result = await thread.call(fn, *args)
        except asyncio.CancelledError:
            raise  # the call may still be running: everything stays deferred, run() waits for the thread
        except BaseException:
            self._end_offload()
            raise
        self._end_offload()
        return result

    def _end_offload(self) -> None:
        for sub in self.subpartitions:
            sub.deferred = None
        self._on_thread = False
        deferred = self._deferred
        if deferred:
            for sub, buffer in deferred:
                sub.hand_over(buffer)
            deferred.clear()
        if self._tick_due:
            self._tick_due = False
            self._tick()

    async def _wait(self, timeout_s: float | None = None) -> None:
        self._wakeup.clear()
        if timeout_s is None:
            await self._wakeup.wait()
        else:
            # not asyncio.wait_for: before Python 3.12 it swallows a cancel that comes in the same turn as the
            # wake-up, and a cancelled task waiting for its outputs to drain then ran on (every stop took 10 s)
            try:
                async with asyncio.timeout(timeout_s):
                    await self._wakeup.wait()
            except TimeoutError:
                pass

    async def _wait_as(self, kind: str, timeout_s: float | None = None) -> None:
        """`_wait`, counted as `kind` (idle or backpressured) while it lasts (runtime/execution/time_accounting.py)."""
        times = self.times
        times.begin_wait(kind, time.monotonic())
        try:
            await self._wait(timeout_s)
        finally:
            times.end_wait(time.monotonic())

    async def _serve_mail(self) -> None:
        """Serve the mailbox; with a drain-mode asynchronous operator, first wait until nothing is in flight
        when a message may take a snapshot (a barrier, a checkpoint trigger or deadline): Flink's drain."""
        op = self._async_op
        if op is not None and op.drain and not op.quiet() and any(_may_snapshot(m) for m in self.mailbox):
            await self._quiesce()
        self._serve_mailbox()
        await self._timers_on_thread()

    async def _quiesce(self) -> None:
        """Wait until the asynchronous operator has nothing queued or in flight (drain checkpoints). The
        mailbox waits meanwhile: a snapshot must not run before this ends."""
        op = self._async_op
        assert op is not None
        while not op.quiet():
            op.raise_if_failed()
            await self._wait()
        op.raise_if_failed()

    async def _finish_async(self) -> None:
        """End of input: let the asynchronous operator admit what is queued, then wait for its records."""
        op = self._async_op
        if op is None:
            return
        while op.backlog:
            await self._await_admission()
        await self.chain.finish_async()

    async def _await_admission(self) -> None:
        op = self._async_op
        assert op is not None
        if self.mailbox:
            await self._serve_mail()
        if op.backlog:
            op.raise_if_failed()
            t0 = time.monotonic()
            await self._wait()
            op.blocked_s += time.monotonic() - t0

    def _async_failed(self, error: BaseException) -> None:
        def fail() -> None:
            raise error

        self.post(Mail(fail, "asynchronous state failed"))

    def _serve_mailbox(self) -> None:
        while self.mailbox:
            message = self.mailbox.popleft()
            if isinstance(message, Mail):
                message.run()
            elif isinstance(message, PriorityEvent):
                self._on_priority_event(message.channel_id, message.seq, message.event)
            elif isinstance(message, InjectProbe):
                overtaken = self._forward_priority(event("probe", id=message.probe_id))
                self.on_probe_complete(self, message.probe_id, overtaken, 0)
            elif isinstance(message, Cancel):
                raise TaskCancelled(self.task_id)

    def _forward_priority(self, ev: Event) -> int:
        """Send `ev` ahead of all queued data on every output; returns how many buffers it overtook."""
        return sum(len(sub.add_event(ev, priority=True)) for sub in self.subpartitions)

    # -- what a snapshot reads ------------------------------------------------------------

    def snapshot_operator_state(self, checkpoint_id: int) -> tuple[dict[int, dict[str, dict[Any, Any]]], list[Any]]:
        """The synchronous part of a snapshot: copies of the keyed state tables (values are immutable by
        contract), and the sinks' pre-committed state for `checkpoint_id`. On a state backend only the tables
        kept in memory (timers) are copied: the backend snapshots the rest (Chain.begin_state_snapshot)."""
        keyed = {node: {name: table.copy() for name, table in tables.items() if isinstance(table, dict)}
                 for node, tables in self.chain.keyed_state.items()}
        return keyed, self.chain.snapshot_sinks(checkpoint_id)

    def source_position(self) -> Any:
        """Where a restored source resumes: the position before the current batch, and how much of it was emitted."""
        return [self._batch_position, self._batch_emitted] if self.source is not None else None

    def unprocessed_bytes(self) -> dict[int, bytes]:
        """Per input channel, the bytes fed to its unpacker and not yet processed (they start at a record),
        after what is left of that channel's restored state, which precedes them."""
        out = {}
        for cid in {*self._restored_readers, *self._readers}:
            restored, live = self._restored_readers.get(cid), self._readers.get(cid)
            pending = (restored.unconsumed() if restored else b"") + (live.unconsumed() if live else b"")
            if pending:
                out[cid] = pending
        return out

    # -- restore ----------------------------------------------------------------------

    def _restore_operator_state(self) -> None:
        restore = self.restore
        if restore is None:
            return
        self.chain.restore_state(restore.keyed or {}, restore.sinks)
        self.chain.restore_lists(restore.lists or {})
        self.chain.restore_async(restore.async_inflight)  # its replay input goes first, before channel state
        if self.source is not None and restore.source:
            position, emitted = restore.source
            self._batch_position = position
            self._skip_on_restore = int(emitted)

    def _restore_outputs(self) -> None:
        """Re-send restored output channel state before any new output."""
        if self.restore is None or not self.restore.outputs:
            return
        for sub in self.subpartitions:
            stream = self.restore.outputs.get(sub.key)
            if stream:
                sub.append_records(stream)
                sub.flush()

    async def _restore_inputs(self) -> None:
        """Process restored input channel state before anything new arrives on those channels.

        An unaligned snapshot taken meanwhile (its barrier is served between records) must store what is
        left of it as the start of each channel's state, so the readers stay visible to unprocessed_bytes().
        """
        if self.restore is None or not self.restore.inputs:
            return
        for cid, stream in self.restore.inputs.items():
            reader = self._restored_readers[cid] = ChannelReader()
            reader.feed(stream)
        self.restore.inputs = None
        for cid, reader in list(self._restored_readers.items()):
            await self._process_records(reader, cid)
            del self._restored_readers[cid]

    # -- sources ----------------------------------------------------------------------

    async def _between_records(self) -> None:
        """Serve the mailbox; wait while an asynchronous operator has input it has not admitted, and while the
        output is blocked (counted as backpressure)."""
        op = self._async_op
        while True:
            if self.mailbox:
                await self._serve_mail()
            if op is not None and op.backlog:
                await self._await_admission()
                continue
            if not self.output.blocked:
                return
            await self._wait_as(BACKPRESSURED_TIME)

    async def _run_source(self) -> None:
        source = self.source
        assert source is not None
        source.open(self.chain.subtask_index, self.chain.parallelism)
        if self._batch_position is not None:
            source.restore(self._batch_position)
            skip = self._skip_on_restore
            while skip > 0:
                skipped = source.read_batch(skip)
                if skipped is None:
                    break
                if not skipped:  # not ready yet (a source that prefetches): these records must still be skipped
                    await self._wait(source.idle_wait_s())
                    continue
                skip -= len(skipped)
        emit = self._emit_timed if self.event_time else self.chain.process_batch
        output = self.output
        mailbox = self.mailbox
        monotonic = time.monotonic
        chunk = self._chunk
        last_yield = monotonic()
        idle_since: float | None = None
        op = self._async_op  # an async_map chained to the source: its admission queue holds input back too
        isolation = self.isolation
        isolated = isolation.isolated
        while True:
            self._batch_position = source.position()
            self._batch_emitted = 0
            if mailbox or output.blocked or (op is not None and op.backlog):
                await self._between_records()
                self._batch_position = source.position()
            batch = source.read_batch(SOURCE_BATCH)
            if batch is None:
                if self.event_time:
                    self._end_event_time()
                return
            if not batch:
                if self._generator is not None:
                    idle_since = self._check_source_idle(idle_since, monotonic())
                await self._wait_as(IDLE_TIME, source.idle_wait_s())
                continue
            idle_since = None
            if self._generator is not None and self._generator.idle:
                self._generator.idle = False
                self.chain.forward_status(ACTIVE)
            i, n = 0, len(batch)
            while i < n:
                if output.blocked or mailbox or (op is not None and op.backlog):
                    self._batch_emitted = i  # a checkpoint taken now resumes at record i of this batch
                    await self._between_records()
                j = i + chunk
                t0 = monotonic()
                if isolated:
                    await self._offload(emit, batch[i:j] if i or j < n else batch)
                else:
                    emit(batch[i:j] if i or j < n else batch)
                now = monotonic()
                if chunk == 1 or isolated:
                    isolated = isolation.observe(min(j, n) - i, now - t0, now)
                chunk = _next_chunk(chunk, now - t0)
                # counted as emitted, not at the batch's end: a throttled source may take seconds over a batch
                self.records_in += min(j, n) - i
                i = j
            now = monotonic()
            if now - last_yield > YIELD_AFTER_S:
                self._batch_position = source.position()
                self._batch_emitted = 0
                self._chunk = chunk
                await asyncio.sleep(0)  # let the network and other tasks on this worker run
                last_yield = monotonic()

    # -- tasks with inputs --------------------------------------------------------------

    async def _run_inputs(self) -> None:
        gate = self.gate
        assert gate is not None
        gate.announce_credit()
        op = self._async_op
        while gate.open_channels:
            if self.mailbox:
                await self._serve_mail()
            taken = gate.poll()
            if taken is None:
                await self._wait_as(IDLE_TIME)
                continue
            channel_id, item = taken
            if isinstance(item, Buffer):
                await self._process_buffer(channel_id, item)
                gate.consumed(channel_id)
                await asyncio.sleep(0)  # fairness between tasks of this worker
            else:
                if op is not None and op.drain and item.body.get("t") in ("barrier", "end"):
                    # drain: the records before an aligned barrier finish first; so do those before a
                    # channel's end, which completes an alignment waiting only for that channel
                    await self._quiesce()
                self._on_inband_event(channel_id, item)

    async def _process_buffer(self, channel_id: int, buffer: Buffer) -> None:
        reader = self._readers.get(channel_id)
        if reader is None:
            reader = self._readers[channel_id] = ChannelReader()
        reader.feed(buffer.data)
        await self._process_records(reader, channel_id)
        reader.trim()

    async def _process_records(self, reader: ChannelReader, channel_id: int) -> None:
        if self.event_time:
            await self._process_timed(reader, channel_id)
            return
        take = reader.take
        process = self._batch_of.get(channel_id, self.chain.process_batch)
        output = self.output
        mailbox = self.mailbox
        op = self._async_op
        monotonic = time.monotonic
        isolation = self.isolation
        isolated = isolation.isolated
        offload = self._offload
        chunk = self._chunk
        n = 0
        # Yield to the event loop about every YIELD_AFTER_S of work, so network callbacks (credit, priority
        # events) get in even while records are slow.
        last_yield = monotonic()
        while True:
            records = take(chunk)
            if not records:
                break
            if output.blocked or mailbox or (op is not None and op.backlog):
                # reader.consumed is still the position before `records`: a snapshot taken now keeps them
                self._chunk = chunk
                await self._between_records()
            t0 = monotonic()
            if isolated:
                await offload(process, records)
            else:
                process(records)
            now = monotonic()
            reader.consumed = reader.fetched
            n += len(records)
            if chunk == 1 or isolated:  # only one-record calls can make an inline task isolated
                isolated = isolation.observe(len(records), now - t0, now)
            chunk = _next_chunk(chunk, now - t0)
            if now - last_yield > YIELD_AFTER_S:
                self.records_in += n
                n = 0
                self._chunk = chunk
                await asyncio.sleep(0)
                last_yield = monotonic()
        self._chunk = chunk
        self.records_in += n

    def _on_inband_event(self, channel_id: int, ev: Event) -> None:
        kind = ev.body.get("t")
        gate = self.gate
        assert gate is not None
        if kind == "end":
            gate.end_channel(channel_id)
            if self.checkpoints is not None:
                self.checkpoints.on_channel_ended(channel_id)
        elif kind == "barrier":
            if self.checkpoints is not None:
                self.checkpoints.on_barrier(channel_id, ev.body, priority=False)
        else:
            log.warning("task %s: unknown in-band event %r on channel %d", self.task_id, kind, channel_id)

    def _on_priority_event(self, channel_id: int, seq: int, ev: Event) -> None:
        kind = ev.body.get("t")
        if kind == "barrier":
            if self.checkpoints is not None:
                self.checkpoints.on_barrier(channel_id, ev.body, priority=True)
            return
        if kind != "probe":
            log.warning("task %s: unknown priority event %r on channel %d", self.task_id, kind, channel_id)
            return
        gate = self.gate
        assert gate is not None
        if self._probes is None:
            self._probes = ProbeTracker(list(gate.channels))
        probe_id = int(ev.body["id"])
        queued = sum(1 for _, item in gate.queues[channel_id] if isinstance(item, Buffer))
        step = self._probes.on_probe(probe_id, channel_id, queued)
        if step.forward:
            self._overtaken_out = self._forward_priority(ev)
        if step.complete:
            progress = self._probes.finish(probe_id)
            self.on_probe_complete(self, probe_id, self._overtaken_out, progress.overtaken_input_buffers)

    # -- event time ---------------------------------------------------------------------

    def _init_time(self, state: dict[str, Any] | None) -> None:
        state = state or {}
        if self.source is not None:
            strategy = self.chain.watermarks
            if strategy is not None:
                own = getattr(self.source, "watermark_generator", None)  # a source that combines its own (Kafka)
                self._generator = (own(strategy, state.get("generator")) if own is not None
                                   else WatermarkGenerator(strategy, state.get("generator")))
                self._timestamp_of = strategy.timestamp
                self._idle_timeout_s = (strategy.idle_timeout_ms / 1000
                                        if strategy.idle_timeout_ms is not None else None)
                self._forwarded = self._generator.last_emitted
                self._idle_forwarded = self._generator.idle
            else:
                self._forwarded = int(state.get("forwarded", MIN_WATERMARK))
        else:
            self._combiner = WatermarkCombiner(sorted(self._channel_keys.values()), state.get("combiner"))
            self._forwarded = int(state.get("forwarded", MIN_WATERMARK))
            self._idle_forwarded = bool(state.get("idle_forwarded", False))
            self.chain.restore_watermarks(self._combiner.current, self._forwarded)

    def current_watermark(self) -> int:
        """The task's watermark: its input's (combined over channels), or at a source the last one emitted."""
        return self._combiner.current if self._combiner is not None else self._forwarded

    def time_state(self) -> dict[str, Any] | None:
        """What a snapshot stores of event time (None without it); restored before in-flight data is replayed."""
        if not self.event_time:
            return None
        if self._generator is not None:
            return {"generator": self._generator.snapshot()}
        out: dict[str, Any] = {"forwarded": self._forwarded, "idle_forwarded": self._idle_forwarded}
        if self._combiner is not None:
            out["combiner"] = self._combiner.snapshot()
        return out

    def _emit_timed(self, records: list[Any]) -> None:
        """A source's records as (timestamp, record) pairs through the chain, each followed by the watermark
        it advances (in-band, in order)."""
        process = self.chain.process_batch
        generator = self._generator
        if generator is None:
            process([(None, r) for r in records])
            return
        timestamp_of = self._timestamp_of
        on_timestamp = generator.on_timestamp
        out: list[Any] = []
        add = out.append
        for record in records:
            ts = timestamp_of(record)
            add((ts, record))
            w = on_timestamp(ts)
            if w is not None:
                process(out)
                out = []
                add = out.append
                self.chain.forward_watermark(w)
                self._forwarded = w
        if out:
            process(out)

    def _check_source_idle(self, idle_since: float | None, now: float) -> float:
        generator = self._generator
        assert generator is not None
        if idle_since is None:
            return now
        if (self._idle_timeout_s is not None and not generator.idle
                and now - idle_since >= self._idle_timeout_s):
            generator.idle = True
            self.chain.forward_status(IDLE)
            for sub in self.subpartitions:
                sub.flush()
        return idle_since

    def _end_event_time(self) -> None:
        """End of a bounded input: MAX_WATERMARK, so every event-time timer downstream fires before the end."""
        if self._generator is not None:
            if self._generator.idle:  # an idle channel's watermarks are ignored downstream
                self._generator.idle = False
                self.chain.forward_status(ACTIVE)
            self._generator.last_emitted = MAX_WATERMARK
        if self._forwarded < MAX_WATERMARK:
            self.chain.forward_watermark(MAX_WATERMARK)
            self._forwarded = MAX_WATERMARK

    async def _process_timed(self, reader: ChannelReader, channel_id: int) -> None:
        """`_process_records` for (timestamp, record) pairs with watermark and status markers between them.

        Markers are handled where they are, between the records before and after them. When a watermark makes
        more timers due than one chunk, the rest fire with the mailbox served in between (`_run_timer_burst`);
        the reader's position is then set exactly after the marker, so a snapshot taken during the burst keeps
        the records after it as channel state, and the unfired timers are in the keyed state.
        """
        take = reader.take
        process = self._batch_of.get(channel_id, self.chain.process_batch)
        output = self.output
        mailbox = self.mailbox
        monotonic = time.monotonic
        key = self._channel_keys.get(channel_id, "")
        op = self._async_op
        isolation = self.isolation
        isolated = isolation.isolated
        timed_chunk = self._timed_chunk
        chunk = self._chunk
        leftover: list[Any] = []
        last_yield = monotonic()
        while True:
            items = leftover or take(chunk)
            if not items:
                break
            if not leftover and (output.blocked or mailbox or (op is not None and op.backlog)):
                self._chunk = chunk
                await self._between_records()
            leftover = []
            t0 = monotonic()
            if isolated:
                start, markers, burst = await self._offload(timed_chunk, items, process, key, reader)
            else:
                start, markers, burst = timed_chunk(items, process, key, reader)
            if burst:
                leftover = items[start:]
                self.records_in += start - markers
                self.watermarks_in += markers
                await self._run_timer_burst()
                continue
            reader.consumed = reader.fetched
            self.records_in += len(items) - markers
            self.watermarks_in += markers
            now = monotonic()
            if chunk == 1 or isolated:
                isolated = isolation.observe(len(items), now - t0, now)
            chunk = _next_chunk(chunk, now - t0)
            if now - last_yield > YIELD_AFTER_S:
                self._chunk = chunk
                await asyncio.sleep(0)
                last_yield = monotonic()
        self._chunk = chunk

    def _timed_chunk(self, items: list[Any], process: Callable[[list[Any]], None], key: str,
                     reader: ChannelReader) -> tuple[int, int, bool]:
        """One chunk of `_process_timed` (inline or on the task's thread): the records through the chain, the
        markers to the combiner, in order. Returns (items handled, markers among them, a timer burst is left
        to run); at a burst it stops after the marker and sets the reader's position there.

        Only a marker that moves the combined watermark or status cuts the batch: one that does not (most of
        them, one input channel ahead of another) changes nothing the operators can see, so the records on
        both sides of it go through the chain as one batch (per-batch costs are paid per cut)."""
        combiner = self._combiner
        assert combiner is not None
        on_marker = combiner.on_marker
        start = 0
        markers = 0
        held: list[Any] | None = None  # records before markers that moved nothing, not yet processed
        for k, item in enumerate(items):
            if item.__class__ is tuple:
                continue
            markers += 1
            if on_marker(key, item) is NOTHING:
                if k > start:
                    if held is None:
                        held = items[start:k]
                    else:
                        held += items[start:k]
                start = k + 1
                continue
            if held is not None:
                held += items[start:k]
                process(held)
                held = None
            elif k > start:
                process(items[start:k])
            start = k + 1
            if self._advance():
                reader.consumed = _position_after(reader, k + 1)
                return start, markers, True
        if held is not None:
            held += items[start:]
            process(held)
        elif start < len(items):
            process(items[start:] if start else items)
        return len(items), markers, False

    def _advance(self) -> bool:
        """Bring the output up to the combined watermark: fire due timers (one chunk), then forward it and the
        status. True when more timers are due: the caller runs them as a burst, then calls this again."""
        combiner = self._combiner
        assert combiner is not None
        watermark = combiner.current
        if watermark > self._forwarded:
            timers = self.chain.timers
            if timers is not None:
                timers.set_watermark(watermark)
                if timers.fire_event(watermark, TIMER_CHUNK):
                    return True
            self.chain.forward_watermark(watermark)
            self._forwarded = watermark
        if combiner.idle != self._idle_forwarded:
            self.chain.forward_status(IDLE if combiner.idle else ACTIVE)
            self._idle_forwarded = combiner.idle
        return False

    async def _run_timer_burst(self) -> None:
        """Fire the due event-time timers a chunk at a time, serving the mailbox (barriers, RPC mail) and
        waiting for output in between; then forward the watermark."""
        timers = self.chain.timers
        combiner = self._combiner
        assert timers is not None and combiner is not None
        monotonic = time.monotonic
        last_yield = monotonic()
        while True:
            if monotonic() - last_yield > YIELD_AFTER_S:
                await asyncio.sleep(0)  # let the network in: a barrier reaches the mailbox from a callback
                last_yield = monotonic()
            await self._between_records()
            if not await self._call(timers.fire_event, combiner.current, TIMER_CHUNK):
                break
        await self._call(self._advance)

    async def _resume_watermark(self) -> None:
        """After a restore: finish what the checkpoint caught half done (a burst, an unsent watermark)."""
        if self._combiner is not None and self._advance():
            await self._run_timer_burst()

    def _fire_processing_timers(self) -> None:
        """Mail: fire due processing-time timers, a chunk per turn of the mailbox (an isolated task: on its
        thread, right after this turn of the mailbox, see `_timers_on_thread`)."""
        if self.isolation.isolated:
            self._processing_timers_due = True
            return
        timers = self.chain.timers
        assert timers is not None
        self._after_processing_timers(timers.fire_processing(current_time_ms(), TIMER_CHUNK))

    def _after_processing_timers(self, more: bool) -> None:
        if more:
            self.post(Mail(self._fire_processing_timers, "processing-time timers"))
        else:
            self._processing_timers_posted = False

    async def _timers_on_thread(self) -> None:
        """After a turn of the mailbox: the processing-time timers its mail found due, on the task's thread."""
        if self._processing_timers_due:
            self._processing_timers_due = False
            timers = self.chain.timers
            assert timers is not None
            self._after_processing_timers(
                await self._offload(timers.fire_processing, current_time_ms(), TIMER_CHUNK))

    async def _wait_final_checkpoint(self) -> None:
        """Stay (serving the mailbox) until a checkpoint taken after the end of input has completed and the
        sinks have published it: what the task did last is then in a completed checkpoint, so a failure from
        now on restores it as finished instead of running it again (exactly once at the end of a bounded job)."""
        assert self.checkpoints is not None
        while not self.checkpoints.final_committed():
            if self.mailbox:
                self._serve_mailbox()
                await self._timers_on_thread()
                continue
            await self._wait_as(IDLE_TIME)

    async def _wait_drained(self, timeout_s: float = 600.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not all(s.drained() for s in self.subpartitions):
            if time.monotonic() > deadline:
                raise TimeoutError(f"task {self.task_id}: outputs not drained within {timeout_s}s")
            if self.mailbox:
                self._serve_mailbox()
                await self._timers_on_thread()
            await self._wait(0.05)


def _may_snapshot(message: Message) -> bool:
    """Whether serving `message` may take a checkpoint's snapshot (see Task._serve_mail)."""
    if isinstance(message, PriorityEvent):
        return message.event.body.get("t") == "barrier"
    return isinstance(message, Mail) and message.may_snapshot


def _position_after(reader: ChannelReader, n: int) -> int:
    """The stream position after the first `n` records from `reader.consumed` (they were taken already)."""
    scan = msgpack.Unpacker(raw=False, strict_map_key=False)
    scan.feed(reader.unconsumed())
    for _ in range(n):
        scan.skip()
    return reader.consumed + scan.tell()
