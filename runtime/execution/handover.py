"""One call handed from the worker's event loop to the thread that runs a task's user code, and its outcome
handed back: waited for with the loop blocked, or awaited.

Shared by the task's thread (runtime/execution/isolation.py TaskThread) and the task's own event loop
(runtime/execution/user_loop.py UserLoop.call). A call that held the GIL nearly all its wall time (a run of
records through Python) left the worker's loop nothing to run beside it, so its successor is waited for
blocked, up to `sync_wait_s`: the result comes straight from the other thread (a lock handed back) instead of
the loop's thread-safe callback, an asyncio future and an epoll wake-up. Past `sync_wait_s` (a call that
blocks, or a GIL shared with other busy threads) the loop stops waiting and the call's outcome comes back
through the loop: no user call holds the loop longer than that. A call that waited (I/O, a sleep, a lock: the
GIL released) has its successor awaited, so the loop and other tasks run beside it.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from runtime.execution.user_code import UserCodeExit

# How long the event loop waits, blocked, for a call of a task whose calls hold the GIL, by default: a run lasts
# about 2 ms (runtime/execution/turns.py YIELD_AFTER_S). The worker's setting is IsolationSettings.sync_wait_s.
SYNC_WAIT_S = 0.005
# A call holding the GIL for at least this share of its wall time leaves nothing for the loop to do meanwhile
CPU_BOUND_SHARE = 0.7
SHORT_CALL_S = 0.0002  # a call this short is waited for, whatever it did


def held_the_gil(wall_s: float, cpu_s: float) -> bool:
    """Whether a call that took `wall_s` and its thread's `cpu_s` left the loop nothing to run beside it."""
    return wall_s < SHORT_CALL_S or cpu_s >= CPU_BOUND_SHARE * wall_s


class Runner(Protocol):
    """What runs the calls (a TaskThread, a UserLoop)."""

    held_gil: bool  # whether its last run held the GIL, which decides how the next run is waited for

    def ran(self) -> None:
        """On the runner's thread, after each call and before its outcome goes back (so before the caller can hand
        over the next)."""


class HandedCall:
    """One call: run by `execute` on the runner's thread, its outcome taken by `wait` on the caller's loop.
    Which way the outcome goes back (the lock, or a future settled through the loop) is decided under `guard`
    by whichever side comes second: the loop giving up its blocked wait, or the runner finishing.

    `run` False: not a run of the chain but a user call a task's mail deferred (Task.defer_user_call: a sink's
    pre-commit or commit), which its caller awaits; how it used the GIL says nothing of the next run, so it leaves
    the runner's `held_gil` alone."""

    __slots__ = ("fn", "args", "loop", "run", "future", "done", "guard", "finished", "result", "error", "blocked")

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...], loop: asyncio.AbstractEventLoop, *,
                 run: bool = True) -> None:
        self.fn, self.args, self.loop, self.run = fn, args, loop, run
        self.future: asyncio.Future[Any] | None = None
        self.done = threading.Lock()  # held until the runner finishes a call the loop waits for, blocked
        self.done.acquire()
        self.guard = threading.Lock()
        self.finished = False
        self.result: Any = None
        self.error: BaseException | None = None
        self.blocked = False  # the loop got the outcome in its blocked wait

    # -- on the runner's thread -----------------------------------------------------------------------

    def execute(self, runner: Runner) -> None:
        """Run the call, tell `runner` whether a run held the GIL, and hand its outcome back. sys.exit() in user
        code fails the call (its task), not the thread."""
        started = time.monotonic()
        cpu_started = time.thread_time()
        try:
            self.result = self.fn(*self.args)
        except SystemExit as exc:
            self.error = UserCodeExit.of(exc)
        except BaseException as exc:  # handed to the awaiting task, which fails as it would inline
            self.error = exc
        if self.run:
            runner.held_gil = held_the_gil(time.monotonic() - started, time.thread_time() - cpu_started)
        runner.ran()
        self.answer()

    def answer(self) -> None:
        """Hand the outcome back (on the runner's thread): through the lock the loop waits on, blocked, or, once it
        gave up on that, through its future."""
        with self.guard:
            self.finished = True
            future = self.future
        if future is None:
            self.done.release()
        else:
            settle_soon(self.loop, future, self.result, self.error)
            self.result = self.error = None

    def abandoned(self) -> bool:
        """Whether the caller gave up on the call before it started (read across threads: at worst it runs)."""
        future = self.future
        return future is not None and future.cancelled()

    # -- on the caller's loop -----------------------------------------------------------------------------

    async def wait(self, blocked_s: float, pending: set[asyncio.Future[Any]] | None = None) -> Any:
        """The call's outcome: waited for blocked up to `blocked_s` (0: not at all), else awaited; a future made
        for it goes into `pending` meanwhile (so that its runner can fail it when it stops)."""
        if blocked_s > 0 and self.done.acquire(timeout=blocked_s):
            self.blocked = True
            return self.outcome()
        with self.guard:
            if not self.finished:  # still running: the runner settles a future instead
                self.future = self.loop.create_future()
        future = self.future
        if future is None:  # it finished before
            return self.outcome()
        if pending is None:
            return await future
        pending.add(future)
        try:
            return await future
        finally:
            pending.discard(future)

    def outcome(self) -> Any:
        if self.error is not None:
            raise self.error
        return self.result


def settle_soon(loop: asyncio.AbstractEventLoop, future: asyncio.Future[Any], result: Any,
                error: BaseException | None) -> None:
    """From another thread: give `future` (of `loop`) this outcome, unless it was settled meanwhile."""

    def settle() -> None:
        if future.done():  # cancelled by its caller, or failed by its runner's end
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    try:
        loop.call_soon_threadsafe(settle)
    except RuntimeError:  # the loop closed while the call ran (the worker is stopping): nobody waits
        pass
