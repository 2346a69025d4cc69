"""A running subtask: its lifecycle and mailbox (Flink's StreamTask).

A task is built complete by the worker's task factory and runs one of two drivers: a `SourceDriver`
(runtime/execution/source_driver.py) for a source task, an `InputProcessor`
(runtime/execution/input_processor.py) for a task with inputs; with event time both use the task's
`TaskTime` (runtime/execution/task_time.py). They run records through the chain in runs and take the
task's turns in between (runtime/execution/turns.py): the task serves its mailbox (barriers, checkpoint
triggers and notifications, probes, cancellation), waits while its output is blocked (a subpartition queue
at its limit), and flushes its outputs periodically. So a backpressured task still answers its mailbox
within one chunk's time, and never starts a chunk it has no output buffer for (a started chunk may overdraw
its buffer; the queue limit is soft by one chunk).

A task makes its runs on a thread of its own (runtime/execution/isolation.py) and awaits each one
(`_offload`): everything between the runs (mailbox, snapshots, credit, waiting for output) stays here on the
event loop, in the same order as inline. A task with an asynchronous operator runs its chain on a loop of its
own (`_start_user_loop`) and parks it while it touches the chain between runs (`exclusive`). The user calls a
checkpoint makes between runs (the sinks' `snapshot_state` and `commit`, a source's `checkpoint_complete`) go
there too (`defer_user_call`), so a sink that blocks in them holds up its own task only.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from netstack.credit import Buffer, Event
from runtime.connectors.source import Source
from runtime.execution import ticks
from runtime.execution.channels import InputChannel, InputGate, OutputGate, Subpartition, event
from runtime.execution.inflight import resize
from runtime.execution.input_processor import InputProcessor
from runtime.execution.isolation import HandOff, IsolationPolicy, IsolationSettings, TaskThread, task_thread_name
from runtime.execution.mailbox import Cancel, InjectProbe, Mail, Message, PriorityEvent
from runtime.execution.operators import Chain
from runtime.execution.probes import ProbeTracker
from runtime.execution.source_driver import SourceDriver
from runtime.execution.task_time import TIMER_CHUNK, TaskTime
from runtime.execution.time_accounting import BACKPRESSURED_TIME, IDLE_TIME, TimeAccounting
from runtime.execution.timers import current_time_ms
from runtime.execution.user_code import RunningCall, UserCodeCancelled, UserCodeExit
from runtime.execution.user_loop import UserLoop
from runtime.graph.enums import TaskState

log = logging.getLogger("sluice.task")


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
    slow_user_calls: int = 0  # user calls the worker's watchdog found running past its threshold


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
                 checkpoints: Callable[[Task], CheckpointListener] | None = None,
                 isolation: IsolationSettings = IsolationSettings()) -> None:
        self.key = key
        self.task_id = key.task_id
        self.name = key.display_name
        self.chain = chain
        self.subpartitions = outputs
        self.source = source
        self.flush_timeout_s = flush_timeout_s
        self.output = output_gate
        output_gate.bind(self.wake)
        # where the subpartitions mark themselves due for the flush tick (the task's gate, as the worker builds
        # them; each subpartition's own, whatever it is)
        self._output_gates = list({id(s.gate): s.gate for s in outputs}.values())
        self.gate: InputGate | None = (InputGate(self, inputs, exclusive=credits.exclusive, floating=credits.floating)
                                       if inputs else None)
        self.restore = restore
        self.mailbox: deque[Message] = deque()
        self._wakeup = asyncio.Event()
        self._probes: ProbeTracker | None = None
        self._overtaken_out = 0
        # called with (task, probe_id, overtaken output buffers, overtaken input buffers) when a probe completes
        self.on_probe_complete: Callable[[Task, int, int, int], None] = lambda *args: None
        # called once the task has processed all its input and sent "end" downstream
        self.on_end_of_input: Callable[[Task], None] = lambda task: None
        # called when the task stopped and its thread is still in a user call `cancel_timeout_s` later (the worker
        # fails fatally then, runtime/execution/user_code.py); by default the daemon thread is left behind
        self.cancel_timeout_s = 10.0
        self.on_stuck: Callable[[Task], None] = _left_behind
        self._stuck_reported = False
        self.slow_calls = 0  # user calls reported running past the worker's threshold (the worker counts them)
        self.end_of_input = False
        self.records_in = 0  # records only: watermark and status markers are counted in watermarks_in
        self.watermarks_in = 0
        self.times = TimeAccounting()  # idle, backpressured and busy time, the wait in progress included
        self.state = TaskState.CREATED
        self._processing_timers_posted = False
        # event time (runtime/execution/task_time.py); restored from the checkpoint before any replay
        self.event_time = chain.event_time
        self.time: TaskTime | None = None
        if self.event_time:
            self.time = TaskTime(chain, source=source,
                                 channel_keys=[ch.key for ch in self.gate.channels.values()] if self.gate else [],
                                 state=restore.time if restore is not None else None)
        # what runs the records: a source's driver, or the input processor of a task with inputs
        self.driver: SourceDriver | None = (SourceDriver(self, source, chain, self.time, outputs)
                                            if source is not None else None)
        self.inputs: InputProcessor | None = (InputProcessor(self, self.gate, chain, self.time)
                                              if self.gate is not None else None)
        # an asynchronous keyed operator: input waits for its admission, drain checkpoints for its quiet
        self._async_op = chain.async_operator
        if self._async_op is not None:
            self._async_op.bind(wake=self._wake_from_chain, on_failure=self._async_failed)
        # blocking user code: the chain's calls on a thread of the task's own (runtime/execution/isolation.py), as
        # the worker's settings (WorkerConfig.isolation) say
        self.isolation = IsolationPolicy(isolation, asynchronous=self._async_op is not None)
        self._thread: TaskThread | None = None
        # with an asynchronous operator: the loop its chain lives on, and the buffers that chain cuts there
        self._user_loop: UserLoop | None = None
        self._hand_off: HandOff | None = None
        self._home: asyncio.AbstractEventLoop | None = None  # the worker's loop (wake-ups from the task's loop)
        self._loop_failure: BaseException | None = None  # a sys.exit() escaped user code on the task's loop
        self._wake_posted = False
        self._deferred: list[tuple[Subpartition, Buffer]] = []  # buffers cut by the thread, queued on its return
        self._on_thread = False  # a call is on the thread: the loop must not touch the subpartitions' builders
        self._tick_due = False  # the periodic flush came during a call: it runs when the call returns
        self._parked_tick: asyncio.Future[None] | None = None  # a chain on its own loop: the tick parking it
        self._processing_timers_due = False  # an isolated task's processing-time timers wait for its thread
        # user calls the mailbox's mail asked for (a sink's pre-commit or commit, `defer_user_call`), made on the
        # task's thread or loop before the next message is served
        self._user_calls: deque[tuple[Callable[..., Any], tuple[Any, ...], Callable[[Any], None]]] = deque()
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
            current_watermark=self.time.current_watermark() if self.time is not None else None,
            async_in_flight=self._async_op.in_flight if self._async_op is not None else None,
            async_blocked_s=self._async_op.blocked_s if self._async_op is not None else 0.0,
            async_captured_records=self._async_op.captured_records if self._async_op is not None else 0,
            channels_switched=cp.channels_switched,
            switches_refused=cp.switches_refused,
            slow_user_calls=self.slow_calls,
        )

    # -- the loop -----------------------------------------------------------------

    async def run(self) -> None:
        self.times.start(time.monotonic())
        self.state = TaskState.RUNNING
        self._home = asyncio.get_running_loop()
        stop_ticks = ticks.every(self.flush_timeout_s, self._on_flush_tick)
        try:
            if self.isolation.user_loop:
                self._start_user_loop()
            self._restore_operator_state()
            await self.call(self.chain.open)  # user code: it may block too
            finished_before = self.restore is not None and self.restore.finished
            ended_before = finished_before or (self.restore is not None and self.restore.ended)
            if ended_before:  # before the task can finish or acknowledge anything (the table sinks' committer)
                await self.call(self.chain.restored_at_end, finished_before)
            # restored output channel state first: records the asynchronous operator replays may finish (on the
            # task's own loop) as soon as it is open
            await self.exclusive(self._restore_outputs)
            await self._on_chain_loop(self.chain.open_async())
            if self.driver is not None:
                if not ended_before:  # a source at its end must not emit again
                    await self.driver.run()
            elif self.inputs is not None:
                if not ended_before:
                    await self.inputs.resume_watermark()  # a timer burst the checkpoint was taken in the middle of
                if self.restore is not None and self.restore.inputs:
                    inputs, self.restore.inputs = self.restore.inputs, None
                    await self.inputs.restore(inputs)
                await self.inputs.run(self._on_inband_event)  # when it had ended, so had its upstream: only "end"
            if not ended_before:  # operators that emit at the end (aggregates) must not emit twice
                await self._finish_async()
                await self.call(self.chain.finish)
            await self.exclusive(self._end_outputs)
            self.on_end_of_input(self)
            await self._wait_drained()
            if self.checkpoints is not None and not finished_before:
                await self._wait_final_checkpoint()
            self.state = TaskState.FINISHED
        except TaskCancelled:
            self.state = TaskState.CANCELLED
            raise
        except asyncio.CancelledError as exc:
            if _raised_by_user_code():
                # nobody cancelled this task: user code raised it (a client's own cancellation). Passed on, the
                # task would end as if stopped on purpose, and the worker would report nothing
                self.state = TaskState.FAILED
                raise UserCodeCancelled.of(exc) from exc
            self.state = TaskState.CANCELLED
            raise
        except SystemExit as exc:  # sys.exit() in user code run inline: fail this task, not the worker's loop
            self.state = TaskState.FAILED
            raise UserCodeExit.of(exc) from exc
        except BaseException:
            self.state = TaskState.FAILED
            raise
        finally:
            self.times.finish(time.monotonic())
            stop_ticks()
            if self._parked_tick is not None:
                self._parked_tick.cancel()  # its park may wait for a user call that will not return
            await self._close()

    def _end_outputs(self) -> None:
        for sub in self.subpartitions:
            sub.add_event(event("end"))
        # From here on a checkpoint records this task as at its end: no barrier follows "end" downstream.
        self.end_of_input = True
        if self.checkpoints is not None:
            self.checkpoints.on_end_of_input()

    async def _close(self) -> None:
        """The task's end: wait for a cancelled call still on its thread, stop its asynchronous operator, close
        its chain and source (user code: on a thread, so a close that blocks, a sink waiting for its broker,
        holds only this task), then end its user loop. All of it within `cancel_timeout_s` (twice that for a
        finished task: its sinks wait for their final commit, a KafkaSink up to 70 s); past it the task is
        stuck (`on_stuck`, once: the worker exits, as Flink's task cancellation watchdog does), and what is
        left is still closed as far as it can be. A timeout of 0 leaves a cancelled call behind at once and
        waits for the closes as long as they take."""
        limit = self.cancel_timeout_s * (2 if self.state is TaskState.FINISHED else 1)
        deadline = time.monotonic() + limit if limit > 0 else None

        def remaining() -> float | None:
            return None if deadline is None else max(0.0, deadline - time.monotonic())

        thread = self._thread
        if thread is not None:
            # a timeout of 0: a call in progress is left behind at once; an idle thread just ends
            wait_s = remaining() if deadline is not None else (0.0 if thread.running_since() is not None else None)
            if not await thread.stop(wait_s):
                self._stuck("in a call it was cancelled in")
        if self.checkpoints is not None:
            self.checkpoints.close()
        if self._async_op is not None:
            try:  # its function's own close() runs on the task's loop: bounded like the rest
                if not await _within(remaining(), self._on_chain_loop(self.chain.aclose_async())):
                    self._stuck("stopping its asynchronous operator")
            except asyncio.CancelledError:
                if not _raised_by_user_code():
                    raise
                # a close() cancelled under the function (its client's): passed on, a finished task would end
                # cancelled, which the worker takes for a stop on purpose and reports nothing
                log.warning("task %s: user code raised CancelledError while its asynchronous operator stopped",
                            self.task_id)
            except Exception as exc:
                log.warning("task %s: error while stopping asynchronous state: %s", self.task_id, exc)
        closer: TaskThread | None = None
        if self.isolation.closes_on_thread:
            # a thread of its own: the task's may still be in the cancelled call (the watchdog sees this one)
            try:
                closer = self._thread = TaskThread(task_thread_name(self.task_id), settings=self.isolation.settings)
            except RuntimeError as exc:  # no thread to be had (memory exhausted under a limit): close here,
                log.warning("task %s: closing on the worker's loop: %s", self.task_id, exc)  # not hide the cause
        if closer is not None:
            if await _within(remaining(), closer.call(self._close_user_code)):
                await closer.stop(remaining())
            else:
                self._stuck("closing")
        else:
            self._close_user_code()
        if self._user_loop is not None and not await self._user_loop.stop(remaining()):
            self._stuck("stopping its user loop")

    def _close_user_code(self) -> None:
        # a CancelledError here is user code's own (no task is cancelled on a thread): like any error
        try:
            self.chain.close()
        except (Exception, asyncio.CancelledError) as exc:  # closing must not hide the task's own outcome
            log.warning("task %s: error while closing: %s", self.task_id, exc)
        if self.source is not None:
            try:
                self.source.close()  # a source may hold a connection and a thread
            except (Exception, asyncio.CancelledError) as exc:
                log.warning("task %s: error while closing its source: %s", self.task_id, exc)

    def _stuck(self, doing: str) -> None:
        if self._stuck_reported:
            return
        self._stuck_reported = True
        log.error("task %s: user code did not return in time while %s", self.task_id, doing)
        self.on_stuck(self)

    def _on_flush_tick(self) -> None:
        # bounds latency: a partly filled buffer waits at most flush_timeout_s (on the worker's timer for that
        # period, runtime/execution/ticks.py)
        if self._user_loop is not None:
            # its chain writes the builders whenever its loop runs: the tick parks it (one at a time; a tick that
            # finds the last one still waiting, behind a long user call, is the same tick)
            if self._parked_tick is None or self._parked_tick.done():
                self._parked_tick = asyncio.ensure_future(self._tick_parked())
        elif self._on_thread:
            self._tick_due = True  # the thread writes the builders now: the tick runs when its call returns
        else:
            self._tick()

    async def _tick_parked(self) -> None:
        try:
            await self.exclusive(self._tick)
        except Exception:  # as the shared timer does for a tick that fails: the others go on
            log.exception("task %s: a periodic tick failed", self.task_id)

    def _tick(self) -> None:
        """The periodic work on the task's outputs and timers (never while a call is on the task's thread)."""
        for gate in self._output_gates:
            for sub in gate.take_due():  # only those holding data or a new size (OutputGate.due)
                if sub.wanted_capacity:  # the worker's buffer sizing found its builder busy (InflightBound.adjust)
                    resize(sub, sub.wanted_capacity)
                    sub.wanted_capacity = 0
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

    def running_call(self) -> RunningCall | None:
        """The call on the task's thread now, if any, else its user loop's progress (read by the worker's
        watchdog thread: a loop that has not ticked for long is stuck in a user call)."""
        thread = self._thread
        started = thread.running_since() if thread is not None else None
        if thread is not None and started is not None:
            return RunningCall(self.task_id, thread.calls, started, thread.ident)
        user = self._user_loop
        since = user.running_since() if user is not None else None
        if user is not None and since is not None:  # its own numbering: one report per stall (no ticks meanwhile)
            return RunningCall(self.task_id, -1 - user.ticks, since, user.ident)
        return None

    async def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """`fn(*args)`: on the task's thread when the task is isolated, on its loop when its chain lives there,
        else here."""
        if self.isolation.isolated:
            return await self._offload(fn, *args)
        user = self._user_loop
        if user is not None:
            return await self._run_on_user_loop(user, fn, args)
        return fn(*args)

    async def between_runs(self, fn: Callable[..., Any], *args: Any) -> Any:
        """`fn(*args)`, chain work between runs: here (an isolated task's thread is idle then), or on the task's
        loop when its chain lives there."""
        user = self._user_loop
        if user is not None:
            return await self._run_on_user_loop(user, fn, args)
        return fn(*args)

    async def _run_on_user_loop(self, user: UserLoop, fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        """A run on the task's loop, whose buffers are queued as soon as it returns, as a run on the task's thread's
        are. Left to the hand-off posted to this loop, they could wait for ever: a run the loop waited for blocked
        returns without this loop turning, and a driver whose next run ends at once for a turn (`would_block`:
        buffers cut, not yet queued) hands it over at once again, never letting the posted hand-off in (a worker
        once missed its heartbeats so)."""
        try:
            return await user.call(fn, *args)
        finally:
            hand_off = self._hand_off
            assert hand_off is not None
            hand_off.deliver()

    async def exclusive(self, fn: Callable[..., Any], *args: Any) -> Any:
        """`fn(*args)` here, where it may touch the chain, its operators and the outputs' builders: between runs
        that is always so, except for a chain on its own loop, which emits whenever a record finishes there; that
        loop is parked meanwhile (UserLoop.exclusive), and the buffers it cut before are queued first, in order."""
        user = self._user_loop
        if user is None:
            result = fn(*args)
            if self._user_calls:  # deferred only by a task with a thread of its own (not inline)
                await self._make_user_calls(self._deferred_call)
            return result
        async with user.parked() as park:
            result = self._with_outputs(fn, args)
            if self._user_calls:  # still parked: no record of the chain runs before they return
                await self._make_user_calls(park.call)
            return result

    def defer_user_call(self, fn: Callable[..., Any], args: tuple[Any, ...], then: Callable[[Any], None]) -> None:
        """From the task's mail (a checkpoint's snapshot or completion): `then(fn(*args))`, with `fn` user code (the
        sinks' pre-commit or commit) run where the task's records run, awaited before the next message is served
        (`exclusive`), so that one that blocks holds up only this task, not the worker's loop, its heartbeats and
        its other tasks (Flink runs snapshotState and notifyCheckpointComplete on the task's thread). The task's
        coroutine is suspended meanwhile, so no record runs between the mail and the call: a snapshot still sees
        the state after whole chunks, and the calls are made in the order they were asked for. Inline: at once."""
        if not self.isolation.closes_on_thread:
            then(fn(*args))
            return
        self._user_calls.append((fn, args, then))

    async def _make_user_calls(self, call: Callable[..., Any]) -> None:
        calls = self._user_calls
        while calls:
            fn, args, then = calls.popleft()
            then(await call(fn, *args))

    async def _deferred_call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """A deferred user call on the task's thread: awaited, and no run (runtime/execution/handover.py)."""
        return await self._offload(fn, *args, run=False)

    def _with_outputs(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        hand_off = self._hand_off
        assert hand_off is not None
        hand_off.deliver()
        subs = self.subpartitions
        for sub in subs:
            sub.deferred = None  # what this cuts (a barrier's flush) goes out at once, ahead of its event
        try:
            return fn(*args)
        finally:
            for sub in subs:
                sub.deferred = hand_off

    async def _on_chain_loop(self, coroutine: Any) -> Any:
        """Await one of the asynchronous operator's coroutines (open, finish, aclose) where it lives."""
        user = self._user_loop
        if user is None:
            return await coroutine
        return await user.run(coroutine)

    def _start_user_loop(self) -> None:
        """The task's own loop, on which its whole chain runs, the asynchronous operator included: its records,
        state round trips and coroutines never cross threads; the worker's loop hands it runs and takes the
        buffers it cuts (HandOff)."""
        # named as the task's thread: a profile counts it as the task's
        user = self._user_loop = UserLoop(task_thread_name(self.task_id), settings=self.isolation.settings)
        assert self._home is not None and self._async_op is not None
        hand_off = self._hand_off = HandOff(self._home)
        hand_off.on_delivered = self._after_hand_off
        for sub in self.subpartitions:
            sub.deferred = hand_off
        op = self._async_op
        op.run_on(user.loop)
        user.on_failure = self._user_code_exited
        # its records in flight wait on the loop (state round trips, the function's I/O): a run is awaited then
        user.coroutines_waiting = lambda: op.in_flight > 0

    def _user_code_exited(self, error: BaseException) -> None:
        """A sys.exit() escaped user code on the task's loop (a task the user's function started): the loop
        failed the calls waiting then; the task fails too, also when none was (waiting for admission, quiesce)."""
        self._loop_failure = error

        def fail() -> None:
            raise error

        self.post(Mail(fail, "user code exited on the task's loop"))

    def _after_hand_off(self) -> None:
        # would_block is the loop's estimate of queued + not yet handed over: now all are queued (blocked says)
        self.output.would_block = False

    def _wake_from_chain(self) -> None:
        """The asynchronous operator's wake-up: from the task's own loop when the chain lives there."""
        if self._user_loop is None:
            self.wake()
            return
        if not self._wake_posted:
            self._wake_posted = True
            home = self._home
            assert home is not None
            try:
                home.call_soon_threadsafe(self._woken)
            except RuntimeError:  # the worker's loop closed: nobody waits
                pass

    def _woken(self) -> None:
        self._wake_posted = False  # before waking: a change from now on posts again
        self._wakeup.set()

    async def _offload(self, fn: Callable[..., Any], *args: Any, run: bool = True) -> Any:
        """Run `fn(*args)` (chain work; `run` False: a deferred user call) on the task's thread and wait for it.
        The buffers it cuts are queued for sending when it returns, in order, before anything else of the task
        runs."""
        thread = self._thread
        if thread is None:
            thread = self._thread = TaskThread(task_thread_name(self.task_id), settings=self.isolation.settings)
        deferred = self._deferred
        subs = self.subpartitions
        for sub in subs:
            sub.deferred = deferred
        self._on_thread = True
        try:
            result = await thread.call(fn, *args, run=run)
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
            sub.deferred_n = sub.handed_n = 0
        self.output.would_block = False
        self._on_thread = False
        deferred = self._deferred
        if deferred:
            for sub, buffer in deferred:
                sub.hand_over(buffer)
            deferred.clear()
        if self._tick_due:
            self._tick_due = False
            self._tick()

    async def wait(self, timeout_s: float | None = None) -> None:
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

    async def wait_idle(self, timeout_s: float | None = None) -> None:
        await self._wait_as(IDLE_TIME, timeout_s)

    async def _wait_as(self, kind: str, timeout_s: float | None = None) -> None:
        """`wait`, counted as `kind` (idle or backpressured) while it lasts (runtime/execution/time_accounting.py)."""
        times = self.times
        times.begin_wait(kind, time.monotonic())
        try:
            await self.wait(timeout_s)
        finally:
            times.end_wait(time.monotonic())

    async def serve_mail(self) -> None:
        """Serve the mailbox; with a drain-mode asynchronous operator, first wait until nothing is in flight
        when a message may take a snapshot (a barrier, a checkpoint trigger or deadline): Flink's drain."""
        op = self._async_op
        while True:
            if op is not None and op.drain and not op.quiet() and any(_may_snapshot(m) for m in self.mailbox):
                await self.quiesce()
            served = await self.exclusive(self._serve_mailbox)
            await self._timers_on_thread()
            if served:
                return

    async def quiesce(self) -> None:
        """Wait until the asynchronous operator has nothing queued or in flight (drain checkpoints). The
        mailbox waits meanwhile: a snapshot must not run before this ends."""
        op = self._async_op
        assert op is not None
        while not op.quiet():
            op.raise_if_failed()
            if self._loop_failure is not None:  # the mailbox, which would raise it, waits for this
                raise self._loop_failure
            await self.wait(self._recheck_s)
        op.raise_if_failed()

    async def _finish_async(self) -> None:
        """End of input: let the asynchronous operator admit what is queued, then wait for its records."""
        op = self._async_op
        if op is None:
            return
        while op.backlog:
            await self._await_admission()
        await self._on_chain_loop(self.chain.finish_async())

    async def _await_admission(self) -> None:
        op = self._async_op
        assert op is not None
        if self.mailbox:
            await self.serve_mail()
        if op.backlog:
            op.raise_if_failed()
            t0 = time.monotonic()
            await self.wait(self._recheck_s)
            op.blocked_s += time.monotonic() - t0

    @property
    def _recheck_s(self) -> float | None:
        # a chain on its own loop changes the operator's state from another thread: its wake-up is posted, and
        # waits recheck now and then besides, so none can be lost for good
        return None if self._user_loop is None else 0.05

    def _async_failed(self, error: BaseException) -> None:
        def fail() -> None:
            raise error

        mail = Mail(fail, "asynchronous state failed")
        if self._user_loop is None:
            self.post(mail)
            return
        home = self._home
        assert home is not None
        try:
            home.call_soon_threadsafe(self.post, mail)
        except RuntimeError:  # the worker's loop closed: nobody waits
            pass

    def _serve_mailbox(self) -> bool:
        """Serve the mailbox; False when it stopped before a message that may snapshot while a drain-mode
        asynchronous operator has records in flight (it came while a chain on its own loop was being parked,
        after `serve_mail` found none): it waits for `quiesce`; False too after a message that asked for user
        calls (`defer_user_call`): they are made before the next one."""
        op = self._async_op
        while self.mailbox:
            message = self.mailbox[0]
            if op is not None and op.drain and _may_snapshot(message) and not op.quiet():
                return False
            self.mailbox.popleft()
            if isinstance(message, Mail):
                message.run()
            elif isinstance(message, PriorityEvent):
                self._on_priority_event(message.channel_id, message.seq, message.event)
            elif isinstance(message, InjectProbe):
                overtaken = self._forward_priority(event("probe", id=message.probe_id))
                self.on_probe_complete(self, message.probe_id, overtaken, 0)
            elif isinstance(message, Cancel):
                raise TaskCancelled(self.task_id)
            if self._user_calls:  # made before the next message (`exclusive`): serve_mail comes back for the rest
                return False
        return True

    def _forward_priority(self, ev: Event) -> int:
        """Send `ev` ahead of all queued data on every output; returns how many buffers it overtook."""
        return sum(len(sub.add_event(ev, priority=True)) for sub in self.subpartitions)

    # -- what a snapshot reads ------------------------------------------------------------

    def snapshot_keyed_state(self) -> dict[int, dict[str, dict[Any, Any]]]:
        """The synchronous part of a snapshot: copies of the keyed state tables (values are immutable by
        contract). On a state backend only the tables kept in memory (timers) are copied: the backend snapshots
        the rest (Chain.begin_state_snapshot). The sinks' pre-commit is user code: `defer_user_call`."""
        return {node: {name: table.copy() for name, table in tables.items() if isinstance(table, dict)}
                for node, tables in self.chain.keyed_state.items()}

    def source_position(self) -> Any:
        """Where a restored source resumes: the position before the current batch, and how much of it was emitted."""
        return self.driver.position() if self.driver is not None else None

    def unprocessed_bytes(self) -> dict[int, bytes]:
        """Per input channel, the bytes fed to its unpacker and not yet processed (they start at a record)."""
        return self.inputs.unprocessed_bytes() if self.inputs is not None else {}

    def time_state(self) -> dict[str, Any] | None:
        """What a snapshot stores of event time (None without it); restored before in-flight data is replayed."""
        return self.time.snapshot() if self.time is not None else None

    def current_watermark(self) -> int | None:
        return self.time.current_watermark() if self.time is not None else None

    # -- restore ----------------------------------------------------------------------

    def _restore_operator_state(self) -> None:
        restore = self.restore
        if restore is None:
            return
        self.chain.restore_state(restore.keyed or {}, restore.sinks)
        self.chain.restore_lists(restore.lists or {})
        self.chain.restore_async(restore.async_inflight)  # its replay input goes first, before channel state
        if self.driver is not None and restore.source:
            self.driver.restore(restore.source)

    def _restore_outputs(self) -> None:
        """Re-send restored output channel state before any new output."""
        if self.restore is None or not self.restore.outputs:
            return
        for sub in self.subpartitions:
            stream = self.restore.outputs.get(sub.key)
            if stream:
                sub.append_records(stream)
                sub.flush()

    # -- the task's turns (runtime/execution/turns.py) -----------------------------------------

    def turn_due(self) -> bool:
        """Whether the next chunk must wait for a turn: mail, a blocked output (or one that the buffers the
        task's thread cut will block once queued), input an asynchronous operator has not admitted."""
        op = self._async_op
        output = self.output
        return bool(self.mailbox or output.blocked or output.would_block or (op is not None and op.backlog))

    async def between_records(self) -> None:
        """Serve the mailbox; wait while an asynchronous operator has input it has not admitted, and while the
        output is blocked (counted as backpressure)."""
        op = self._async_op
        while True:
            if self.mailbox:
                await self.serve_mail()
            if op is not None and op.backlog:
                await self._await_admission()
                continue
            if not self.output.blocked:
                return
            await self._wait_as(BACKPRESSURED_TIME)

    async def _on_inband_event(self, channel_id: int, ev: Event) -> None:
        kind = ev.body.get("t")
        op = self._async_op
        if op is not None and op.drain and kind in ("barrier", "end"):
            # drain: the records before an aligned barrier finish first; so do those before a channel's end,
            # which completes an alignment waiting only for that channel
            await self.quiesce()
        await self.exclusive(self._inband_event, channel_id, kind, ev)

    def _inband_event(self, channel_id: int, kind: Any, ev: Event) -> None:
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

    def _fire_processing_timers(self) -> None:
        """Mail: fire due processing-time timers, a chunk per turn of the mailbox (an isolated task: on its
        thread, right after this turn of the mailbox, see `_timers_on_thread`)."""
        if self.isolation.isolated or self._user_loop is not None:
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
            self._after_processing_timers(await self.call(timers.fire_processing, current_time_ms(), TIMER_CHUNK))

    async def _wait_final_checkpoint(self) -> None:
        """Stay (serving the mailbox) until a checkpoint taken after the end of input has completed and the
        sinks have published it: what the task did last is then in a completed checkpoint, so a failure from
        now on restores it as finished instead of running it again (exactly once at the end of a bounded job)."""
        assert self.checkpoints is not None
        while not self.checkpoints.final_committed():
            if self.mailbox:
                await self.serve_mail()
                continue
            await self.wait_idle()

    async def _wait_drained(self, timeout_s: float = 600.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not all(s.drained() for s in self.subpartitions):
            if time.monotonic() > deadline:
                raise TimeoutError(f"task {self.task_id}: outputs not drained within {timeout_s}s")
            if self.mailbox:
                await self.serve_mail()
            await self.wait(0.05)


async def _within(timeout_s: float | None, awaitable: Any) -> bool:
    """Await `awaitable` for up to `timeout_s` (None: as long as it takes); False if it had not finished by then
    (it is left running: user code cannot be stopped)."""
    future = asyncio.ensure_future(awaitable)
    try:
        async with asyncio.timeout(timeout_s):
            await asyncio.shield(future)
    except TimeoutError:
        return False
    return True


def _raised_by_user_code() -> bool:
    """Whether the CancelledError being handled came from user code: nobody cancelled the task running now."""
    current = asyncio.current_task()
    return current is not None and not current.cancelling()


def _left_behind(task: Task) -> None:
    log.warning("task %s: its thread is still in a user call %.0f s after the task stopped; it is left behind",
                task.task_id, task.cancel_timeout_s)


def _may_snapshot(message: Message) -> bool:
    """Whether serving `message` may take a checkpoint's snapshot (see Task._serve_mail)."""
    if isinstance(message, PriorityEvent):
        return message.event.body.get("t") == "barrier"
    return isinstance(message, Mail) and message.may_snapshot
