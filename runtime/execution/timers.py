"""Timers of keyed operators: stored in keyed state, ordered by a heap, fired in bounded chunks.

A `TimerQueue` holds the timers of one time domain of one operator. Their truth is a keyed-state table
(key -> tuple of timestamps), so they are snapshotted, restored and split at rescaling by key group exactly
like the operator's other keyed state; the heap is only an index over that table, rebuilt after a restore.
A timer is (key, timestamp): registering it twice keeps one. Deleted timers stay in the heap until they come
up, and are skipped then.

Timers with equal timestamps fire ordered by their packed key, so the order does not depend on when they
were registered or whether the task was restored in between.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable
from typing import Any

import msgpack

from runtime.api.functions import TimerService

EVENT_TIME = "event_time"
PROCESSING_TIME = "processing_time"
# keyed-state table names (a user's value_state cannot clash: names from users do not start with "\0")
TIMER_TABLES = {EVENT_TIME: "\0timers:event", PROCESSING_TIME: "\0timers:processing"}

_pack = msgpack.Packer(use_bin_type=True).pack


def _unpack_key(data: bytes) -> Any:
    return msgpack.unpackb(data, use_list=False, raw=False, strict_map_key=False)


class TimerQueue:
    __slots__ = ("table", "_heap")

    def __init__(self, table: dict[Any, tuple[int, ...]]) -> None:
        self.table = table
        self._heap: list[tuple[int, bytes]] = []
        self.rebuild()

    def rebuild(self) -> None:
        """Index the table again (after it was restored in place)."""
        self._heap = [(ts, _pack(key)) for key, stamps in self.table.items() for ts in stamps]
        heapq.heapify(self._heap)

    def __len__(self) -> int:
        return sum(len(stamps) for stamps in self.table.values())

    def register(self, key: Any, ts: int) -> bool:
        stamps = self.table.get(key, ())
        if ts in stamps:
            return False
        self.table[key] = (*stamps, ts)
        heapq.heappush(self._heap, (ts, _pack(key)))
        return True

    def delete(self, key: Any, ts: int) -> bool:
        stamps = self.table.get(key, ())
        if ts not in stamps:
            return False
        rest = tuple(t for t in stamps if t != ts)
        if rest:
            self.table[key] = rest
        else:
            del self.table[key]
        return True

    def peek(self) -> int | None:
        """The earliest registered timestamp, or None."""
        heap = self._heap
        while heap:
            ts, packed = heap[0]
            if ts in self.table.get(_unpack_key(packed), ()):
                return ts
            heapq.heappop(heap)  # deleted (or a duplicate of one that fired)
        return None

    def pop_due(self, upto: int) -> tuple[int, Any] | None:
        """Remove and return the earliest timer with timestamp <= `upto`, as (timestamp, key), or None."""
        heap = self._heap
        while heap and heap[0][0] <= upto:
            ts, packed = heapq.heappop(heap)
            key = _unpack_key(packed)
            if self.delete(key, ts):
                return ts, key
        return None


class KeyedTimers(TimerService):
    """`ctx.timers` of a keyed operator: timers for the key of the record being processed."""

    __slots__ = ("event", "processing", "_key_of")

    def __init__(self, event: TimerQueue, processing: TimerQueue, key_of: Callable[[], Any]) -> None:
        self.event = event
        self.processing = processing
        self._key_of = key_of

    def register_event_time(self, timestamp: int) -> None:
        self.event.register(self._key_of(), int(timestamp))

    def register_processing_time(self, timestamp: int) -> None:
        self.processing.register(self._key_of(), int(timestamp))

    def delete_event_time(self, timestamp: int) -> None:
        self.event.delete(self._key_of(), int(timestamp))

    def delete_processing_time(self, timestamp: int) -> None:
        self.processing.delete(self._key_of(), int(timestamp))

    def current_processing_time(self) -> int:
        return current_time_ms()


def current_time_ms() -> int:
    return int(time.time() * 1000)
