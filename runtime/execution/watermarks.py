"""Watermarks: generated at sources from the records, combined per task over its input channels. Pure, no I/O.

Both objects are deterministic functions of the sequence they are fed (records at a source; watermarks and
idle/active markers per channel at a task), and their whole state is a small value that goes into the task's
checkpoint. Restoring it before the in-flight data is replayed makes the replay see exactly the watermarks the
failed run saw (docs/ARCHITECTURE.md, "Event time").

How markers travel: on the edges of a job with event time every record is packed as [timestamp, record], and a
watermark is a bare int in the same stream (so it is ordered with the records and costs no buffer flush); the
idle and active markers are the strings IDLE and ACTIVE.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from runtime.api.time import MIN_WATERMARK, BoundedOutOfOrderness

IDLE = "idle"
ACTIVE = "active"


class WatermarkGenerator:
    """One source subtask's watermarks under bounded out-of-orderness (see BoundedOutOfOrderness)."""

    __slots__ = ("max_delay_ms", "granularity_ms", "max_ts", "last_emitted", "idle")

    def __init__(self, strategy: BoundedOutOfOrderness, state: Any = None) -> None:
        self.max_delay_ms = strategy.max_delay_ms
        self.granularity_ms = strategy.granularity_ms
        self.max_ts = MIN_WATERMARK
        self.last_emitted = MIN_WATERMARK
        self.idle = False
        if state:
            self.max_ts, self.last_emitted, idle = state
            self.idle = bool(idle)

    def on_timestamp(self, ts: int) -> int | None:
        """The watermark to emit after a record with timestamp `ts`, or None when it did not advance."""
        if ts <= self.max_ts:
            return None
        self.max_ts = ts
        return self.due()

    def observe(self, ts: int) -> None:
        """Periodic emission: remember the highest timestamp; the watermark leaves at the next `due`."""
        if ts > self.max_ts:
            self.max_ts = ts

    def due(self) -> int | None:
        """The watermark the highest timestamp so far allows, when it is above the last one emitted."""
        if self.max_ts == MIN_WATERMARK:
            return None
        w = self.max_ts - self.max_delay_ms - 1
        w -= w % self.granularity_ms  # floor (Python's % takes the sign of the divisor)
        if w > self.last_emitted:
            self.last_emitted = w
            return w
        return None

    def snapshot(self) -> list[Any]:
        return [self.max_ts, self.last_emitted, self.idle]


@dataclass
class ChannelTime:
    watermark: int = MIN_WATERMARK
    idle: bool = False
    aligned: bool = True  # active, and its watermark has reached the combined one (it counts for the minimum)


@dataclass(frozen=True)
class Advance:
    """What a marker on one channel makes the task send on: a new combined watermark and/or a status change."""

    watermark: int | None = None
    status: str | None = None  # IDLE or ACTIVE, after the watermark


NOTHING = Advance()


class WatermarkCombiner:
    """A task's watermark: the minimum over its active input channels, forwarded only when it advances.

    Flink's StatusWatermarkValve: an idle channel does not hold the minimum back; a channel that becomes
    active again counts once its watermark has caught up with the combined one (so the combined watermark
    never goes back); when every channel is idle the task takes the highest channel watermark and is idle
    itself.
    """

    def __init__(self, channels: list[str], state: Any = None) -> None:
        self.channels = {key: ChannelTime() for key in channels}
        self.current = MIN_WATERMARK
        self.idle = False
        if state:
            for key, (wm, idle, aligned) in state["channels"].items():
                if key in self.channels:
                    self.channels[key] = ChannelTime(int(wm), bool(idle), bool(aligned))
            self.current = int(state["current"])
            self.idle = bool(state["idle"])

    def snapshot(self) -> dict[str, Any]:
        return {"channels": {k: [c.watermark, c.idle, c.aligned] for k, c in self.channels.items()},
                "current": self.current, "idle": self.idle}

    def on_marker(self, channel: str, marker: Any) -> Advance:
        if marker == IDLE:
            return self.on_idle(channel)
        if marker == ACTIVE:
            return self.on_active(channel)
        return self.on_watermark(channel, int(marker))

    def on_watermark(self, channel: str, watermark: int) -> Advance:
        ch = self.channels[channel]
        if ch.idle or watermark <= ch.watermark:
            return NOTHING
        ch.watermark = watermark
        if not ch.aligned and watermark >= self.current:
            ch.aligned = True
        low = self._new_min()
        return NOTHING if low is None else Advance(low)  # most markers do not move the minimum

    def on_idle(self, channel: str) -> Advance:
        ch = self.channels[channel]
        if ch.idle:
            return NOTHING
        ch.idle = True
        ch.aligned = False
        if all(c.idle for c in self.channels.values()):
            highest = max(c.watermark for c in self.channels.values())
            advanced = highest if highest > self.current else None
            if advanced is not None:
                self.current = highest
            self.idle = True
            return Advance(advanced, IDLE)
        return Advance(self._new_min())

    def on_active(self, channel: str) -> Advance:
        ch = self.channels[channel]
        if not ch.idle:
            return NOTHING
        ch.idle = False
        ch.aligned = ch.watermark >= self.current
        if self.idle:
            self.idle = False
            return Advance(None, ACTIVE)
        return NOTHING

    def _new_min(self) -> int | None:
        aligned = [c.watermark for c in self.channels.values() if c.aligned]
        if aligned:
            low = min(aligned)
            if low > self.current:
                self.current = low
                return low
        return None
