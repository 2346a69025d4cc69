"""Asynchronous keyed state on asyncio: `AsyncKeyedProcessFunction` run through the controller.

`AsyncStateRunner` is the thin driver of runtime/execution/async_controller.py:
it feeds the controller events (a record arrives, user code asks for state,
the backend answered, a timer fired) and carries out its instructions (start
a coroutine for a record, resolve a state future, run a batch on the backend
in a thread, block input, emit a watermark, snapshot the backend). All the
ordering decisions are the controller's.

A task runs it for a keyed operator whose function is an
AsyncKeyedProcessFunction: runtime/execution/async_operator.py puts it in the
operator chain (an admission queue in front, watermarks in order, checkpoint
replay) and runtime/execution/task.py waits on it (input waits while the
controller blocks it; drain checkpoints wait until nothing is in flight).
Outputs of a record are held until it finishes, so a record either finished
before a checkpoint (its outputs are before the barrier) or is replayed after
a restore (its outputs come after): capture checkpoints stay exact.

The function, its contexts and state handles are the user's API, in
runtime/api/async_functions.py (re-exported here); this module implements
the context of a running record.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from runtime.api.async_functions import (
    CURRENT_RECORD,
    AsyncKeyedContext,
    AsyncKeyedProcessFunction,
    AsyncListState,
    AsyncMapState,
    AsyncOpenContext,
    AsyncStateUsageError,
    AsyncValueState,
)
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
from runtime.execution.user_code import UserCodeExit
from runtime.state.backend import PendingSnapshot, StateBackend

__all__ = ["AsyncKeyedContext", "AsyncKeyedProcessFunction", "AsyncListState", "AsyncMapState", "AsyncOpenContext",
           "AsyncStateRunner", "AsyncStateUsageError", "AsyncValueState", "CapturedCheckpoint"]

class _RecordContext(AsyncKeyedContext):
    """The context of one running record: its requests go to the runner, its outputs wait for its end."""

    __slots__ = ("key", "timestamp", "_runner", "_seq", "_outputs", "_prefix", "timer_changes")

    def __init__(self, runner: AsyncStateRunner, seq: int, key: Any, timestamp: int | None = None) -> None:
        self.key = key
        self.timestamp = timestamp
        self._runner = runner
        self._seq = seq
        self._outputs: list[Any] = []
        self._prefix = runner.state_prefix
        self.timer_changes: list[tuple[bool, int]] = []  # (register?, timestamp), applied when it finishes

    def register_event_time_timer(self, timestamp: int) -> None:
        self.timer_changes.append((True, int(timestamp)))

    def delete_event_time_timer(self, timestamp: int) -> None:
        self.timer_changes.append((False, int(timestamp)))

    def emit(self, value: Any) -> None:
        # released when the record finishes; with event time an output carries its input's timestamp
        self._outputs.append(value if not self._runner.timed else (self.timestamp, value))

    async def _read(self, name: str, default: Any) -> Any:
        value = await self._runner.request(self._seq, Get(name))
        return default if value is MISSING else value

    async def _write(self, name: str, value: Any) -> None:
        await self._runner.request(self._seq, Put(name, value))

    async def _delete(self, name: str) -> None:
        await self._runner.request(self._seq, Delete(name))


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
                 timers_due: Callable[[int], list[tuple[Any, Any]]] | None = None,
                 emit_many: Callable[[list[Any]], None] | None = None,
                 on_progress: Callable[[], None] | None = None,
                 timed: bool = False, state_prefix: str = "",
                 timer_call: Callable[[Timer], tuple[int, Any]] | None = None,
                 on_finished: Callable[[Any, Any, list[tuple[bool, int]]], None] | None = None) -> None:
        """`emit_many`: a finished record's outputs as one list (instead of `emit` per output). `on_progress`:
        called soon (not inside the runner's own call) after input unblocks, a record finishes or the runner
        fails, for a driver that waits on `submit_nowait`. `timed`: records are (timestamp, record) pairs, as in
        a chain with event time. `state_prefix` goes before every state name (an operator's node id).
        `timer_call`: the (timestamp, payload) `on_timer` gets for a due Timer (default: the watermark's time
        and the payload `timers_due` gave). `on_finished(key, record, timer changes)`: a record or timer
        finished successfully, before its outputs are released."""
        self._function = function
        self._backend = backend
        self._controller = AsyncExecutionController(config)
        self._key_of = (lambda pair: key_of(pair[1])) if timed else key_of
        self._emit = emit
        self._emit_many = emit_many
        self._on_progress = on_progress
        self._progress_posted = False
        self.timed = timed
        self.state_prefix = state_prefix
        self._timer_call = timer_call or (lambda t: (t.timestamp, t.payload))
        self._on_finished = on_finished
        self._on_watermark = on_watermark or (lambda ts: None)
        self._timers_due = timers_due or (lambda ts: [])
        self._loop = asyncio.get_running_loop()
        self._futures: dict[int, asyncio.Future[Any]] = {}
        self._next_request = 0
        self._unblocked = asyncio.Event()
        self._unblocked.set()
        self._drained = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self._round_trips: set[asyncio.Future[list[Any]]] = set()
        self._timer: asyncio.TimerHandle | None = None
        self._timer_deadline = 0.0
        self._error: BaseException | None = None
        self._closing = False  # aclose() began
        self.checkpoints: dict[int, CapturedCheckpoint] = {}
        self.blocked_seconds = 0.0

    def bind_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        """Live on `loop` from now on (a task's own loop, runtime/execution/user_loop.py): the runner's records,
        round trips and timers start there. Before anything runs."""
        assert not self._tasks and self._timer is None, "bind_loop after the runner started"
        self._loop = loop

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The loop the runner lives on (its records, round trips and timers start there)."""
        return self._loop

    @property
    def controller(self) -> AsyncExecutionController:
        return self._controller

    # -- what the task calls ---------------------------------------------------------------------------

    @property
    def blocked(self) -> bool:
        return not self._unblocked.is_set()

    @property
    def error(self) -> BaseException | None:
        return self._error

    def submit_nowait(self, record: Any) -> bool:
        """Submit one record unless input is blocked (then False: wait for `on_progress`)."""
        self._raise_if_failed()
        if not self._unblocked.is_set():
            return False
        self._execute(self._controller.submit_record(record, self._key_of(record), now=self._loop.time()))
        return True

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
                self._post_progress()
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

    def _post_progress(self) -> None:
        # soon, not now: a driver that submits more from inside this call would interleave its instructions
        # with the rest of the list being carried out (a later watermark emitted before an earlier one)
        if self._on_progress is not None and not self._progress_posted:
            self._progress_posted = True
            self._loop.call_soon(self._progress)

    def _progress(self) -> None:
        self._progress_posted = False
        if self._on_progress is not None:
            self._on_progress()

    def _spawn(self, coroutine: Any) -> None:
        if self._closing:  # aclose took the tasks to cancel: one started now would outlive the task's close
            coroutine.close()
            return
        task = self._loop.create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def request(self, seq: int, request: StateRequest) -> asyncio.Future[Any]:
        """A state request of record `seq`, from its coroutine."""
        request_id = self._next_request
        self._next_request += 1
        future: asyncio.Future[Any] = self._loop.create_future()
        self._futures[request_id] = future
        self._execute(self._controller.request_state(seq, request_id, request, now=self._loop.time()))
        return future

    async def _run_record(self, start: StartRecord) -> None:
        record = start.record
        ctx = _RecordContext(self, start.seq, start.key)
        CURRENT_RECORD.set(ctx)  # this task's own copy of the context: handles made in open() find it
        try:
            if isinstance(record, Timer):
                timestamp, payload = self._timer_call(record)
                ctx.timestamp = timestamp
                await self._function.on_timer(timestamp, payload, ctx)
            elif self.timed:
                ctx.timestamp = record[0]
                await self._function.process(record[1], ctx)
            else:
                await self._function.process(record, ctx)
        except Exception as e:  # the job fails; the task reports it on its next call
            self._fail(e)
            return
        except SystemExit as e:  # the same, with the function named; out of its task, it ended the loop
            self._fail(UserCodeExit.of(e))
            return
        except asyncio.CancelledError as e:
            if asyncio.current_task().cancelling():  # type: ignore[union-attr]  # aclose(): the task ends
                raise
            # the function's own code was cancelled (a future it awaited, a client closed under it): the record
            # would stay in flight for ever (a drain checkpoint and the end of input waiting for it)
            error = RuntimeError(f"{type(self._function).__name__}: a record's coroutine was cancelled by its own "
                                 f"code (not by the task)")
            error.__cause__ = e
            self._fail(error)
            return
        if self._on_finished is not None:
            self._on_finished(start.key, record, ctx.timer_changes)
        if ctx._outputs:
            if self._emit_many is not None:
                self._emit_many(ctx._outputs)
            else:
                for value in ctx._outputs:
                    self._emit(value)
        self._execute(self._controller.finish_record(start.seq, now=self._loop.time()))
        self._post_progress()

    async def _run_batch(self, batch: ExecuteBatch) -> None:
        # the round trip runs on in a thread when this task is cancelled: aclose waits for it before the
        # caller closes the backend under it
        round_trip = asyncio.ensure_future(asyncio.to_thread(self._round_trip, batch))
        self._round_trips.add(round_trip)
        round_trip.add_done_callback(self._round_trips.discard)
        try:
            values = await asyncio.shield(round_trip)
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
            # the deadline is kept beside the handle: uvloop's timer handles (the worker's loop) have no when()
            if deadline is not None and self._timer_deadline == deadline:
                return
            self._timer.cancel()
            self._timer = None
        if deadline is not None:
            self._timer = self._loop.call_at(deadline, self._on_timer)
            self._timer_deadline = deadline

    def _on_timer(self) -> None:
        self._timer = None
        self._execute(self._controller.tick(now=self._loop.time()))

    def _fail(self, error: BaseException) -> None:
        if self._error is None:
            self._error = error
        self._unblocked.set()
        self._drained.set()
        self._post_progress()

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise self._error

    async def aclose(self) -> None:
        """Cancel what still runs (after a failure) and wait for it; nothing starts from now on (an admission
        posted before, a record finishing meanwhile, would start the next records)."""
        self._closing = True
        if self._timer is not None:
            self._timer.cancel()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await asyncio.gather(*self._round_trips, return_exceptions=True)
