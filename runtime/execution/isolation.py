"""Task isolation: a task's record processing on a thread of its own, so blocking user code cannot stall the loop.

All tasks of a worker share one asyncio event loop, which also runs the worker's data links, credit, RPC,
heartbeats and checkpoint barriers. A user function that blocks (a synchronous client, `time.sleep`, a slow
sink) would stop all of them. An isolated task keeps its coroutine, mailbox, input gate and checkpointing on
the loop, and hands each chunk of records (and each batch of timers) to its `TaskThread`, awaiting the result:

- the task's coroutine is suspended for the call, so nothing else of the task runs meanwhile; the mailbox
  (barriers, checkpoint triggers, snapshots) is served between calls, exactly as between chunks inline, so a
  snapshot still sees the state after a whole chunk and the reader position before the next;
- what the chain writes during a call goes to the subpartitions' builders (touched by that call only) and the
  buffers it cuts wait in a list (`Subpartition.deferred`) until the call returns: credit, the output queues,
  the links and the backpressure counters are touched on the loop only.

Which tasks are isolated is decided per task (`IsolationPolicy`), because a thread hand-off costs tens of
microseconds and the GIL hand-over, which a chunk of cheap records (about 1 µs each) would pay on every call:

- `inline`: never; `thread`: always (Flink's model: every task on its thread);
- `auto` (the default): a chain with an asynchronous operator (async state, async_map: it needs the loop) runs
  inline; a chain with an operator that declares itself blocking (a sink with `delay_per_record_s`, or any
  function or sink with `blocking = True`) on its thread from the start; any other chain starts inline and
  moves to its thread once SLOW_CALLS calls of one record each in a row took more than BLOCKING_CALL_S (the
  chunk size shrinks to one record only when records are slow, so a cheap chain preempted by the OS does not
  get there), and back after QUIET_S without such a call.
"""

from __future__ import annotations

import asyncio
import os
import queue
import threading
from collections.abc import Callable
from typing import Any

MODES = ("auto", "thread", "inline")
MODE_ENV = "SLUICE_TASK_ISOLATION"  # the worker's setting for its tasks (README, Tuning)
BLOCKING_CALL_S = 0.001  # one record taking longer than this blocks the loop noticeably
SLOW_CALLS = 3  # consecutive one-record calls over BLOCKING_CALL_S that move an `auto` task to its thread
QUIET_S = 2.0  # without a slow one-record call for this long, an adaptively isolated task goes back inline


def mode_from_env(environ: dict[str, str] | os._Environ[str] = os.environ) -> str:
    mode = environ.get(MODE_ENV, "auto").strip().lower() or "auto"
    if mode not in MODES:
        raise ValueError(f"{MODE_ENV} must be one of {', '.join(MODES)}, got {mode!r}")
    return mode


class IsolationPolicy:
    """Whether a task's next call runs on its thread (pure: fed with call durations, see the module docstring)."""

    __slots__ = ("isolated", "adaptive", "switches", "_slow_calls", "_last_slow")

    def __init__(self, mode: str, *, declared_blocking: bool, asynchronous: bool) -> None:
        if mode not in MODES:
            raise ValueError(f"task isolation must be one of {', '.join(MODES)}, got {mode!r}")
        if asynchronous:  # its operator awaits on the loop
            self.isolated, self.adaptive = False, False
        elif mode == "auto":
            self.isolated, self.adaptive = declared_blocking, not declared_blocking
        else:
            self.isolated, self.adaptive = mode == "thread", False
        self.switches = 0  # moves between inline and the thread (a metric, and for tests)
        self._slow_calls = 0
        self._last_slow = 0.0

    def observe(self, records: int, took_s: float, now: float) -> bool:
        """A call of `records` records took `took_s`, ending at `now`: whether the next call is isolated.
        An inline task may skip calls of more than one record (they cannot make it isolated)."""
        if not self.adaptive:
            return self.isolated
        if records == 1 and took_s > BLOCKING_CALL_S:
            self._slow_calls += 1
            self._last_slow = now
            if not self.isolated and self._slow_calls >= SLOW_CALLS:
                self.isolated = True
                self.switches += 1
        else:
            if records == 1:
                self._slow_calls = 0
            if self.isolated and now - self._last_slow > QUIET_S:
                self.isolated = False
                self._slow_calls = 0
                self.switches += 1
        return self.isolated


_STOP = object()


class TaskThread:
    """A thread that runs one task's calls, one at a time, in the order they are handed over.

    `call` is awaited on the event loop; the result (or the exception) comes back through the loop's
    thread-safe callback, so the awaiting coroutine resumes on the loop. The task awaits every call before it
    hands over the next, so at most one is in the queue: the queue only carries it across the thread boundary.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._calls: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()
        self.calls = 0

    async def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._calls.put((fn, args, loop, future))
        return await future

    def _run(self) -> None:
        calls = self._calls
        while True:
            fn, args, loop, future = calls.get()
            if fn is _STOP:
                self._resolve(loop, future, None, None)
                return
            try:
                result = fn(*args)
            except BaseException as exc:  # handed to the awaiting task, which fails as it would inline
                self._resolve(loop, future, None, exc)
            else:
                self._resolve(loop, future, result, None)
            self.calls += 1

    def _resolve(self, loop: asyncio.AbstractEventLoop, future: asyncio.Future[Any], result: Any,
                 error: BaseException | None) -> None:
        def settle() -> None:
            if future.cancelled():
                return
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(result)

        try:
            loop.call_soon_threadsafe(settle)
        except RuntimeError:  # the loop closed while the call ran (the worker is stopping): nobody waits
            pass

    async def stop(self, timeout_s: float = 10.0) -> bool:
        """Let the running call finish (a cancelled task's call may still run), then end the thread. False if
        the call did not finish within `timeout_s` (user code stuck: the daemon thread is left behind)."""
        loop = asyncio.get_running_loop()
        stopped: asyncio.Future[Any] = loop.create_future()
        self._calls.put((_STOP, (), loop, stopped))
        try:
            async with asyncio.timeout(timeout_s):
                await stopped
        except TimeoutError:
            return False
        return True
