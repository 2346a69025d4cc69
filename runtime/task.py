"""A running subtask: its input gate, operator chain, outputs and mailbox.

The hot loop takes one input buffer at a time, decodes it with the input
channel's msgpack Unpacker (which also joins records that span buffers) and
calls the chain once per record, with no await per record. Before each
record it checks two things: is the output blocked (a subpartition queue at
its limit) and is there mail (barriers, checkpoint triggers and
notifications, probes, cancellation). Only then does it await, so a
backpressured task still answers its mailbox within one record's time, and
never starts a record it has no output buffer for (a started record may
overdraw its buffer; the queue limit is soft by one).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from netstack.credit import Buffer, Event
from runtime.barriers import Abandon, Action, BarrierHandler, BarrierSpec, Block, InputsComplete, Snapshot, UnblockAll
from runtime.channels import ChannelReader, InputGate, OutputGate, Subpartition, event
from runtime.connectors.source import Source
from runtime.operators import Chain
from runtime.probes import ProbeTracker
from runtime.task_checkpoint import TaskCheckpointer

log = logging.getLogger("sluice.task")

YIELD_AFTER_S = 0.002
SOURCE_BATCH = 512


class TaskCancelled(Exception):
    pass


@dataclass
class TaskStatistics:
    records_in: int
    records_out: int
    busy_s: float
    idle_s: float
    backpressured_s: float
    input_queue: int
    output_queue: int
    output_buffers_limit: int
    bytes_in: int
    bytes_out: int
    last_alignment_s: float
    last_start_delay_s: float
    last_inflight_bytes: int
    inflight_bytes_total: int


@dataclass
class RestoredState:
    """What a task restores before it processes anything new."""

    operator: dict[str, Any] | None = None
    inputs: dict[int, bytes] | None = None  # channel id -> whole records
    outputs: dict[str, bytes] | None = None  # subpartition key -> whole records


class Task:
    def __init__(self, *, task_id: str, name: str, chain: Chain, outputs: list[Subpartition],
                 source: Source | None, flush_timeout_s: float) -> None:
        self.task_id = task_id
        self.name = name
        self.chain = chain
        self.subpartitions = outputs
        self.source = source
        self.gate: InputGate | None = None
        self.flush_timeout_s = flush_timeout_s
        self.output = OutputGate(self.wake)
        self.mailbox: deque[tuple[str, Any]] = deque()
        self._wakeup = asyncio.Event()
        self._readers: dict[int, ChannelReader] = {}
        # restored input channel state not processed yet: it precedes everything on its channel
        self._restored_readers: dict[int, ChannelReader] = {}
        self._probes: ProbeTracker | None = None
        self._overtaken_out = 0
        self._stride = 64
        # called with (task, probe_id, overtaken output buffers, overtaken input buffers) when a probe completes
        self.on_probe_complete: Callable[[Task, int, int, int], None] = lambda *args: None
        self.barriers: BarrierHandler | None = None
        self.checkpointer: TaskCheckpointer | None = None
        self.first_barrier_monotonic: float | None = None
        self.first_barrier_wall: float | None = None
        self.restore: RestoredState | None = None
        self._batch_position: Any = None
        self._batch_emitted = 0
        self._skip_on_restore = 0
        self.records_in = 0
        self.idle_s = 0.0
        self.backpressured_s = 0.0
        self.started_at: float | None = None
        self.finished_at: float | None = None
        self.state = "created"
        self._cancelled = False
        self._deadline_timer: asyncio.TimerHandle | None = None
        self._deadline_spec: BarrierSpec | None = None

    # -- signals from outside (network callbacks, the worker) -----------------

    def wake(self) -> None:
        self._wakeup.set()

    def post(self, kind: str, payload: Any = None) -> None:
        self.mailbox.append((kind, payload))
        self._wakeup.set()

    def post_priority(self, channel_id: int, seq: int, ev: Event) -> None:
        # ahead of queued input: the mailbox is served before the next record
        self.post("priority_event", (channel_id, seq, ev))

    def cancel(self) -> None:
        self._cancelled = True
        self.post("cancel")

    # -- statistics -------------------------------------------------------------

    def statistics(self) -> TaskStatistics:
        now = time.monotonic()
        start = self.started_at or now
        end = self.finished_at or now
        busy = max(0.0, (end - start) - self.idle_s - self.backpressured_s)
        cp = self.checkpointer
        return TaskStatistics(
            records_in=self.records_in,
            records_out=self.chain.records_out,
            busy_s=busy,
            idle_s=self.idle_s,
            backpressured_s=self.backpressured_s,
            input_queue=self.gate.queued_buffers() if self.gate else 0,
            output_queue=sum(s.sender.queued_buffers for s in self.subpartitions),
            output_buffers_limit=sum(s.limit for s in self.subpartitions),
            bytes_in=self.gate.bytes_in if self.gate else 0,
            bytes_out=sum(s.bytes_out for s in self.subpartitions),
            last_alignment_s=cp.last_alignment_s if cp else 0.0,
            last_start_delay_s=cp.last_start_delay_s if cp else 0.0,
            last_inflight_bytes=cp.last_inflight_bytes if cp else 0,
            inflight_bytes_total=cp.inflight_bytes_total if cp else 0,
        )

    # -- the loop -----------------------------------------------------------------

    async def run(self) -> None:
        self.started_at = time.monotonic()
        self.state = "running"
        flusher = asyncio.create_task(self._flush_periodically())
        try:
            self._restore_operator_state()
            self.chain.open()
            self._restore_outputs()
            if self.source is not None:
                await self._run_source()
            else:
                await self._restore_inputs()
                await self._run_inputs()
            self.chain.finish()
            for sub in self.subpartitions:
                sub.add_event(event("end"))
            await self._wait_drained()
            self.state = "finished"
        except (TaskCancelled, asyncio.CancelledError):
            self.state = "cancelled"
            raise
        except BaseException:
            self.state = "failed"
            raise
        finally:
            self.finished_at = time.monotonic()
            flusher.cancel()
            if self._deadline_timer is not None:
                self._deadline_timer.cancel()
            try:
                self.chain.close()
            except Exception as exc:  # closing must not hide the task's own outcome
                log.warning("task %s: error while closing: %s", self.task_id, exc)

    async def _flush_periodically(self) -> None:
        # bounds latency: a partly filled buffer waits at most flush_timeout_s
        while True:
            await asyncio.sleep(self.flush_timeout_s)
            for sub in self.subpartitions:
                if sub.buf:
                    sub.flush()
            if self.checkpointer is not None and self.checkpointer.waiting_outputs():
                self.checkpointer.poll_outputs(time.time())

    async def _wait(self, timeout_s: float | None = None) -> None:
        self._wakeup.clear()
        if timeout_s is None:
            await self._wakeup.wait()
        else:
            try:
                await asyncio.wait_for(self._wakeup.wait(), timeout_s)
            except TimeoutError:
                pass

    def _serve_mailbox(self) -> None:
        while self.mailbox:
            kind, payload = self.mailbox.popleft()
            if kind == "cancel":
                raise TaskCancelled(self.task_id)
            if kind == "priority_event":
                channel_id, seq, ev = payload
                self._on_priority_event(channel_id, seq, ev)
            elif kind == "trigger":
                self._trigger(payload)
            elif kind == "deadline":
                self._on_deadline()
            elif kind == "barrier_arrived":
                if self.barriers is not None and self.checkpointer is not None:
                    self._carry_out(self.barriers.on_arrival(*payload))
            elif kind == "checkpoint_complete":
                self.chain.commit_sinks(payload)
            elif kind == "checkpoint_aborted":
                self._on_checkpoint_aborted(payload)
            elif kind == "inject_probe":
                overtaken = self._forward_priority(event("probe", id=payload))
                self.on_probe_complete(self, payload, overtaken, 0)

    def _forward_priority(self, ev: Event) -> int:
        """Send `ev` ahead of all queued data on every output; returns how many buffers it overtook."""
        return sum(len(sub.add_event(ev, priority=True)) for sub in self.subpartitions)

    # -- checkpoints ------------------------------------------------------------------

    def _trigger(self, spec: BarrierSpec) -> None:
        """A source starts checkpoint `spec` (the coordinator's trigger)."""
        if self.checkpointer is None:
            return
        self.first_barrier_monotonic, self.first_barrier_wall = time.monotonic(), time.time()
        self.checkpointer.snapshot(spec, unaligned=spec.mode == "unaligned")
        self._arm_deadline(spec)

    def _on_barrier(self, channel_id: int, spec: BarrierSpec, *, priority: bool) -> None:
        if self.barriers is None or self.checkpointer is None:
            return
        if self.barriers.pending is None:
            self.first_barrier_monotonic, self.first_barrier_wall = time.monotonic(), time.time()
        self._carry_out(self.barriers.on_barrier(channel_id, spec, priority=priority, now=time.time()))
        self._arm_deadline(spec)

    def _carry_out(self, actions: list[Action]) -> None:
        gate = self.gate
        checkpointer = self.checkpointer
        assert checkpointer is not None
        for action in actions:
            if isinstance(action, Block):
                assert gate is not None
                gate.block(action.channel_id)
            elif isinstance(action, UnblockAll):
                if gate is not None:
                    gate.unblock_all()
            elif isinstance(action, Snapshot):
                checkpointer.snapshot(action.spec, unaligned=action.unaligned)
            elif isinstance(action, InputsComplete):
                checkpointer.inputs_complete(action.spec, unaligned=action.unaligned)
            elif isinstance(action, Abandon):
                checkpointer.abandon(action.checkpoint_id, "a newer checkpoint overtook it")

    def on_inband_barrier_arrival(self, channel_id: int, body: dict[str, Any]) -> None:
        """An aligned barrier reached the input gate (it may wait there behind data): start its clock, and let
        the barrier handler know, so that it counts once the checkpoint switches to unaligned."""
        if body.get("mode") == "aligned_timeout":
            spec = BarrierSpec.from_body(body)
            if self._deadline_spec is None or spec.checkpoint_id > self._deadline_spec.checkpoint_id:
                self._arm_deadline(spec)
            self.post("barrier_arrived", (channel_id, spec))

    def _arm_deadline(self, spec: BarrierSpec) -> None:
        if spec.mode != "aligned_timeout" or spec.deadline is None:
            return
        if self._deadline_spec is not None and self._deadline_spec.checkpoint_id == spec.checkpoint_id:
            return
        if self._deadline_timer is not None:
            self._deadline_timer.cancel()
        self._deadline_spec = spec
        delay = max(0.0, spec.deadline - time.time())
        self._deadline_timer = asyncio.get_running_loop().call_later(delay, self.post, "deadline", spec.checkpoint_id)

    def _on_deadline(self) -> None:
        now = time.time()
        spec = self._deadline_spec
        if self.barriers is not None and spec is not None:
            if self.barriers.pending is None:
                self.first_barrier_monotonic, self.first_barrier_wall = time.monotonic(), time.time()
            self._carry_out(self.barriers.on_time(now, spec))
        if self.checkpointer is not None:
            self.checkpointer.poll_outputs(now)

    def _on_checkpoint_aborted(self, checkpoint_id: int) -> None:
        if self.barriers is not None:
            self._carry_out(self.barriers.abort(checkpoint_id))
        if self.checkpointer is not None:
            run = self.checkpointer.run
            if run is not None and run.spec.checkpoint_id == checkpoint_id and not run.acked:
                self.checkpointer.abandon(checkpoint_id, "aborted by the coordinator")

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
        if self.restore is None or self.restore.operator is None:
            return
        state = self.restore.operator
        self.chain.restore_state(state)
        if self.source is not None and state.get("source"):
            position, emitted = state["source"]
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
            await self._process_records(reader)
            del self._restored_readers[cid]

    # -- sources ----------------------------------------------------------------------

    async def _between_records(self) -> None:
        """Serve the mailbox; wait while the output is blocked (counted as backpressure)."""
        while True:
            if self.mailbox:
                self._serve_mailbox()
            if not self.output.blocked:
                return
            t0 = time.monotonic()
            await self._wait()
            self.backpressured_s += time.monotonic() - t0

    async def _run_source(self) -> None:
        source = self.source
        assert source is not None
        source.open(self.chain.subtask_index, self.chain.parallelism)
        if self._batch_position is not None:
            source.restore(self._batch_position)
            skip = self._skip_on_restore
            while skip > 0:
                skipped = source.read_batch(skip)
                if not skipped:
                    break
                skip -= len(skipped)
        emit = self.chain.process
        output = self.output
        mailbox = self.mailbox
        last_yield = time.monotonic()
        while True:
            self._batch_position = source.position()
            self._batch_emitted = 0
            if mailbox or output.blocked:
                await self._between_records()
                self._batch_position = source.position()
            batch = source.read_batch(SOURCE_BATCH)
            if batch is None:
                return
            if not batch:
                t0 = time.monotonic()
                await self._wait(source.idle_wait_s())
                self.idle_s += time.monotonic() - t0
                continue
            for i, record in enumerate(batch):
                if output.blocked or mailbox:
                    self._batch_emitted = i  # a checkpoint taken now resumes at record i of this batch
                    await self._between_records()
                emit(record)
            self.records_in += len(batch)
            now = time.monotonic()
            if now - last_yield > YIELD_AFTER_S:
                self._batch_position = source.position()
                self._batch_emitted = 0
                await asyncio.sleep(0)  # let the network and other tasks on this worker run
                last_yield = time.monotonic()

    # -- tasks with inputs --------------------------------------------------------------

    async def _run_inputs(self) -> None:
        gate = self.gate
        assert gate is not None
        gate.announce_credit()
        while gate.open_channels:
            if self.mailbox:
                self._serve_mailbox()
            taken = gate.poll()
            if taken is None:
                t0 = time.monotonic()
                await self._wait()
                self.idle_s += time.monotonic() - t0
                continue
            channel_id, item = taken
            if isinstance(item, Buffer):
                await self._process_buffer(channel_id, item)
                gate.consumed(channel_id)
                await asyncio.sleep(0)  # fairness between tasks of this worker
            else:
                self._on_inband_event(channel_id, item)

    async def _process_buffer(self, channel_id: int, buffer: Buffer) -> None:
        reader = self._readers.get(channel_id)
        if reader is None:
            reader = self._readers[channel_id] = ChannelReader()
        reader.feed(buffer.data)
        await self._process_records(reader)
        reader.trim()

    async def _process_records(self, reader: ChannelReader) -> None:
        unpacker = reader.unpacker
        tell = unpacker.tell
        consumed = reader.consumed
        process = self.chain.process
        output = self.output
        mailbox = self.mailbox
        n = 0
        # Yield to the event loop about every YIELD_AFTER_S of work, so network callbacks (credit, priority
        # events) get in even while records are slow. The clock is read every `stride` records, and the
        # stride adapts to the cost of a record so that fast records pay almost nothing for the check.
        stride = self._stride
        countdown = stride
        last_yield = time.monotonic()
        for record in unpacker:
            if output.blocked or mailbox:
                reader.consumed = consumed  # a snapshot taken now must keep `record`: it is not processed yet
                await self._between_records()
            process(record)
            consumed = tell()
            n += 1
            countdown -= 1
            if not countdown:
                now = time.monotonic()
                elapsed = now - last_yield
                if elapsed > YIELD_AFTER_S:
                    stride = max(1, stride // 2)
                    self.records_in += n
                    n = 0
                    await asyncio.sleep(0)
                    last_yield = time.monotonic()
                elif elapsed < YIELD_AFTER_S / 4 and stride < 4096:
                    stride *= 2
                countdown = stride
        reader.consumed = consumed
        self._stride = stride
        self.records_in += n

    def _on_inband_event(self, channel_id: int, ev: Event) -> None:
        kind = ev.body.get("t")
        gate = self.gate
        assert gate is not None
        if kind == "end":
            gate.end_channel(channel_id)
            if self.barriers is not None and self.checkpointer is not None:
                self._carry_out(self.barriers.on_channel_ended(channel_id))
        elif kind == "barrier":
            self._on_barrier(channel_id, BarrierSpec.from_body(ev.body), priority=False)
        else:
            log.warning("task %s: unknown in-band event %r on channel %d", self.task_id, kind, channel_id)

    def _on_priority_event(self, channel_id: int, seq: int, ev: Event) -> None:
        kind = ev.body.get("t")
        if kind == "barrier":
            self._on_barrier(channel_id, BarrierSpec.from_body(ev.body), priority=True)
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

    async def _wait_drained(self, timeout_s: float = 600.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not all(s.drained() for s in self.subpartitions):
            if time.monotonic() > deadline:
                raise TimeoutError(f"task {self.task_id}: outputs not drained within {timeout_s}s")
            if self.mailbox:
                self._serve_mailbox()
            await self._wait(0.05)
