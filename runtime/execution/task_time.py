"""A task's event time: its watermark generator or combiner, the watermark and status it forwarded, the
event-time timers a watermark makes due, and what a snapshot stores of all that (Flink's
StatusWatermarkValve plus the source's watermark output).

A source task generates watermarks from its records (`emit`); a task with inputs combines the markers of its
channels (`run_chunk` walks a chunk of decoded items, `advance` brings the output up to the combined
watermark). Nothing here waits: when a watermark makes more timers due than one chunk, `advance` says so
and the input processor fires the rest a chunk at a time with the mailbox served in between
(`fire_timers`), then calls `advance` again.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import msgpack

from runtime.api.time import MAX_WATERMARK, MIN_WATERMARK
from runtime.connectors.source import Source
from runtime.execution.channels import ChannelReader
from runtime.execution.operators import Chain
from runtime.execution.watermarks import ACTIVE, IDLE, NOTHING, WatermarkCombiner, WatermarkGenerator

TIMER_CHUNK = 64  # timers fired between two turns of the mailbox (a timer storm must not hold a barrier back)


class TaskTime:
    """Event time of one task: a source's generator (`generator`; the source's own `watermark_generator` when
    it has one) or an input task's combiner (`combiner`)."""

    def __init__(self, chain: Chain, *, source: Source | None, channel_keys: list[str],
                 state: dict[str, Any] | None = None) -> None:
        state = state or {}
        self.chain = chain
        self.generator: WatermarkGenerator | None = None  # a source with watermarks
        self.combiner: WatermarkCombiner | None = None  # a task with inputs
        self.forwarded = MIN_WATERMARK  # the last watermark sent downstream
        self.idle_forwarded = False  # the status last sent downstream
        self._timestamp_of: Callable[[Any], int] = lambda record: 0
        self._idle_timeout_s: float | None = None
        self._emit_interval_s: float | None = None  # periodic watermarks (BoundedOutOfOrderness.emit_interval_ms)
        self._next_emit_at = 0.0  # monotonic time the next periodic watermark may leave
        if source is not None:
            strategy = chain.watermarks
            if strategy is not None:
                own = getattr(source, "watermark_generator", None)  # a source that combines its own (Kafka)
                self.generator = (own(strategy, state.get("generator")) if own is not None
                                  else WatermarkGenerator(strategy, state.get("generator")))
                self._timestamp_of = strategy.timestamp
                self._idle_timeout_s = (strategy.idle_timeout_ms / 1000
                                        if strategy.idle_timeout_ms is not None else None)
                if strategy.emit_interval_ms is not None:
                    self._emit_interval_s = strategy.emit_interval_ms / 1000
                self.forwarded = self.generator.last_emitted
                self.idle_forwarded = self.generator.idle
            else:
                self.forwarded = int(state.get("forwarded", MIN_WATERMARK))
        else:
            self.combiner = WatermarkCombiner(sorted(channel_keys), state.get("combiner"))
            self.forwarded = int(state.get("forwarded", MIN_WATERMARK))
            self.idle_forwarded = bool(state.get("idle_forwarded", False))
            chain.restore_watermarks(self.combiner.current, self.forwarded)

    def current_watermark(self) -> int:
        """The task's watermark: its input's (combined over channels), or at a source the last one emitted."""
        return self.combiner.current if self.combiner is not None else self.forwarded

    def snapshot(self) -> dict[str, Any]:
        """What a checkpoint stores; restored (the `state` argument) before in-flight data is replayed."""
        if self.generator is not None:
            return {"generator": self.generator.snapshot()}
        out: dict[str, Any] = {"forwarded": self.forwarded, "idle_forwarded": self.idle_forwarded}
        if self.combiner is not None:
            out["combiner"] = self.combiner.snapshot()
        return out

    # -- a source -------------------------------------------------------------------------

    def emit(self, records: list[Any]) -> None:
        """A source's records as (timestamp, record) pairs through the chain, each followed by the watermark
        it advances (in-band, in order)."""
        process = self.chain.process_batch
        generator = self.generator
        if generator is None:
            process([(None, r) for r in records])
            return
        timestamp_of = self._timestamp_of
        if self._emit_interval_s is not None:  # periodic: one watermark per interval, after a whole chunk
            stamps = list(map(timestamp_of, records))
            process(list(zip(stamps, records, strict=True)))
            generator.observe(max(stamps))
            now = time.monotonic()
            if now >= self._next_emit_at:
                self._next_emit_at = now + self._emit_interval_s
                self.emit_due()
            return
        on_timestamp = generator.on_timestamp
        out: list[Any] = []
        add = out.append
        for record in records:
            ts = timestamp_of(record)
            add((ts, record))
            w = on_timestamp(ts)
            if w is not None:
                process(out)
                out = []
                add = out.append
                self.chain.forward_watermark(w)
                self.forwarded = w
        if out:
            process(out)

    def flush_periodic(self) -> None:
        """The source has nothing to read: with periodic emission, the watermark held back leaves now."""
        if self._emit_interval_s is not None:
            self.emit_due()

    def emit_due(self) -> None:
        """Send the watermark the source's records so far allow, if it advanced."""
        generator = self.generator
        assert generator is not None
        w = generator.due()
        if w is not None:
            self.chain.forward_watermark(w)
            self.forwarded = w

    def source_active(self) -> None:
        """The source read records again: an idle source says it is active before them."""
        generator = self.generator
        if generator is not None and generator.idle:
            generator.idle = False
            self.chain.forward_status(ACTIVE)

    def source_idle(self, idle_since: float | None, now: float) -> tuple[float, bool]:
        """The source read nothing at `now`, and nothing since `idle_since` (None: it just ran dry). Returns
        when it ran dry and whether it turned idle now (the caller flushes its outputs so the status leaves)."""
        generator = self.generator
        if generator is None or idle_since is None:
            return now, False
        if (self._idle_timeout_s is not None and not generator.idle
                and now - idle_since >= self._idle_timeout_s):
            generator.idle = True
            self.chain.forward_status(IDLE)
            return idle_since, True
        return idle_since, False

    def end(self) -> None:
        """End of a bounded input: MAX_WATERMARK, so every event-time timer downstream fires before the end."""
        if self.generator is not None:
            if self.generator.idle:  # an idle channel's watermarks are ignored downstream
                self.generator.idle = False
                self.chain.forward_status(ACTIVE)
            self.generator.last_emitted = MAX_WATERMARK
        if self.forwarded < MAX_WATERMARK:
            self.chain.forward_watermark(MAX_WATERMARK)
            self.forwarded = MAX_WATERMARK

    # -- a task with inputs ---------------------------------------------------------------------

    def run_chunk(self, items: list[Any], process: Callable[[list[Any]], None], key: str,
                  reader: ChannelReader) -> tuple[int, int, bool]:
        """One chunk of (timestamp, record) pairs and markers from channel `key`: the records through
        `process`, the markers to the combiner, in order. Returns (items handled, markers among them, a timer
        burst is left to run); at a burst it stops after the marker and sets the reader's position there, so a
        snapshot taken during the burst keeps the records after it as channel state.

        Only a marker that moves the combined watermark or status cuts the batch: one that does not (most of
        them, one input channel ahead of another) changes nothing the operators can see, so the records on
        both sides of it go through the chain as one batch (per-batch costs are paid per cut)."""
        combiner = self.combiner
        assert combiner is not None
        on_marker = combiner.on_marker
        start = 0
        markers = 0
        held: list[Any] | None = None  # records before markers that moved nothing, not yet processed
        for k, item in enumerate(items):
            if item.__class__ is tuple:
                continue
            markers += 1
            if on_marker(key, item) is NOTHING:
                if k > start:
                    if held is None:
                        held = items[start:k]
                    else:
                        held += items[start:k]
                start = k + 1
                continue
            if held is not None:
                held += items[start:k]
                process(held)
                held = None
            elif k > start:
                process(items[start:k])
            start = k + 1
            if self.advance():
                reader.consumed = position_after(reader, k + 1)
                return start, markers, True
        if held is not None:
            held += items[start:]
            process(held)
        elif start < len(items):
            process(items[start:] if start else items)
        return len(items), markers, False

    def advance(self) -> bool:
        """Bring the output up to the combined watermark: fire due timers (one chunk), then forward it and the
        status. True when more timers are due: the caller fires them (`fire_timers`), then calls this again."""
        combiner = self.combiner
        if combiner is None:
            return False
        watermark = combiner.current
        if watermark > self.forwarded:
            timers = self.chain.timers
            if timers is not None:
                timers.set_watermark(watermark)
                if timers.fire_event(watermark, TIMER_CHUNK):
                    return True
            self.chain.forward_watermark(watermark)
            self.forwarded = watermark
        if combiner.idle != self.idle_forwarded:
            self.chain.forward_status(IDLE if combiner.idle else ACTIVE)
            self.idle_forwarded = combiner.idle
        return False

    def fire_timers(self) -> bool:
        """One chunk of the event-time timers due at the combined watermark; True while more are due."""
        timers = self.chain.timers
        assert timers is not None and self.combiner is not None
        return timers.fire_event(self.combiner.current, TIMER_CHUNK)


def position_after(reader: ChannelReader, n: int) -> int:
    """The stream position after the first `n` records from `reader.consumed` (they were taken already)."""
    scan = msgpack.Unpacker(raw=False, strict_map_key=False)
    scan.feed(reader.unconsumed())
    for _ in range(n):
        scan.skip()
    return reader.consumed + scan.tell()
