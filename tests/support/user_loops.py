"""Running an asynchronous operator's tests twice: the user's coroutines on the test's own loop, and on a user loop
of their own (runtime/execution/user_loop.py), as a task runs them. A test module imports the fixture
`where_user_code_runs` (autouse) and its harness asks `user_loop()` for the loop to use, None for the test's."""

from __future__ import annotations

from typing import Any

import pytest

from runtime.execution.user_loop import UserLoop

_made: list[UserLoop] | None = None  # the user loops of the test running now; None: coroutines on the test's loop


def user_loop() -> UserLoop | None:
    """A new user loop for a harness (stopped after the test), or None when the test runs on its own loop."""
    if _made is None:
        return None
    _made.append(UserLoop(f"test user loop {len(_made)}"))
    return _made[-1]


@pytest.fixture(autouse=True, params=["worker loop", "user loop"])
async def where_user_code_runs(request: pytest.FixtureRequest) -> Any:
    """Every test twice: the function's coroutines on the test's loop, and on a user loop of their own."""
    global _made
    _made = [] if request.param == "user loop" else None
    yield request.param
    loops, _made = _made or [], None
    for loop in loops:
        assert await loop.stop(5.0)
