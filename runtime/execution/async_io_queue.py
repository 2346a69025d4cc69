"""The ordering core of Async I/O (`stream.async_map`): which requests start, which results leave. Pure, no I/O.

Flink's AsyncWaitOperator queues, as a plain object. The driver (runtime/execution/async_io.py) adds records
and watermarks in arrival order, starts the requests `add` and `complete` return, reports each result with
`complete`, and hands `take_ready()` downstream. What it guarantees:

- at most `capacity` records in the queue (in flight, waiting for their key, or done and not yet emitted);
  the driver admits no more while `has_room()` is false, so a full queue is backpressure, never growth;
- ordered: results leave in arrival order;
- unordered: a result leaves as soon as it is done, but never passes a watermark it arrived behind, and a
  watermark leaves only after every record that arrived before it (watermarks cut the queue into segments);
- keyed: records of one key are requested one after the other, in arrival order (their results then also
  leave in that order, in both modes);
- `snapshot()` is everything not emitted yet, in arrival order: with what was emitted before it, exactly the
  input so far. A checkpoint stores it and a restore adds it again first, so each result reaches the output
  exactly once (the request itself may be made again).

Consecutive watermarks with no record between them are merged (the newest wins), so watermarks add at most
one entry per record to the queue.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

NO_KEY: Any = object()  # the key of a record of the non-keyed variant: never waits for another


@dataclass(frozen=True, slots=True)
class Start:
    """Issue the request for entry `seq` of `record`."""

    seq: int
    record: Any


@dataclass(frozen=True, slots=True)
class Mark:
    """A watermark in the output (in `take_ready`) or in a snapshot."""

    timestamp: int


@dataclass(slots=True)
class _Entry:
    seq: int
    key: Any
    record: Any
    done: bool = False
    result: Any = None


@dataclass(slots=True)
class _Segment:
    """Unordered mode: the records between two watermarks, and the watermark that closes it (None: open)."""

    pending: dict[int, _Entry] = field(default_factory=dict)
    done: deque[_Entry] = field(default_factory=deque)
    watermark: int | None = None


class AsyncIOQueue:
    def __init__(self, capacity: int, *, ordered: bool) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}")
        self.capacity = capacity
        self.ordered = ordered
        self._next_seq = 0
        self._entries: dict[int, _Entry] = {}  # every record not emitted, by seq
        self._order: deque[_Entry | Mark] = deque()  # ordered mode: arrival order
        self._segments: deque[_Segment] = deque([_Segment()])  # unordered mode
        self._waiting: dict[Hashable, deque[_Entry]] = {}  # key -> its records behind the one in flight
        self.in_flight = 0  # requests started and not completed

    # -- what the driver asks ----------------------------------------------------------------------

    def __len__(self) -> int:
        """Records in the queue (started, waiting for their key, or done and not emitted)."""
        return len(self._entries)

    def has_room(self) -> bool:
        return len(self._entries) < self.capacity

    def empty(self) -> bool:
        """Nothing left to emit: no record and no watermark."""
        if self.ordered:
            return not self._order
        return len(self._segments) == 1 and not self._entries and self._segments[0].watermark is None

    # -- input -------------------------------------------------------------------------------------

    def add(self, record: Any, key: Any = NO_KEY) -> list[Start]:
        """A record arrives (the caller checked `has_room`); returns its Start unless its key is busy."""
        if not self.has_room():
            raise RuntimeError("AsyncIOQueue.add without room: check has_room() first")
        entry = _Entry(self._next_seq, key, record)
        self._next_seq += 1
        self._entries[entry.seq] = entry
        if self.ordered:
            self._order.append(entry)
        else:
            segment = self._segments[-1]
            if segment.watermark is not None:
                segment = _Segment()
                self._segments.append(segment)
            segment.pending[entry.seq] = entry
        if key is not NO_KEY:
            waiting = self._waiting.get(key)
            if waiting is not None:
                waiting.append(entry)  # started when the one before it completes
                return []
            self._waiting[key] = deque()
        self.in_flight += 1
        return [Start(entry.seq, record)]

    def add_watermark(self, timestamp: int) -> None:
        """A watermark arrives, behind every record added before it."""
        if self.ordered:
            last = self._order[-1] if self._order else None
            if isinstance(last, Mark):
                self._order[-1] = Mark(max(last.timestamp, timestamp))
            else:
                self._order.append(Mark(timestamp))
            return
        segment = self._segments[-1]
        # a closed last segment means no record since its watermark (a record would have opened one): merge
        segment.watermark = timestamp if segment.watermark is None else max(segment.watermark, timestamp)

    def complete(self, seq: int, result: Any) -> list[Start]:
        """The request of entry `seq` succeeded with `result`; returns the Start of its key's next record."""
        entry = self._entries[seq]
        if entry.done:
            raise RuntimeError(f"entry {seq} completed twice")
        entry.done = True
        entry.result = result
        self.in_flight -= 1
        if not self.ordered:
            for segment in self._segments:
                if seq in segment.pending:
                    del segment.pending[seq]
                    segment.done.append(entry)
                    break
        if entry.key is NO_KEY:
            return []
        waiting = self._waiting[entry.key]
        if not waiting:
            del self._waiting[entry.key]
            return []
        nxt = waiting.popleft()
        self.in_flight += 1
        return [Start(nxt.seq, nxt.record)]

    # -- output ------------------------------------------------------------------------------------

    def take_ready(self) -> list[Any]:
        """What may leave now, in output order: results, and Mark for each watermark."""
        out: list[Any] = []
        entries = self._entries
        if self.ordered:
            order = self._order
            while order:
                head = order[0]
                if isinstance(head, Mark):
                    out.append(head)
                elif head.done:
                    out.append(head.result)
                    del entries[head.seq]
                else:
                    break
                order.popleft()
            return out
        segments = self._segments
        while True:
            first = segments[0]
            while first.done:
                entry = first.done.popleft()
                out.append(entry.result)
                del entries[entry.seq]
            if first.pending or first.watermark is None:
                return out
            out.append(Mark(first.watermark))
            segments.popleft()
            if not segments:
                segments.append(_Segment())

    # -- checkpoints -------------------------------------------------------------------------------

    def snapshot(self) -> list[tuple[Any, Any] | Mark]:
        """Everything not emitted, in arrival order: (key, record) pairs and Marks."""
        if self.ordered:
            return [e if isinstance(e, Mark) else (e.key, e.record) for e in self._order]
        out: list[tuple[Any, Any] | Mark] = []
        for segment in self._segments:
            records = sorted([*segment.pending.values(), *segment.done], key=lambda e: e.seq)
            out += [(e.key, e.record) for e in records]
            if segment.watermark is not None:
                out.append(Mark(segment.watermark))
        return out
