"""User code that misbehaves: a call that runs too long, a `sys.exit()`, a cancelled call that never returns.

Tasks run user code on threads of their own (runtime/execution/isolation.py), so the worker's event loop
(heartbeats, RPC, other tasks, checkpoints) never waits for it. What this module adds is how such code is
*seen*:

- `CallWatchdog`, one daemon thread per worker, looks at every task's running call a few times a second. A
  call running past `slow_call_s` is reported once (a log line with the function and its stack, then the
  worker's `on_slow` callback: a metric and the job's exception history). A stuck event loop (a task that
  runs inline, or anything else holding it) is reported the same way, with the loop thread's stack.
- `UserCodeExit`: what `sys.exit()` in user code turns into, so it fails its task with the cause named
  instead of ending the worker; `UserCodeCancelled` the same for an asyncio.CancelledError user code raises
  while nobody cancelled its task (it ended the task as if stopped on purpose, reported by nobody).
- `user_function`: the user function a stack or traceback is in (the innermost frame outside the runtime
  and the standard library), for the messages above.

A cancelled task whose call never returns cannot be stopped (Python cannot kill a thread): after the
worker's cancel timeout it fails the worker fatally, the way Flink's task cancellation watchdog does
(runtime/worker/worker.py `_user_code_stuck`); the supervisor starts a fresh worker process.
"""

from __future__ import annotations

import logging
import os
import sys
import sysconfig
import threading
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from types import FrameType, TracebackType

log = logging.getLogger("sluice.user_code")

_RUNTIME_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the `runtime` package
_STDLIB_DIRS = tuple({os.path.abspath(p) for p in (sysconfig.get_paths().get("stdlib"),
                                                   sysconfig.get_paths().get("platstdlib")) if p})


def _is_user_file(filename: str) -> bool:
    path = os.path.abspath(filename)
    return not path.startswith(_RUNTIME_DIR + os.sep) and not path.startswith(_STDLIB_DIRS)


def _describe(frame: FrameType) -> str:
    code = frame.f_code
    module = frame.f_globals.get("__name__", "?")
    return f"{module}.{getattr(code, 'co_qualname', code.co_name)} ({os.path.basename(code.co_filename)}:" \
           f"{frame.f_lineno})"


def user_function(frames: Iterable[FrameType]) -> str:
    """The innermost user frame of `frames` (outermost first), as "module.function (file:line)"; the
    innermost frame outside the runtime when none is user code (a standard library call), "?" for none."""
    user = fallback = None
    for frame in frames:
        if _is_user_file(frame.f_code.co_filename):
            user = frame
        elif not os.path.abspath(frame.f_code.co_filename).startswith(_RUNTIME_DIR + os.sep):
            fallback = frame
    chosen = user or fallback
    return _describe(chosen) if chosen is not None else "?"


def stack_frames(frame: FrameType | None) -> list[FrameType]:
    """A thread's frames, outermost first, from its innermost `frame`."""
    frames = []
    while frame is not None:
        frames.append(frame)
        frame = frame.f_back
    return frames[::-1]


def traceback_frames(tb: TracebackType | None) -> list[FrameType]:
    frames = []
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    return frames


def _task_in(frames: list[FrameType]) -> str | None:
    """The id of the task whose method is on a stuck event loop's stack (a task running inline), if any."""
    for frame in reversed(frames):
        owner = frame.f_locals.get("self")
        task_id = getattr(owner, "task_id", None)
        if type(owner).__name__ == "Task" and isinstance(task_id, str):
            return task_id
    return None


class UserCodeExit(RuntimeError):
    """User code called `sys.exit()` (or raised SystemExit): its task fails, the worker stays."""

    @classmethod
    def of(cls, exc: BaseException) -> UserCodeExit:
        function = user_function(traceback_frames(exc.__traceback__))
        code = exc.code if isinstance(exc, SystemExit) else None
        error = cls(f"user code called sys.exit({code!r}) in {function}: its task fails, the worker stays up")
        error.__cause__ = exc
        return error


class UserCodeCancelled(RuntimeError):
    """User code raised asyncio.CancelledError while nobody cancelled its task (a client's own cancellation): its
    task fails, instead of ending as if it had been stopped on purpose."""

    @classmethod
    def of(cls, exc: BaseException) -> UserCodeCancelled:
        function = user_function(traceback_frames(exc.__traceback__))
        return cls(f"user code raised CancelledError in {function} while its task was not cancelled: the task fails")


@dataclass(frozen=True)
class SlowCall:
    """A user call found running past the threshold."""

    task_id: str | None  # None: the event loop was stuck and no task could be named
    function: str  # "module.function (file:line)"
    stack: str  # the thread's stack, outermost first
    running_s: float


@dataclass(frozen=True)
class RunningCall:
    """A task's call in progress, as the watchdog sees it."""

    task_id: str
    call_id: int  # tells one call from the next, so each is reported once
    started: float  # time.monotonic() when it began
    thread_ident: int


class CallWatchdog:
    """A daemon thread that reports user calls running past `slow_call_s` (see the module docstring).

    `calls` lists the running calls (it is called on the watchdog's thread: it must only read); `on_slow`
    gets each report on the watchdog's thread (hand it to the event loop with call_soon_threadsafe)."""

    def __init__(self, calls: Callable[[], Iterable[RunningCall]], *, slow_call_s: float,
                 on_slow: Callable[[SlowCall], None], loop_thread: int | None = None) -> None:
        self.slow_call_s = slow_call_s
        self._calls = calls
        self._on_slow = on_slow
        self._loop_thread = loop_thread
        self._loop_seen = time.monotonic()  # the last time the event loop ran `loop_alive`
        self._loop_reported = False
        self._reported: set[tuple[str, int]] = set()
        self._stop = threading.Event()
        self.reports = 0
        self._thread = threading.Thread(target=self._run, name="sluice-call-watchdog", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def loop_alive(self) -> None:
        """Called on the event loop now and then: while it is, the loop is not stuck."""
        self._loop_seen = time.monotonic()
        self._loop_reported = False

    def _run(self) -> None:
        period = max(0.05, min(0.5, self.slow_call_s / 4))
        while not self._stop.wait(period):
            try:
                self.check(time.monotonic())
            except Exception:  # the watchdog must outlive whatever it watches
                log.exception("call watchdog: check failed")

    def check(self, now: float) -> list[SlowCall]:
        """Report the calls that went past the threshold since the last check (returned, for tests)."""
        found = []
        running = set()
        frames = sys._current_frames()
        for call in self._calls():
            running.add((call.task_id, call.call_id))
            if now - call.started < self.slow_call_s or (call.task_id, call.call_id) in self._reported:
                continue
            self._reported.add((call.task_id, call.call_id))
            found.append(self._report(call.task_id, frames.get(call.thread_ident), now - call.started))
        self._reported &= running
        if (self._loop_thread is not None and not self._loop_reported
                and now - self._loop_seen >= self.slow_call_s):
            self._loop_reported = True
            found.append(self._report(None, frames.get(self._loop_thread), now - self._loop_seen))
        return found

    def _report(self, task_id: str | None, frame: FrameType | None, running_s: float) -> SlowCall:
        frames = stack_frames(frame)
        if task_id is None:
            task_id = _task_in(frames)
        slow = SlowCall(task_id, user_function(frames), "".join(traceback.format_list(
            traceback.StackSummary.extract((f, f.f_lineno) for f in frames))), running_s)
        where = f"task {task_id}" if task_id is not None else "the event loop"
        log.warning("%s: user call %s has been running for %.1f s (threshold %.1f s); its stack:\n%s", where,
                    slow.function, running_s, self.slow_call_s, slow.stack)
        self.reports += 1
        self._on_slow(slow)
        return slow
