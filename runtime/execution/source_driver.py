"""A source task's driver: reads batches from its `Source` and runs them through the chain (Flink's
SourceOperator driving a reader), in runs with the task's turns in between (runtime/execution/turns.py).

Its position is what a checkpoint stores of it: the source's position before the current batch and how many
records of that batch went through the chain. A restored driver resumes the source there and skips those
records (a source that prefetches may have none ready at first: they are still skipped, not emitted).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from runtime.connectors.source import SideOutputBatch, Source
from runtime.execution.channels import Subpartition
from runtime.execution.operators import Chain
from runtime.execution.task_time import TaskTime
from runtime.execution.turns import YIELD_AFTER_S, RunEnd, TaskTurns, next_chunk

SOURCE_BATCH = 512


class SourceDriver:
    """Drives one source subtask; `time` is the task's event time (None: the job has none)."""

    def __init__(self, turns: TaskTurns, source: Source, chain: Chain, time_: TaskTime | None,
                 outputs: list[Subpartition]) -> None:
        self.turns = turns
        self.source = source
        self.chain = chain
        self.time = time_
        self.outputs = outputs
        self.batch_position: Any = None  # the source's position before the current batch
        self.batch_emitted = 0  # records of that batch through the chain
        self._skip_on_restore = 0
        self._batch: list[Any] | None = None  # the batch being emitted, from record `_next` on
        self._next = 0
        self._chunk = 1  # records per chain call; adapts (runtime/execution/turns.py)
        self.idle_since: float | None = None  # since when the source has had nothing to read
        self._emit: Callable[[list[Any]], None] = time_.emit if time_ is not None else chain.process_batch

    def restore(self, position: Any) -> None:
        """Resume at a checkpoint's `position` ([position before the batch, records of it emitted])."""
        batch_position, emitted = position
        self.batch_position = batch_position
        self._skip_on_restore = int(emitted)

    def position(self) -> list[Any]:
        """What a checkpoint stores: the position before the current batch, and how much of it was emitted."""
        return [self.batch_position, self.batch_emitted]

    async def run(self) -> None:
        """Until the source ends (a bounded one): batches through the chain; then MAX_WATERMARK with event time."""
        source = self.source
        turns = self.turns
        await turns.call(source.open, self.chain.subtask_index, self.chain.parallelism)  # user code: may block
        if self.batch_position is not None:  # None: a source that cannot be replayed (Source.position)
            await turns.call(source.restore, self.batch_position)
            skip = self._skip_on_restore
            while skip > 0:
                skipped = await turns.call(source.read_batch, skip)
                if skipped is None:
                    break
                if not skipped:  # not ready yet (a source that prefetches): these records must still be skipped
                    await turns.wait(source.idle_wait_s())
                    continue
                skip -= len(skipped)
        while True:
            end = await turns.call(self.run_batches)
            if end is RunEnd.ENDED:
                if self.time is not None:
                    await turns.between_runs(self.time.end)
                return
            if end is RunEnd.DRAINED:  # nothing to read now
                if self.time is not None:
                    await turns.between_runs(self._idle_time)
                await turns.wait_idle(source.idle_wait_s())
            elif end is RunEnd.TURN:
                await turns.between_records()
            else:
                await asyncio.sleep(0)  # let the network and other tasks on this worker run

    def _idle_time(self) -> None:
        """Event time while the source has nothing to read (chain work: see TaskTurns.between_runs)."""
        time_ = self.time
        assert time_ is not None
        time_.flush_periodic()  # a watermark held back for its interval leaves now
        self.idle_since, turned_idle = time_.source_idle(self.idle_since, time.monotonic())
        if turned_idle:
            for sub in self.outputs:
                sub.flush()  # the status must leave now, not at the next periodic flush

    def run_batches(self) -> RunEnd:
        """Batches through the chain, a chunk at a time, until the source has nothing ready or has ended, the
        task must take a turn, or YIELD_AFTER_S have passed (inline or on the task's thread)."""
        source = self.source
        turns = self.turns
        emit = self._emit
        monotonic = time.monotonic
        chunk = self._chunk
        deadline = monotonic() + YIELD_AFTER_S
        try:
            while True:
                batch = self._batch
                if batch is None:
                    self.batch_position = source.position()
                    self.batch_emitted = 0
                    if turns.turn_due():
                        return RunEnd.TURN
                    batch = source.read_batch(SOURCE_BATCH)
                    if batch is None:
                        return RunEnd.ENDED
                    if type(batch) is SideOutputBatch:  # records the source set aside: not through the chain
                        self.chain.emit_source_side_output(batch)
                        turns.records_in += len(batch)
                        continue  # the next batch starts from a fresh position
                    if not batch:
                        return RunEnd.DRAINED
                    self.idle_since = None
                    if self.time is not None:
                        self.time.source_active()
                    self._batch, self._next = batch, 0
                i, n = self._next, len(batch)
                while i < n:
                    if turns.turn_due():
                        self._next = self.batch_emitted = i  # a checkpoint taken now resumes at record i
                        return RunEnd.TURN
                    j = i + chunk
                    t0 = monotonic()
                    emit(batch[i:j] if i or j < n else batch)
                    now = monotonic()
                    emitted = min(j, n) - i
                    # counted as emitted, not at the batch's end: a throttled source may take seconds over a batch
                    turns.records_in += emitted
                    i = j
                    chunk = next_chunk(chunk, now - t0)
                self._batch = None
                if monotonic() > deadline:
                    self.batch_position = source.position()
                    self.batch_emitted = 0
                    return RunEnd.YIELD
        finally:
            self._chunk = chunk
