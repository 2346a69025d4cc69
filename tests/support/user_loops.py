"""Running an asynchronous operator's tests in both places a task runs one (runtime/execution/task.py): on the test's
own loop, as a task with isolation `inline` does, and on a user loop of its own (runtime/execution/user_loop.py), as
every other task does. A test module imports the fixture `where_the_chain_runs` (autouse); its harness is an
`OperatorHarness`."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from runtime.execution.user_loop import UserLoop

_made: list[UserLoop] | None = None  # the user loops of the test running now; None: the chain on the test's loop


class OperatorHarness:
    """An asynchronous operator (`op`, built by the subclass, then `place()`) driven as its task drives it: a run
    (a feed) through `call`, its coroutines (open, finish, aclose) through `run`, a snapshot through `exclusive`
    (Task.call, Task._on_chain_loop, Task.exclusive). Inline on the test's loop, as with isolation `inline`; or
    bound (`run_on`) to a user loop of its own, as Task._start_user_loop places it."""

    op: Any
    user: UserLoop | None = None

    def place(self) -> None:
        if _made is not None:
            self.user = UserLoop(f"test user loop {len(_made)}")
            _made.append(self.user)
            self.op.run_on(self.user.loop)

    async def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        return fn(*args) if self.user is None else await self.user.call(fn, *args)

    async def run(self, coroutine: Coroutine[Any, Any, Any]) -> Any:
        return await (coroutine if self.user is None else self.user.run(coroutine))

    async def exclusive(self, fn: Callable[..., Any], *args: Any) -> Any:
        return fn(*args) if self.user is None else await self.user.exclusive(fn, *args)

    async def feed(self, records: list[Any]) -> tuple[int, bool]:
        """A run handing `records` over; what it left in flight and queued when it returned."""
        return await self.call(self._fed, self.op.feed, records)

    async def feed_watermark(self, timestamp: int) -> tuple[int, bool]:
        return await self.call(self._fed, self.op.feed_watermark, timestamp)

    def _fed(self, feed: Callable[[Any], None], arg: Any) -> tuple[int, bool]:
        feed(arg)
        return self.op.in_flight, self.op.backlog

    async def open(self) -> None:
        await self.run(self.op.open())

    async def snapshot(self, checkpoint_id: int) -> tuple[Any, dict[str, Any]]:
        return await self.exclusive(self.op.snapshot, checkpoint_id)

    async def aclose(self) -> None:
        await self.run(self.op.aclose())


@pytest.fixture(autouse=True, params=["inline", "user loop"])
async def where_the_chain_runs(request: pytest.FixtureRequest) -> Any:
    """Every test twice: the operator on the test's loop, and on a user loop of its own."""
    global _made
    _made = [] if request.param == "user loop" else None
    yield request.param
    loops, _made = _made or [], None
    for loop in loops:
        assert await loop.stop(5.0)
