"""The shared periodic timer (runtime/execution/ticks.py): one loop timer per period, whatever the tasks."""

from __future__ import annotations

import asyncio

from runtime.execution import ticks


async def test_tasks_of_one_period_share_one_timer_and_each_is_ticked_until_it_stops() -> None:
    seen: list[str] = []
    stop_a = ticks.every(0.01, lambda: seen.append("a"))
    stop_b = ticks.every(0.01, lambda: seen.append("b"))
    stop_c = ticks.every(0.02, lambda: seen.append("c"))  # another period: a timer of its own
    loop = asyncio.get_running_loop()
    shared = ticks._TICKERS[loop]
    assert sorted(shared) == [0.01, 0.02] and len(shared[0.01]) == 2
    await asyncio.sleep(0.1)
    stop_a()
    marks = len(seen)
    await asyncio.sleep(0.05)
    assert seen.count("a") >= 3 and seen.count("b") >= 3 and seen.count("c") >= 1
    assert "a" not in seen[marks:] and "b" in seen[marks:]
    assert seen[:2] == ["a", "b"]  # in registration order, within one tick
    stop_b()
    stop_c()
    assert shared[0.01]._timer is None and shared[0.02]._timer is None  # nothing left: no wake-ups
    stop_b()  # twice: harmless


async def test_a_tick_that_raises_does_not_stop_the_others() -> None:
    seen: list[int] = []

    def broken() -> None:
        raise RuntimeError("boom")

    stop_broken = ticks.every(0.01, broken)
    stop_ok = ticks.every(0.01, lambda: seen.append(1))
    await asyncio.sleep(0.06)
    stop_broken()
    stop_ok()
    assert len(seen) >= 2
