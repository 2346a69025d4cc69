"""A task's input side: its gate's buffers and events, decoded and run through the chain (Flink's
StreamOneInputProcessor / StreamMultipleInputProcessor, one loop for both).

The loop takes one input buffer at a time, decodes its records with the input channel's msgpack Unpacker
(which also joins records that span buffers) a chunk at a time, and runs the chain once per chunk, with no
await per record (runtime/execution/turns.py: runs of chunks, turns in between). With event time, the
chunk's items are (timestamp, record) pairs and watermark/status markers, walked by the task's `TaskTime`;
without it the records go to the chain as they are. Everything else is the same loop.

Restored input channel state is processed first, channel by channel, before anything new arrives; an
unaligned snapshot taken meanwhile stores what is left of it as the start of each channel's state
(`unprocessed_bytes`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from netstack.credit import Buffer, Event
from runtime.execution.channels import ChannelReader, InputGate
from runtime.execution.operators import Chain
from runtime.execution.task_time import TaskTime
from runtime.execution.turns import YIELD_AFTER_S, RunEnd, TaskTurns, next_chunk

BUFFERS_PER_TAKE = 8  # buffers taken from the gate for one run: a hand-off per take, credit returned after it

# a chunk through the chain: (items handled, markers among them, a timer burst is left to run)
ChunkRun = Callable[[list[Any], ChannelReader], tuple[int, int, bool]]


def _plain(process: Callable[[list[Any]], None]) -> ChunkRun:
    def run(items: list[Any], reader: ChannelReader) -> tuple[int, int, bool]:
        process(items)
        return len(items), 0, False

    return run


def _timed(time_: TaskTime, process: Callable[[list[Any]], None], key: str) -> ChunkRun:
    run_chunk = time_.run_chunk

    def run(items: list[Any], reader: ChannelReader) -> tuple[int, int, bool]:
        return run_chunk(items, process, key, reader)

    return run


class InputProcessor:
    """Runs a task's input through its chain; `time` is the task's event time (None: the job has none)."""

    def __init__(self, turns: TaskTurns, gate: InputGate, chain: Chain, time_: TaskTime | None) -> None:
        self.turns = turns
        self.gate = gate
        self.time = time_
        self._readers: dict[int, ChannelReader] = {}
        # restored input channel state not processed yet: it precedes everything on its channel
        self._restored_readers: dict[int, ChannelReader] = {}
        self._chunk = 1  # records per chain call; adapts (runtime/execution/turns.py)
        self._leftover: list[Any] = []  # the items after the marker that started a timer burst
        # the chain input each channel feeds: a two-input head takes its two inputs' channels on two paths
        self._runs: dict[int, ChunkRun] = {}
        for cid, ch in gate.channels.items():
            self._runs[cid] = self._chunk_run(chain.input_batch(ch.input_index), ch.key)
        self._default_run = self._chunk_run(chain.process_batch, "")

    def _chunk_run(self, process: Callable[[list[Any]], None], key: str) -> ChunkRun:
        return _timed(self.time, process, key) if self.time is not None else _plain(process)

    async def run(self, on_event: Callable[[int, Event], Awaitable[None]]) -> None:
        """Until every input channel has ended: buffers through the chain, in-band events to `on_event`.

        The buffers queued in the gate up to the next event (at most BUFFERS_PER_TAKE; the event stays in
        the gate: `InputGate.poll_buffer`) are fed to their channels' readers together and processed in one
        run per channel: a task on its thread pays the hand-off per take, not per buffer. Fed and not
        processed, they are the readers' unprocessed bytes, so a snapshot taken at a turn in between keeps
        them as channel state."""
        gate = self.gate
        turns = self.turns
        gate.announce_credit()
        while gate.open_channels:
            if turns.mailbox:
                await turns.serve_mail()
            taken = gate.poll()
            if taken is None:
                await turns.wait_idle()
                continue
            channel_id, item = taken
            if not isinstance(item, Buffer):
                await on_event(channel_id, item)
                continue
            fed: list[int] = []  # the channel of each buffer fed, in order
            buffer: tuple[int, Buffer] | None = channel_id, item
            while buffer is not None:
                channel_id, data = buffer[0], buffer[1].data
                reader = self._readers.get(channel_id)
                if reader is None:
                    reader = self._readers[channel_id] = ChannelReader()
                reader.feed(data)
                fed.append(channel_id)
                buffer = gate.poll_buffer() if len(fed) < BUFFERS_PER_TAKE else None
            for channel_id in dict.fromkeys(fed):
                reader = self._readers[channel_id]
                await self.process_records(reader, channel_id)
                reader.trim()
            for channel_id in fed:
                gate.consumed(channel_id)
            await asyncio.sleep(0)  # fairness between tasks of this worker

    async def restore(self, inputs: dict[int, bytes]) -> None:
        """Process restored input channel state before anything new arrives on those channels."""
        for cid, stream in inputs.items():
            reader = self._restored_readers[cid] = ChannelReader()
            reader.feed(stream)
        for cid, reader in list(self._restored_readers.items()):
            await self.process_records(reader, cid)
            del self._restored_readers[cid]

    async def resume_watermark(self) -> None:
        """After a restore: finish what the checkpoint caught half done (a timer burst, an unsent watermark)."""
        if self.time is not None and await self.turns.between_runs(self.time.advance):
            await self._fire_timer_burst()

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

    async def process_records(self, reader: ChannelReader, channel_id: int) -> None:
        """Everything `reader` holds through the chain, in runs, with the task's turns in between."""
        run = self._runs.get(channel_id, self._default_run)
        turns = self.turns
        while True:
            end = await turns.call(self.run_chunks, reader, run)
            if end is RunEnd.DRAINED:
                return
            if end is RunEnd.TURN:
                await turns.between_records()
            elif end is RunEnd.BURST:
                await self._fire_timer_burst()
            else:
                await asyncio.sleep(0)  # let the network in: credit and priority events come in callbacks

    def run_chunks(self, reader: ChannelReader, run: ChunkRun) -> RunEnd:
        """Chunks from `reader` through the chain until it is drained, the task must take a turn, a timer
        burst is left, or YIELD_AFTER_S have passed (inline or on the task's thread: nothing here waits).

        The reader's position moves past a chunk once it is processed: a snapshot taken at a turn keeps the
        records after it as channel state (at a burst, `TaskTime.run_chunk` sets it after the marker)."""
        turns = self.turns
        take = reader.take
        monotonic = time.monotonic
        chunk = self._chunk
        deadline = monotonic() + YIELD_AFTER_S
        try:
            while True:
                items = self._leftover
                if items:
                    self._leftover = []
                else:
                    if turns.turn_due():
                        return RunEnd.TURN
                    items = take(chunk)
                    if not items:
                        return RunEnd.DRAINED
                t0 = monotonic()
                done, markers, burst = run(items, reader)
                turns.records_in += done - markers
                if markers:
                    turns.watermarks_in += markers
                if burst:
                    self._leftover = items[done:]
                    return RunEnd.BURST
                reader.consumed = reader.fetched
                now = monotonic()
                chunk = next_chunk(chunk, now - t0)
                if now > deadline:
                    return RunEnd.YIELD
        finally:
            self._chunk = chunk

    async def _fire_timer_burst(self) -> None:
        """Fire the due event-time timers in runs of chunks, serving the mailbox (barriers, RPC mail) and
        waiting for output in between; then forward the watermark."""
        time_ = self.time
        assert time_ is not None
        turns = self.turns
        while True:
            await turns.between_records()
            end = await turns.call(self.fire_timers)
            if end is RunEnd.DRAINED:
                break
            if end is RunEnd.YIELD:
                await asyncio.sleep(0)  # let the network in: a barrier reaches the mailbox from a callback
        await turns.call(time_.advance)

    def fire_timers(self) -> RunEnd:
        """Chunks of due event-time timers until none is left, the task must take a turn, or YIELD_AFTER_S
        have passed (inline or on the task's thread)."""
        time_ = self.time
        assert time_ is not None
        turns = self.turns
        monotonic = time.monotonic
        deadline = monotonic() + YIELD_AFTER_S
        while time_.fire_timers():
            if turns.turn_due():
                return RunEnd.TURN
            if monotonic() > deadline:
                return RunEnd.YIELD
        return RunEnd.DRAINED
