"""Bounding a channel's in-flight data by time instead of by buffer count (buffer debloating).

A channel holds up to `buffers_in_path` buffers between the record writer and
the consuming task: the producer's queue (`buffers_per_channel`) plus the
receiver's exclusive and floating buffers. An aligned barrier waits behind all
of them, so with fixed 32 KiB buffers its delay is
`buffers_in_path * buffer_bytes / drain rate`: seconds under backpressure,
whatever the checkpoint interval. Like Flink's buffer debloating, the sizing
here keeps the number of buffers and shrinks each one, so that a full path
holds about `target_s` of the channel's measured throughput.

The rules are pure (`buffer_size_for`, `RateEstimate`); `InflightBound`
applies them to a worker's subpartitions from a timer on the event loop. It
changes a subpartition only between records (the loop runs one callback at a
time), never inside the record write path; a subpartition that an isolated
task's thread is writing (runtime/execution/isolation.py) is left for the next
period.

Before a channel has an estimate its buffers start at the minimum size, not
the configured one: at a job's start (or restart) the sources fill every
queue within a fraction of a second, and full-size buffers queued then hold
many seconds of a backpressured channel's throughput (64 of 32 KiB: about 7 s
in scripts/bench_checkpoint.py). Every aligned checkpoint waited behind them
until they had drained, which made the first 5 to 10 s of a job's checkpoints
take 4 to 7 s whatever the target. The estimate grows the buffers to their
size within two adjustment periods; a fast channel reaches the configured
size in the same time.
"""

from __future__ import annotations

import asyncio
import statistics
from collections import deque
from collections.abc import Iterable

from runtime.execution.channels import Subpartition

MIN_BUFFER_BYTES = 1024  # below this the per-buffer cost (frame, credit, wake-up) dominates
ADJUST_PERIOD_S = 0.2
RATE_WINDOW_S = 3.0  # the throughput estimate is the median over this long


def buffer_size_for(rate_bytes_s: float | None, target_s: float, buffers_in_path: int, *, max_bytes: int,
                    min_bytes: int = MIN_BUFFER_BYTES) -> int:
    """The buffer size that makes `buffers_in_path` full buffers hold `target_s` of `rate_bytes_s`.

    No target (<= 0) means the configured maximum; no estimate yet (None) the
    minimum (see the module docstring). The result stays within
    [min(min_bytes, max_bytes), max_bytes].
    """
    if target_s <= 0:
        return max_bytes
    if rate_bytes_s is None:
        return min(min_bytes, max_bytes)
    if buffers_in_path < 1:
        raise ValueError(f"buffers_in_path must be at least 1, got {buffers_in_path}")
    size = int(rate_bytes_s * target_s / buffers_in_path)
    return max(min(min_bytes, max_bytes), min(max_bytes, size))


class RateEstimate:
    """A channel's throughput: the median of its recent per-period rates, from its byte counter.

    Periods in which nothing moved are left out: an idle channel, or one
    blocked by an aligned checkpoint, tells nothing about what it drains when
    it flows. The median (not an average) also keeps a partial stall or the
    burst after one from moving the estimate: a lower estimate would shrink
    the buffers, starve the consumer further and lower the estimate again.
    """

    __slots__ = ("window_s", "_samples", "_last_bytes", "_last_at")

    def __init__(self, window_s: float = RATE_WINDOW_S) -> None:
        self.window_s = window_s
        self._samples: deque[tuple[float, float]] = deque()  # (end of period, bytes/s)
        self._last_bytes: int | None = None
        self._last_at = 0.0

    @property
    def rate(self) -> float | None:
        return statistics.median(r for _, r in self._samples) if self._samples else None

    def unchanged_by(self, total_bytes: int) -> bool:
        """Whether sampling `total_bytes` now would change nothing but the clock of the last sample: nothing
        moved, and there is no older sample that time could age out (the newest always stays)."""
        return total_bytes == self._last_bytes and len(self._samples) <= 1

    def settle(self, at: float) -> None:
        """Nothing moved until `at`: as the samples skipped then (`unchanged_by`) would have left it, so the
        next period that moves is timed from `at`, not from the last sample taken."""
        if self._last_bytes is not None and at > self._last_at:
            self._last_at = at

    def sample(self, total_bytes: int, now: float) -> float | None:
        if self._last_bytes is None:
            self._last_bytes, self._last_at = total_bytes, now
            return self.rate
        moved, elapsed = total_bytes - self._last_bytes, now - self._last_at
        if elapsed <= 0:
            return self.rate
        self._last_bytes, self._last_at = total_bytes, now
        if moved > 0:
            self._samples.append((now, moved / elapsed))
        # the newest sample always stays: a channel that moved once long ago keeps that estimate
        while len(self._samples) > 1 and self._samples[0][0] < now - self.window_s:
            self._samples.popleft()
        return self.rate


def resize(sub: Subpartition, capacity: int) -> None:
    """Give `sub` a new buffer capacity, between records.

    The buffer being built must stay below the capacity (the writer's cut
    assumes it held less than one buffer before a record), so a builder
    already at or over the new size is flushed first: it ends at a record
    boundary, because the writer appends whole records.
    """
    if capacity == sub.capacity:
        return
    if len(sub.buf) >= capacity:
        sub.flush()
    sub.capacity = capacity


class InflightBound:
    """Sizes the buffers of a worker's subpartitions so that each channel holds about `target_s` of data."""

    def __init__(self, subpartitions: Iterable[Subpartition], *, target_s: float, buffers_in_path: int,
                 max_bytes: int, min_bytes: int = MIN_BUFFER_BYTES) -> None:
        self.target_s = target_s
        self.buffers_in_path = buffers_in_path
        self.max_bytes = max_bytes
        self.min_bytes = min_bytes
        self.channels = [(sub, RateEstimate()) for sub in subpartitions]
        self._last_now: float | None = None  # the previous pass's time
        for sub, _ in self.channels:  # before the first record: nothing is queued at the configured size
            resize(sub, buffer_size_for(None, target_s, buffers_in_path, max_bytes=max_bytes, min_bytes=min_bytes))

    def adjust(self, now: float) -> int:
        """One pass; returns how many channels it sampled.

        A channel whose byte count did not move since its last sample, with no older sample to age out and
        no size waiting for its task, is skipped: its estimate, and so its size, would come out the same (at
        1,000 tasks nearly all of a worker's 2,500 channels are idle at any pass). Its clock is caught up
        when it moves again (`RateEstimate.settle`), so the estimates are the ones a full pass gives."""
        last_now, self._last_now = self._last_now, now
        sampled = 0
        for sub, estimate in self.channels:
            if not sub.wanted_capacity and estimate.unchanged_by(sub.bytes_out):
                continue
            sampled += 1
            if last_now is not None:
                estimate.settle(last_now)
            rate = estimate.sample(sub.bytes_out, now)
            if sub.deferred is not None:  # its task's thread is writing into it: the task resizes it (Task._tick)
                sub.wanted_capacity = buffer_size_for(rate, self.target_s, self.buffers_in_path,
                                                      max_bytes=self.max_bytes, min_bytes=self.min_bytes)
                sub.gate.due[sub] = None  # the task's next tick visits it
                continue
            sub.wanted_capacity = 0
            resize(sub, buffer_size_for(rate, self.target_s, self.buffers_in_path, max_bytes=self.max_bytes,
                                        min_bytes=self.min_bytes))
        return sampled

    async def run(self, period_s: float = ADJUST_PERIOD_S) -> None:
        loop = asyncio.get_running_loop()
        while True:
            self.adjust(loop.time())
            await asyncio.sleep(period_s)
