"""One owner for fire-and-forget asyncio tasks, so shutdown can cancel them and wait for them.

A bare `asyncio.create_task` whose result nobody keeps can be garbage
collected mid-flight, and a set of them that is only cancelled at shutdown
leaves their `finally` blocks unrun when the loop closes ("Task was destroyed
but it is pending"). `BackgroundTasks` keeps the references, logs a failure
as it happens (nobody awaits these tasks to see it), and `cancel_and_wait`
cancels and then awaits every task, including ones spawned while the others
were being cancelled.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable
from typing import Any, TypeVar

T = TypeVar("T")

log = logging.getLogger("sluice.tasks")


class BackgroundTasks:
    def __init__(self, name: str) -> None:
        self.name = name
        self._tasks: set[asyncio.Future[Any]] = set()

    def __len__(self) -> int:
        return len(self._tasks)

    def spawn(self, aw: Awaitable[T], *, name: str | None = None) -> asyncio.Future[T]:
        """Run `aw` in the background; the returned task may be awaited or cancelled by the caller too."""
        task = asyncio.ensure_future(aw)
        if name is not None and isinstance(task, asyncio.Task):
            task.set_name(name)
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Future[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            exc = task.exception()
            log.error("%s: background task failed: %s: %s", self.name, type(exc).__name__, exc, exc_info=exc)

    async def cancel_and_wait(self, timeout_s: float = 10.0) -> None:
        """Cancel every task and wait until all have ended (or `timeout_s` passed: then log which are left)."""
        deadline = time.monotonic() + timeout_s
        while self._tasks:
            pending = list(self._tasks)
            for task in pending:
                task.cancel()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            await asyncio.wait(pending, timeout=remaining)
        if self._tasks:
            log.warning("%s: %d background tasks did not end within %.1fs of being cancelled", self.name,
                        len(self._tasks), timeout_s)
