"""One loop timer per period for all the tasks of a worker that tick at that period.

A task flushes its partly filled buffers and polls its checkpoint deadlines every `flush_timeout_s` (50 ms by
default). With a timer of its own, each of a worker's tasks woke the event loop 20 times a second: at 10 idle
tasks a worker, 200 wake-ups a second, which was most of what an idle worker still cost once its sources
stopped polling hard (docs/BENCHMARKS.md, Scale). The tasks that share a period share one timer here, so a
worker wakes once per period whatever its number of tasks. A tick still comes within one period of the last.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Callable

log = logging.getLogger(__name__)


class Ticker:
    """Calls every registered function once per `period_s`, on the loop, while any is registered."""

    def __init__(self, loop: asyncio.AbstractEventLoop, period_s: float) -> None:
        self.loop = loop
        self.period_s = period_s
        self._calls: dict[int, Callable[[], None]] = {}  # in registration order
        self._next_id = 0
        self._timer: asyncio.TimerHandle | None = None

    def add(self, fn: Callable[[], None]) -> Callable[[], None]:
        """Tick `fn` from now on; returns the function that stops it."""
        self._next_id += 1
        key = self._next_id
        self._calls[key] = fn
        if self._timer is None:
            self._timer = self.loop.call_later(self.period_s, self._fire)
        return lambda: self._remove(key)

    def _remove(self, key: int) -> None:
        self._calls.pop(key, None)
        if not self._calls and self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _fire(self) -> None:
        self._timer = None
        for fn in list(self._calls.values()):
            try:
                fn()
            except Exception:  # one task's tick must not stop the others'
                log.exception("a periodic task tick failed")
        if self._calls:
            self._timer = self.loop.call_later(self.period_s, self._fire)

    def __len__(self) -> int:
        return len(self._calls)


_TICKERS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[float, Ticker]] = weakref.WeakKeyDictionary()


def every(period_s: float, fn: Callable[[], None]) -> Callable[[], None]:
    """Call `fn` every `period_s` on the running loop, on the timer shared by that period; returns the stop."""
    loop = asyncio.get_running_loop()
    tickers = _TICKERS.setdefault(loop, {})
    ticker = tickers.get(period_s)
    if ticker is None:
        ticker = tickers[period_s] = Ticker(loop, period_s)
    return ticker.add(fn)
