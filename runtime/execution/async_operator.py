"""An AsyncKeyedProcessFunction as an operator of a chain: admission, watermarks in order, checkpoints.

The chain is synchronous (a list of records in, lists out); the function is
not. `AsyncOperator` bridges them. Records the chain hands it go into an
admission queue and from there into the AsyncStateRunner (its controller
decides order, overlap and the in-flight bound) as long as the controller
does not block input; the task sees a non-empty queue (`backlog`) and stops
taking input until it empties, serving its mailbox meanwhile. So input waits
at `max_in_flight` records plus at most one chunk, and the upstream channels
show the backpressure. Watermarks take the same queue, so a watermark reaches
the controller after the records before it and is forwarded (into the rest
of the chain) when its epoch ends. A finished record's outputs go into the
rest of the chain at once, from the record's own asyncio task: the chain's
tail only appends to output buffers, which never waits.

Checkpoints (`snapshot`): the controller always snapshots at once (its
capture mode). In `drain` mode the task first waits until nothing is queued
or in flight (Task._quiesce), so the replay list is empty and the snapshot is
Flink's; in `capture` mode the records still in flight and the queued ones
are the replay list, which a restore puts in the queue before anything else
(`restore`): before restored channel state and new input.

Event-time timers (`AsyncEventTimers`) run through the controller's epochs:
once the records before a watermark finished, the due timers run as records
of their keys, and the watermark goes on after them. They are checkpointed in
the in-flight document.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from runtime.execution.async_checkpoint import decode_inflight, inflight_document, restore_inflight
from runtime.execution.async_controller import (
    ControllerConfig,
    EpochMode,
    InFlightAtBarrier,
    KeyOrder,
    Record,
    Timer,
    Watermark,
)
from runtime.execution.async_state import AsyncKeyedProcessFunction, AsyncOpenContext, AsyncStateRunner
from runtime.graph.config import parse_duration_or_zero, parse_positive
from runtime.graph.flags import flag
from runtime.graph.job_config import ASYNC_STATE
from runtime.graph.partitioning import key_group
from runtime.state.backend import PendingSnapshot, StateBackend
from runtime.state.codec import hashable

DRAIN = "drain"
CAPTURE = "capture"


def _milliseconds(seconds: float) -> float:
    return seconds * 1000


@dataclass(frozen=True)
class AsyncStateSettings:
    """A job's `async_state` settings (README, Asynchronous state), built once from the job configuration."""

    max_in_flight: int = field(default=1000, metadata=flag(
        "--async-max-in-flight", "records in flight per task before input waits (1000)", parse=parse_positive,
        metavar="N", group=ASYNC_STATE))
    batch_size: int = field(default=100, metadata=flag(
        "--async-batch-size", "state requests per backend round trip at most (100)", parse=parse_positive,
        metavar="N", group=ASYNC_STATE))
    batch_timeout_ms: float = field(default=1.0, metadata=flag(
        "--async-batch-timeout", "a partial batch waits this long for more requests (1ms)",
        parse=parse_duration_or_zero, metavar="DURATION", to_field=_milliseconds, group=ASYNC_STATE))
    key_order: str = field(default=KeyOrder.RECORD.value, metadata=flag(  # record | first-state-access
        "--async-key-order", "records of one key: whole-record order (record, the default) or from their first "
        "state access on (first-state-access)", choices=("record", "first-state-access"), group=ASYNC_STATE))
    epochs: str = field(default=EpochMode.STRICT.value, metadata=flag(  # strict | out-of-order
        "--async-epochs", "records after a watermark wait for the ones before it (strict, the default) or start "
        "at once (out-of-order); the watermark is forwarded after the ones before it either way",
        choices=("strict", "out-of-order"), group=ASYNC_STATE))
    checkpoint: str = field(default=DRAIN, metadata=flag(  # drain | capture
        "--async-checkpoint", "at a barrier: wait for the records in flight (drain, the default, as Flink) or "
        "snapshot at once and store them as input to replay (capture)", choices=(DRAIN, CAPTURE),
        group=ASYNC_STATE))

    def __post_init__(self) -> None:
        if self.checkpoint not in (DRAIN, CAPTURE):
            raise ValueError(f"async_state checkpoint {self.checkpoint!r}: choose drain or capture")
        self.controller_config(128)  # validates the rest

    @classmethod
    def from_config(cls, config: dict[str, Any] | None) -> AsyncStateSettings:
        config = dict(config or {})
        for name in ("key_order", "epochs", "checkpoint"):
            if name in config:
                config[name] = str(config[name]).replace("_", "-")
        unknown = set(config) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"unknown async_state settings {sorted(unknown)}: "
                             f"choose from {sorted(cls.__dataclass_fields__)}")
        return cls(**config)

    def controller_config(self, max_parallelism: int) -> ControllerConfig:
        try:
            key_order, epochs = KeyOrder(self.key_order), EpochMode(self.epochs)
        except ValueError as e:
            raise ValueError(f"async_state: {e} (key_order: record | first-state-access; "
                             f"epochs: strict | out-of-order)") from None
        # the controller always snapshots at once; drain waits for quiet before asking (module docstring)
        return ControllerConfig(max_in_flight=self.max_in_flight, batch_size=self.batch_size,
                                batch_timeout_s=self.batch_timeout_ms / 1000, key_order=key_order,
                                epoch_mode=epochs, checkpoint_mode=InFlightAtBarrier.CAPTURE,
                                max_parallelism=max_parallelism)


class AsyncEventTimers:
    """The event-time timers of an asynchronous keyed operator, as (timestamp, key).

    A registration takes effect when its record finishes (as its state writes do), and a timer leaves when its
    `on_timer` finishes, not when it is handed out: a capture checkpoint taken while it runs still holds it,
    and the watermark in the replay list fires it again. Timers are few per key; `due` scans them all."""

    def __init__(self) -> None:
        self._timers: set[tuple[int, Any]] = set()
        self._firing: set[tuple[int, Any]] = set()

    def __len__(self) -> int:
        return len(self._timers)

    def apply(self, key: Any, changes: Sequence[tuple[bool, int]]) -> None:
        for register, timestamp in changes:
            if register:
                self._timers.add((timestamp, key))
            else:
                self._timers.discard((timestamp, key))

    def due(self, watermark: int) -> list[tuple[Any, Any]]:
        """(key, timestamp) of the timers at or before `watermark` not handed out yet, by time."""
        out = sorted((t for t in self._timers if t[0] <= watermark and t not in self._firing), key=lambda t: t[0])
        self._firing.update(out)
        return [(key, timestamp) for timestamp, key in out]

    def fired(self, key: Any, timestamp: int) -> None:
        self._timers.discard((timestamp, key))
        self._firing.discard((timestamp, key))

    def snapshot(self) -> list[list[Any]]:
        return [[timestamp, key] for timestamp, key in self._timers]

    def restore(self, entries: Sequence[Sequence[Any]], key_groups: range, max_parallelism: int) -> None:
        for timestamp, key in entries:
            key = hashable(key)
            if key_group(key, max_parallelism) in key_groups:
                self._timers.add((int(timestamp), key))


class AsyncOperator:
    # The operator lives on the loop its coroutines run on (`run_on`): with the coroutines alone on the task's
    # loop, each state request crossed between the loops twice, which halved the async keyed count
    # (bench_state.py --parts cluster, memory backend: 19-21 k records/s against 42-58 k, alternating).

    def __init__(self, function: AsyncKeyedProcessFunction, backend: StateBackend, settings: AsyncStateSettings, *,
                 node_id: int, name: str, key_fn: Callable[[Any], Any], subtask_index: int, parallelism: int,
                 max_parallelism: int, timed: bool, emit: Callable[[list[Any]], None],
                 forward_watermark: Callable[[int], None]) -> None:
        self.function = function
        self.backend = backend
        self.drain = settings.checkpoint == DRAIN
        self.node_id = node_id
        self._max_parallelism = max_parallelism
        self._queue: deque[Any] = deque()  # records (pairs with event time) and Watermark markers, in order
        self._open_ctx = AsyncOpenContext(subtask_index=subtask_index, parallelism=parallelism, name=name,
                                          state_prefix=f"{node_id}/")
        self._opened = False
        self.timers = AsyncEventTimers()
        self._wake: Callable[[], None] = lambda: None
        self._on_failure: Callable[[BaseException], None] = lambda e: None
        self._failure_reported = False
        # the controller asks for due timers before each watermark only when the function has on_timer
        has_timers = type(function).on_timer is not AsyncKeyedProcessFunction.on_timer
        config = dataclasses.replace(settings.controller_config(max_parallelism), timers=has_timers)
        self.runner = AsyncStateRunner(function, backend, config,
                                       key_of=key_fn, emit=lambda v: emit([v]), emit_many=emit,
                                       on_watermark=forward_watermark, on_progress=self._on_progress,
                                       timed=timed, state_prefix=f"{node_id}/",
                                       timers_due=self.timers.due, timer_call=lambda t: (t.payload, None),
                                       on_finished=self._on_finished)
        self._key_of = self.runner._key_of
        self.blocked_s = 0.0  # time the task waited for admission (Task accounts it)
        self.captured_records = 0  # records in flight that checkpoints captured for replay, over all
        self.last_captured_records = 0

    def bind(self, *, wake: Callable[[], None], on_failure: Callable[[BaseException], None]) -> None:
        """The task's wake-up (admission progress) and how a failed record fails the task."""
        self._wake = wake
        self._on_failure = on_failure

    def run_on(self, loop: asyncio.AbstractEventLoop) -> None:
        """Live on `loop`, the task's own (runtime/execution/user_loop.py), with the rest of the task's chain."""
        self.runner.bind_loop(loop)

    # -- what the chain calls ---------------------------------------------------------------------------

    def feed(self, records: list[Any]) -> None:
        self._on_its_loop()
        self._queue.extend(records)
        self.pump()

    def feed_watermark(self, timestamp: int) -> None:
        self._on_its_loop()
        self._queue.append(Watermark(timestamp))
        self.pump()

    def _on_its_loop(self) -> None:
        # once a run, not per record: fed from a loop it is not bound to (a task that skipped `run_on`), its
        # records would start on the other loop from this thread, and everything would seem to work
        if asyncio.get_running_loop() is not self.runner.loop:
            raise RuntimeError(f"asynchronous operator {self.node_id}: fed on a loop it is not bound to (run_on)")

    def pump(self) -> None:
        """Submit queued input while the controller admits it (and only once the function is open)."""
        if not self._opened:
            return
        queue = self._queue
        runner = self.runner
        while queue:
            item = queue[0]
            if item.__class__ is Watermark:
                runner.watermark(item.timestamp)
            elif not runner.submit_nowait(item):
                return
            queue.popleft()

    # -- what the task asks ---------------------------------------------------------------------------

    @property
    def backlog(self) -> bool:
        """Input handed over but not admitted: the task takes no more until it is."""
        return bool(self._queue)

    @property
    def in_flight(self) -> int:
        return self.runner.controller.in_flight

    def quiet(self) -> bool:
        """Nothing queued or in flight: a drain checkpoint may snapshot now."""
        return not self._queue and self.runner.controller.in_flight == 0

    def raise_if_failed(self) -> None:
        error = self.runner.error
        if error is not None:
            raise error

    def _on_finished(self, key: Any, record: Any, timer_changes: list[tuple[bool, int]]) -> None:
        if record.__class__ is Timer:
            self.timers.fired(key, record.payload)
        if timer_changes:
            self.timers.apply(key, timer_changes)

    def _on_progress(self) -> None:
        if self.runner.error is None:
            self.pump()
        if self.runner.error is not None and not self._failure_reported:
            self._failure_reported = True
            self._on_failure(self.runner.error)
        self._wake()

    # -- life cycle -------------------------------------------------------------------------------------

    async def open(self) -> None:
        await _open(self.function, self._open_ctx)
        self._opened = True
        self.pump()

    async def finish(self) -> None:
        """End of input, once nothing is queued: wait until every record finished and every write landed."""
        assert not self._queue, "finish() with input still queued"
        await self.runner.finish()

    async def aclose(self) -> None:
        """Cancel the records still running (the task ends early) and wait for them."""
        await self.runner.aclose()

    # -- checkpoints ------------------------------------------------------------------------------------

    def snapshot(self, checkpoint_id: int) -> tuple[PendingSnapshot, dict[str, Any]]:
        """The synchronous part: the backend's snapshot, and the document of what was in flight."""
        queued = [item if item.__class__ is Watermark else Record(self._key_of(item), item) for item in self._queue]
        self.runner.barrier(checkpoint_id)
        captured = self.runner.checkpoints.pop(checkpoint_id)
        doc = inflight_document(captured.instruction, queued)
        if len(self.timers):
            doc["timers"] = self.timers.snapshot()
        self.last_captured_records = sum(1 for e in doc["replay"] if e[0] == "r")
        self.captured_records += self.last_captured_records
        return captured.pending, doc

    def restore(self, docs: list[dict[str, Any]]) -> None:
        """Before any input: apply the checkpoints' pending writes, queue their replay input first."""
        checkpoints = [decode_inflight(d, f"async state of operator {self.node_id}") for d in docs]
        for doc in docs:
            self.timers.restore(doc.get("timers") or [], self.backend.key_groups, self._max_parallelism)
        replay = restore_inflight(self.backend, checkpoints, max_parallelism=self._max_parallelism)
        self._queue.extendleft(reversed([e if isinstance(e, Watermark) else e.value for e in replay]))


async def _open(function: AsyncKeyedProcessFunction, ctx: AsyncOpenContext) -> None:
    result = function.open(ctx)  # plain or `async def`
    if inspect.isawaitable(result):
        await result
