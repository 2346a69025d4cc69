"""A task's timed wait (`Task.wait` with a timeout, used while its outputs drain and while a source idles)
must let a cancel through even when a wake-up comes in the same turn: asyncio.wait_for before Python 3.12
swallowed it, and a cancelled task then ran on until the worker gave up on it 10 s later."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from runtime.execution.task import Task


async def _cancel_while_woken(timeout_s: float | None) -> None:
    holder = SimpleNamespace(_wakeup=asyncio.Event())  # the only attribute wait uses
    waiter = asyncio.ensure_future(Task.wait(holder, timeout_s))  # type: ignore[arg-type]
    for _ in range(3):
        await asyncio.sleep(0)  # now waiting
    holder._wakeup.set()  # a wake-up (credit, a mail) ...
    waiter.cancel()  # ... and the cancel in the same turn
    with pytest.raises(asyncio.CancelledError):
        await waiter


@pytest.mark.parametrize("timeout_s", [5.0, None])
def test_a_cancel_is_not_lost_to_a_wakeup_in_the_same_turn(timeout_s: float | None) -> None:
    asyncio.run(_cancel_while_woken(timeout_s))


def test_the_timed_wait_still_ends_at_its_timeout() -> None:
    async def body() -> None:
        holder = SimpleNamespace(_wakeup=asyncio.Event())
        await asyncio.wait_for(Task.wait(holder, 0.01), 5.0)  # type: ignore[arg-type]

    asyncio.run(body())
