"""Task isolation: a task's user code on a thread of its own, so no user call can stall the worker.

All tasks of a worker share one asyncio event loop, which also runs the worker's data links, credit, RPC,
heartbeats and checkpoint barriers. A user function that blocks (a synchronous client, `time.sleep`, a
slow sink, a call that never returns) would stop all of them. So every task runs its records through its
chain on its `TaskThread` (Flink's thread per task) and keeps its coroutine, mailbox, input gate and
checkpointing on the loop. It hands the thread one *run* at a time (runtime/execution/turns.py: chunks of
records until mail is waiting, the output is full, the input is drained, or about 2 ms have passed) and
awaits the result:

- the task's coroutine is suspended for the run, so nothing else of the task runs meanwhile; the mailbox
  (barriers, checkpoint triggers, snapshots) is served between runs, exactly as between chunks inline, so a
  snapshot still sees the state after a whole chunk and the reader position before the next;
- what the chain writes during a run goes to the subpartitions' builders (touched by that run only) and the
  buffers it cuts wait in a list (`Subpartition.deferred`) until the run returns: credit, the output queues,
  the links and the backpressure counters are touched on the loop only.

The hand-off (a thread wake-up, the GIL, a loop wake-up) is paid once per run, not per chunk: the per-chunk
hand-off of the first version cost half the keyed count's throughput. A run that holds the GIL all along (the
usual run of records) is waited for with the loop blocked, up to the worker's `sync_wait_s`, which spares the
loop's wake-up (runtime/execution/handover.py, shared with the task loop's runs; docs/BENCHMARKS.md, User code
off the event loop). Modes (SLUICE_TASK_ISOLATION):

- `thread` (the default; `auto` is the same): every task on its thread; one whose chain has an asynchronous
  operator (async state, async_map) on an event loop on a thread of its own (runtime/execution/user_loop.py),
  since its operator awaits: the whole chain lives there, the operator, its state round trips and the user
  coroutines (the async_map function, the AsyncKeyedProcessFunction's open, process and on_timer) included, so
  nothing crosses threads per record or per state request. Its runs are handed over as to a thread; it emits
  as records finish, so its cut buffers are handed over as they come (`HandOff`), and the loop is parked
  while the task's mailbox, snapshots or flushes touch the chain (UserLoop.exclusive). Every
  task's `close()` calls at its end (the chain's functions and sinks, the source) run on its thread too, within
  the worker's task cancel timeout (past it the worker fails, as for a cancelled call that never returns);
- `inline`: every task on the loop (the old behaviour: a user call that blocks stops the worker).
"""

from __future__ import annotations

import asyncio
import os
import queue
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from runtime.execution.handover import SYNC_WAIT_S, HandedCall

MODES = ("thread", "auto", "inline")
MODE_ENV = "SLUICE_TASK_ISOLATION"  # the worker's setting for its tasks (README, The job API)
# a task's thread is named after its task, so a profile of the worker (runtime/worker/profiling.py) tells
# whose stacks it sampled
TASK_THREAD_PREFIX = "sluice-task "


def task_thread_name(task_id: str) -> str:
    return f"{TASK_THREAD_PREFIX}{task_id}"


def mode_from_env(environ: Mapping[str, str] = os.environ) -> str:
    mode = environ.get(MODE_ENV, "thread").strip().lower() or "thread"
    if mode not in MODES:
        raise ValueError(f"{MODE_ENV} must be one of {', '.join(MODES)}, got {mode!r}")
    return mode


SYNC_WAIT_ENV = "SLUICE_SYNC_WAIT_S"  # the worker's blocked wait for a run (README, The job API)
MAX_SYNC_WAIT_S = 0.1  # the worker's loop holds heartbeats, RPC and every other task while it waits blocked


@dataclass(frozen=True, slots=True)
class IsolationSettings:
    """Where a worker's tasks run their user code, and how long its event loop waits, blocked, for a run that
    holds the GIL (runtime/execution/handover.py; 0: every run awaited). Built once at the worker's entry point
    (`from_env`: the variables are the documented way to set them) and passed down to every task it deploys."""

    mode: str = "thread"
    sync_wait_s: float = SYNC_WAIT_S

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"task isolation must be one of {', '.join(MODES)}, got {self.mode!r}")
        if not 0.0 <= self.sync_wait_s <= MAX_SYNC_WAIT_S:  # also refuses NaN
            raise ValueError(f"{SYNC_WAIT_ENV} must be between 0 and {MAX_SYNC_WAIT_S} seconds, got {self.sync_wait_s}")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> IsolationSettings:
        """The worker's settings from SLUICE_TASK_ISOLATION and SLUICE_SYNC_WAIT_S (unset: the defaults); a bad
        value is refused with one line naming the variable."""
        raw = environ.get(SYNC_WAIT_ENV, "").strip()
        try:
            sync_wait_s = float(raw) if raw else SYNC_WAIT_S
        except ValueError:
            raise ValueError(f"{SYNC_WAIT_ENV} must be a number of seconds, got {raw!r}") from None
        return cls(mode_from_env(environ), sync_wait_s)


class HandOff(list):  # type: ignore[type-arg]  # of (Subpartition, Buffer)
    """The buffers a task's loop thread cuts (as `Subpartition.deferred`), handed over on the worker's loop.

    A task with an asynchronous operator runs its chain on its own loop, and emits whenever a record finishes
    there, not only within a run the worker's loop awaits: so the first buffer cut after a hand-over posts one
    to the worker's loop (`deliver`), which takes every buffer cut until then, in order; the worker's loop also
    delivers as each run it handed over returns (Task.call), not relying on the post. The loop thread only
    appends and the worker's loop only takes from the front (each a single step under the GIL)."""

    def __init__(self, home: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self._home = home
        self._posted = False
        self.on_delivered: Callable[[], None] = lambda: None

    def append(self, item: Any) -> None:  # on the task's loop
        super().append(item)
        if not self._posted:
            self._posted = True
            try:
                self._home.call_soon_threadsafe(self.deliver)
            except RuntimeError:  # the worker is stopping: nothing is sent any more
                pass

    def deliver(self) -> None:
        """On the worker's loop: queue the buffers cut so far for sending, in order."""
        self._posted = False  # before taking: a buffer cut from now on posts again
        n = len(self)
        if not n:
            return
        taken = self[:n]
        del self[:n]
        for sub, buffer in taken:
            sub.hand_over(buffer)
            sub.handed_n += 1
        self.on_delivered()


class IsolationPolicy:
    """Where a task's user code runs (fixed when the task is built, see the module docstring)."""

    __slots__ = ("settings", "isolated", "user_loop", "closes_on_thread")

    def __init__(self, settings: IsolationSettings, *, asynchronous: bool) -> None:
        self.settings = settings  # the worker's: its task thread or loop waits for runs as they say
        mode = settings.mode
        # the runs of records on the task's thread
        self.isolated = mode != "inline" and not asynchronous
        # with an asynchronous operator: the runs, the operator and its coroutines on an event loop on a thread of
        # the task's own (runtime/execution/user_loop.py)
        self.user_loop = mode != "inline" and asynchronous
        # the chain's and the source's close() at the task's end on the task's thread, whatever its operators
        self.closes_on_thread = mode != "inline"


class TaskThread:
    """A thread that runs one task's calls, one at a time, in the order they are handed over.

    `call` is awaited on the event loop. The task awaits every call before it hands over the next, so at most
    one is in the queue: the queue only carries it across the thread boundary. How the caller waits depends on
    what the task's runs did lately (runtime/execution/handover.py): a run that held the GIL nearly all its
    wall time (records through Python: the usual run) has its successor waited for with the loop blocked, up to
    the worker's `sync_wait_s`, which spares the loop's wake-up, a tenth or more of a keyed count's CPU per record
    (docs/BENCHMARKS.md, User code off the event loop); a run that waited (I/O, a sleep, a lock) has its
    successor awaited, so the loop and other tasks run beside it. A user call the task's mail deferred (`run`
    False: a sink's commit) is awaited and decides nothing for the next run.
    """

    def __init__(self, name: str, *, settings: IsolationSettings = IsolationSettings()) -> None:
        self.name = name
        self._calls: queue.SimpleQueue[HandedCall | None] = queue.SimpleQueue()  # None ends the thread
        self.calls = 0  # calls made: with `call_started`, tells one call from the next
        self.call_started: float | None = None
        self.ident = 0  # the thread's, once it runs (the watchdog reads its stack by it)
        self.held_gil = True  # whether the last run held the GIL (see the class docstring)
        self.sync_wait_s = settings.sync_wait_s
        self.waited_blocked = 0  # calls the loop waited for blocked, and got (a figure for tests and benchmarks)
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    async def call(self, fn: Callable[..., Any], *args: Any, run: bool = True) -> Any:
        """`fn(*args)` on the thread: a run of the task's chain, or (`run` False) a user call its mail deferred."""
        call = HandedCall(fn, args, asyncio.get_running_loop(), run=run)
        self._calls.put(call)
        try:
            return await call.wait(self.sync_wait_s if run and self.held_gil else 0.0)
        finally:
            if call.blocked:
                self.waited_blocked += 1

    def _run(self) -> None:
        self.ident = threading.get_ident()
        calls = self._calls
        monotonic = time.monotonic
        while (call := calls.get()) is not None:
            self.call_started = monotonic()
            call.execute(self)

    def ran(self) -> None:
        """On the thread, after a call, before its outcome goes back (runtime/execution/handover.py)."""
        self.call_started = None
        self.calls += 1

    def running_since(self) -> float | None:
        """When the call in progress began (time.monotonic()), None between calls; read from any thread."""
        return self.call_started

    async def stop(self, timeout_s: float | None = 10.0) -> bool:
        """Let the running call finish (a cancelled task's call may still run), then end the thread. False if
        the call did not finish within `timeout_s` (None: no limit; user code stuck: the daemon thread is left
        behind)."""
        stopping = HandedCall(_last_call, (), asyncio.get_running_loop(), run=False)
        self._calls.put(stopping)
        self._calls.put(None)
        try:
            async with asyncio.timeout(timeout_s):
                await stopping.wait(0.0)
        except TimeoutError:
            return False
        return True


def _last_call() -> None:
    """What `TaskThread.stop` hands over last: answered once every call before it has returned."""
