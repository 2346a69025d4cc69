"""Asynchronous keyed state on asyncio: `AsyncKeyedProcessFunction` run through the controller.

`AsyncStateRunner` is the thin driver of runtime/execution/async_controller.py:
it feeds the controller events (a record arrives, user code asks for state,
the backend answered, a timer fired) and carries out its instructions (start
a coroutine for a record, resolve a state future, run a batch on the backend
in a thread, block input, emit a watermark, snapshot the backend). All the
ordering decisions are the controller's.

Not wired into the task loop yet (runtime/execution/task.py): a later change
makes keyed operators with an AsyncKeyedProcessFunction use this runner.
Outputs of a record are held until it finishes, so a record either finished
before a checkpoint (its outputs are before the barrier) or is replayed after
a restore (its outputs come after): capture checkpoints stay exact.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from runtime.execution.async_controller import (
    MISSING,
    AnswerRequest,
    AsyncExecutionController,
    BlockInput,
    ControllerConfig,
    Delete,
    Drained,
    EmitWatermark,
    ExecuteBatch,
    FireTimers,
    Get,
    Instruction,
    Put,
    StartRecord,
    StateRequest,
    TakeSnapshot,
    Timer,
    UnblockInput,
)
from runtime.state.backend import PendingSnapshot, StateBackend


class AsyncValueState:
    """One value per key, read and written asynchronously; scoped to the record whose context made it."""

    __slots__ = ("_ctx", "_name", "_default")

    def __init__(self, ctx: AsyncKeyedContext, name: str, default: Any) -> None:
        self._ctx = ctx
        self._name = name
        self._default = default

    async def value(self) -> Any:
        value = await self._ctx._request(Get(self._name))
        return self._default if value is MISSING else value

    async def update(self, value: Any) -> None:
        await self._ctx._request(Put(self._name, value))

    async def clear(self) -> None:
        await self._ctx._request(Delete(self._name))


class AsyncListState:
    """A list per key, stored as one value: each change reads and rewrites it (the key is held meanwhile)."""

    __slots__ = ("_value",)

    def __init__(self, ctx: AsyncKeyedContext, name: str) -> None:
        self._value = AsyncValueState(ctx, name, None)

    async def get(self) -> list[Any]:
        return list(await self._value.value() or [])

    async def add(self, item: Any) -> None:
        await self._value.update([*(await self.get()), item])

    async def update(self, items: list[Any]) -> None:
        await (self._value.update(list(items)) if items else self._value.clear())

    async def clear(self) -> None:
        await self._value.clear()


class AsyncMapState:
    """A map per key, stored as one value (small maps; per-entry storage comes with MapState proper)."""

    __slots__ = ("_value",)

    def __init__(self, ctx: AsyncKeyedContext, name: str) -> None:
        self._value = AsyncValueState(ctx, name, None)

    async def items(self) -> dict[Any, Any]:
        return dict(await self._value.value() or {})

    async def get(self, map_key: Any, default: Any = None) -> Any:
        return (await self.items()).get(map_key, default)

    async def put(self, map_key: Any, value: Any) -> None:
        await self._value.update({**(await self.items()), map_key: value})

    async def remove(self, map_key: Any) -> None:
        items = await self.items()
        items.pop(map_key, None)
        await (self._value.update(items) if items else self._value.clear())

    async def clear(self) -> None:
        await self._value.clear()


class AsyncKeyedContext:
    """What `process` sees: the record's key, `emit`, and asynchronous state of that key."""

    __slots__ = ("key", "_runner", "_seq", "_outputs")

    def __init__(self, runner: AsyncStateRunner, seq: int, key: Any) -> None:
        self.key = key
        self._runner = runner
        self._seq = seq
        self._outputs: list[Any] = []

    def emit(self, value: Any) -> None:
        self._outputs.append(value)  # released when the record finishes

    def value_state(self, name: str, default: Any = None) -> AsyncValueState:
        return AsyncValueState(self, name, default)

    def list_state(self, name: str) -> AsyncListState:
        return AsyncListState(self, name)

    def map_state(self, name: str) -> AsyncMapState:
        return AsyncMapState(self, name)

    def _request(self, request: StateRequest) -> asyncio.Future[Any]:
        return self._runner._request(self._seq, request)


class AsyncKeyedProcessFunction:
    """Per-record logic with asynchronous keyed state: override `async def process(self, record, ctx)`."""

    async def process(self, record: Any, ctx: AsyncKeyedContext) -> None:
        raise NotImplementedError

    async def on_timer(self, timestamp: int, payload: Any, ctx: AsyncKeyedContext) -> None:
        """A timer of `ctx.key` is due (the runner's `timers_due` said so); runs before the watermark goes on."""


@dataclass(frozen=True)
class CapturedCheckpoint:
    """What a checkpoint of the runner holds besides the channels: see TakeSnapshot."""

    instruction: TakeSnapshot
    pending: PendingSnapshot
    taken_at: float  # loop time of the synchronous part (the barrier's arrival is the caller's to note)


class AsyncStateRunner:
    def __init__(self, function: AsyncKeyedProcessFunction, backend: StateBackend, config: ControllerConfig, *,
                 key_of: Callable[[Any], Any], emit: Callable[[Any], None],
                 on_watermark: Callable[[int], None] | None = None,
                 timers_due: Callable[[int], list[tuple[Any, Any]]] | None = None) -> None:
        self._function = function
        self._backend = backend
        self._controller = AsyncExecutionController(config)
        self._key_of = key_of
        self._emit = emit
        self._on_watermark = on_watermark or (lambda ts: None)
        self._timers_due = timers_due or (lambda ts: [])
        self._loop = asyncio.get_running_loop()
        self._futures: dict[int, asyncio.Future[Any]] = {}
        self._next_request = 0
        self._unblocked = asyncio.Event()
        self._unblocked.set()
        self._drained = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self._timer: asyncio.TimerHandle | None = None
        self._error: BaseException | None = None
        self.checkpoints: dict[int, CapturedCheckpoint] = {}
        self.blocked_seconds = 0.0

    @property
    def controller(self) -> AsyncExecutionController:
        return self._controller

    # -- what the task calls ---------------------------------------------------------------------------

    async def process(self, record: Any) -> None:
        """Submit one record; waits while the controller blocks input (backpressure)."""
        self._raise_if_failed()
        while not self._unblocked.is_set():  # a loop: timers admitted meanwhile may block input again
            started = self._loop.time()
            await self._unblocked.wait()
            self.blocked_seconds += self._loop.time() - started
            self._raise_if_failed()
        self._execute(self._controller.submit_record(record, self._key_of(record), now=self._loop.time()))

    def watermark(self, timestamp: int) -> None:
        self._execute(self._controller.watermark(timestamp, now=self._loop.time()))

    def barrier(self, checkpoint_id: int) -> None:
        self._execute(self._controller.barrier(checkpoint_id, now=self._loop.time()))

    async def finish(self) -> None:
        """End of input: wait until every record finished and every write reached the backend."""
        self._execute(self._controller.end_input(now=self._loop.time()))
        await self._drained.wait()
        self._raise_if_failed()

    # -- carrying out instructions ---------------------------------------------------------------------

    def _execute(self, instructions: list[Instruction]) -> None:
        fire: list[int] = []
        for i in instructions:
            if isinstance(i, AnswerRequest):
                future = self._futures.pop(i.request_id)
                if not future.done():
                    future.set_result(i.value)
            elif isinstance(i, StartRecord):
                self._spawn(self._run_record(i))
            elif isinstance(i, ExecuteBatch):
                self._spawn(self._run_batch(i))
            elif isinstance(i, BlockInput):
                self._unblocked.clear()
            elif isinstance(i, UnblockInput):
                self._unblocked.set()
            elif isinstance(i, EmitWatermark):
                self._on_watermark(i.timestamp)
            elif isinstance(i, FireTimers):
                fire.append(i.timestamp)  # after this list: its instructions were decided before the timers
            elif isinstance(i, TakeSnapshot):
                # the synchronous part, now: no batch after this instruction reaches the backend before it
                pending = self._backend.begin_snapshot(i.checkpoint_id)
                self.checkpoints[i.checkpoint_id] = CapturedCheckpoint(i, pending, self._loop.time())
            elif isinstance(i, Drained):
                self._drained.set()
        for timestamp in fire:
            self._execute(self._controller.fire_timers(timestamp, self._timers_due(timestamp), now=self._loop.time()))
        self._arm_timer()

    def _spawn(self, coroutine: Any) -> None:
        task = self._loop.create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _request(self, seq: int, request: StateRequest) -> asyncio.Future[Any]:
        request_id = self._next_request
        self._next_request += 1
        future: asyncio.Future[Any] = self._loop.create_future()
        self._futures[request_id] = future
        self._execute(self._controller.request_state(seq, request_id, request, now=self._loop.time()))
        return future

    async def _run_record(self, start: StartRecord) -> None:
        ctx = AsyncKeyedContext(self, start.seq, start.key)
        try:
            if isinstance(start.record, Timer):
                await self._function.on_timer(start.record.timestamp, start.record.payload, ctx)
            else:
                await self._function.process(start.record, ctx)
        except Exception as e:  # the job fails; the task reports it on its next call
            self._fail(e)
            return
        for value in ctx._outputs:
            self._emit(value)
        self._execute(self._controller.finish_record(start.seq, now=self._loop.time()))

    async def _run_batch(self, batch: ExecuteBatch) -> None:
        try:
            values = await asyncio.to_thread(self._round_trip, batch)
        except Exception as e:
            self._fail(e)
            return
        self._execute(self._controller.batch_done(batch.batch_id, values, now=self._loop.time()))

    def _round_trip(self, batch: ExecuteBatch) -> list[Any]:
        values = self._backend.get_many(batch.reads) if batch.reads else []
        if batch.puts or batch.deletes:
            self._backend.write_many(batch.puts, batch.deletes)
        return values

    def _arm_timer(self) -> None:
        deadline = self._controller.next_deadline()
        if self._timer is not None:
            if deadline is not None and self._timer.when() == deadline:
                return
            self._timer.cancel()
            self._timer = None
        if deadline is not None:
            self._timer = self._loop.call_at(deadline, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._execute(self._controller.tick(now=self._loop.time()))

    def _fail(self, error: BaseException) -> None:
        if self._error is None:
            self._error = error
        self._unblocked.set()
        self._drained.set()

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise self._error

    async def aclose(self) -> None:
        """Cancel what still runs (after a failure) and wait for it."""
        if self._timer is not None:
            self._timer.cancel()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
