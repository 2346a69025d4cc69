"""How late the running event loop is for a timer: what a call that holds the worker's loop shows."""

from __future__ import annotations

import asyncio
import time


class LoopLag:
    """While entered: a timer of `period_s` on the running event loop; how often it ran (`ticks`) and the longest
    it was late (`lag`), what a call that holds the loop would show."""

    def __init__(self, period_s: float = 0.005) -> None:
        self.period_s = period_s
        self.lag = 0.0
        self.ticks = 0
        self._ticking: asyncio.Task[None] | None = None

    async def _tick(self) -> None:
        while True:
            self.ticks += 1
            t0 = time.monotonic()
            await asyncio.sleep(self.period_s)
            self.lag = max(self.lag, time.monotonic() - t0 - self.period_s)

    async def __aenter__(self) -> LoopLag:
        self._ticking = asyncio.create_task(self._tick())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._ticking is not None
        self._ticking.cancel()
