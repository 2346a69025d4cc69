"""Where a task's wall time went: idle (waiting for input), backpressured (waiting for an output buffer), busy.

A plain object with `now` passed in, so it is unit tested without a clock. The wait in progress counts
whenever the figures are read (as Flink's backPressuredTimeMsPerSecond does): a source that has been
blocked on a full output for 20 s reads 20 s of backpressure now, not when the wait ends. Booking a wait
only at its end made a backpressured source look busy (its long waits were missing from every heartbeat
until they ended) and made rate(...) alternate between 0 and several seconds per second.
"""

from __future__ import annotations

from dataclasses import dataclass

IDLE_TIME = "idle"
BACKPRESSURED_TIME = "backpressured"


@dataclass(frozen=True)
class Times:
    busy_s: float
    idle_s: float
    backpressured_s: float


class TimeAccounting:
    def __init__(self) -> None:
        self.started_at: float | None = None
        self.finished_at: float | None = None
        self._booked = {IDLE_TIME: 0.0, BACKPRESSURED_TIME: 0.0}
        self._waiting: str | None = None  # what the wait in progress is counted as
        self._since = 0.0

    def start(self, now: float) -> None:
        self.started_at = now

    def begin_wait(self, kind: str, now: float) -> None:
        """A wait starts (IDLE_TIME or BACKPRESSURED_TIME); a wait already in progress ends first."""
        self.end_wait(now)
        self._waiting = kind
        self._since = now

    def end_wait(self, now: float) -> None:
        if self._waiting is not None:
            self._booked[self._waiting] += max(0.0, now - self._since)
            self._waiting = None

    def finish(self, now: float) -> None:
        self.end_wait(now)
        self.finished_at = now

    def read(self, now: float) -> Times:
        """The figures at `now`, the wait in progress included; busy is the rest of the wall time."""
        end = self.finished_at if self.finished_at is not None else now
        booked = dict(self._booked)
        if self._waiting is not None and self.finished_at is None:
            booked[self._waiting] += max(0.0, now - self._since)
        wall = max(0.0, end - self.started_at) if self.started_at is not None else 0.0
        busy = max(0.0, wall - booked[IDLE_TIME] - booked[BACKPRESSURED_TIME])
        return Times(busy_s=busy, idle_s=booked[IDLE_TIME], backpressured_s=booked[BACKPRESSURED_TIME])
