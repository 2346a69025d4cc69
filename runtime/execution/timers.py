"""Timers of keyed operators: stored in keyed state, ordered by a heap, fired in bounded chunks.

A `TimerQueue` holds the timers of one time domain of one operator. Their truth is a keyed-state table
(key -> tuple of timestamps), so they are snapshotted, restored and split at rescaling by key group exactly
like the operator's other keyed state; the heap is only an index over that table, rebuilt after a restore.
A timer is (key, timestamp): registering it twice keeps one. Deleted timers stay in the heap until they come
up, and are skipped then.

Timers with equal timestamps fire ordered by their packed key, so the order does not depend on when they
were registered or whether the task was restored in between.

A `TimerIndex` stands in for an operator's event-time `TimerQueue` when the operator's own state already says
which timers exist (a window operator's open windows: runtime/api/windows.py). It keeps no table of its own:
timestamp -> set of keys, derived from that state at a restore, so a timestamp shared by many keys (every key's
window ending at the same time) costs one heap entry, and registering costs a set insert. It fires in the same
order as a `TimerQueue` (timestamp, then packed key).
"""

from __future__ import annotations

import bisect
import heapq
import time
from collections.abc import Callable, Iterable
from typing import Any

import msgpack

from runtime.api.functions import TimerService
from runtime.common.values import packer_default, unpack_ext

EVENT_TIME = "event_time"
PROCESSING_TIME = "processing_time"
# keyed-state table names (a user's value_state cannot clash: names from users do not start with "\0")
TIMER_TABLES = {EVENT_TIME: "\0timers:event", PROCESSING_TIME: "\0timers:processing"}

_pack = msgpack.Packer(use_bin_type=True, default=packer_default("a timer's key")).pack


def _unpack_key(data: bytes) -> Any:
    return msgpack.unpackb(data, use_list=False, raw=False, strict_map_key=False, ext_hook=unpack_ext)


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


class TimerIndex(TimerQueue):
    """Event-time timers derived from an operator's state (module docstring): `derive(table)` yields every
    (key, timestamp) that state implies; `table` is the operator's timer table, empty in this form (`derive`
    may read timers a checkpoint of the per-key form left there, and must empty it)."""

    __slots__ = ("_derive", "_keys", "_stamps", "_due", "_next", "_due_ts")

    def __init__(self, table: dict[Any, tuple[int, ...]],
                 derive: Callable[[dict[Any, tuple[int, ...]]], Iterable[tuple[Any, int]]]) -> None:
        self._derive = derive
        super().__init__(table)  # calls rebuild

    def rebuild(self) -> None:
        """Derive the timers from the operator's state again (after a restore)."""
        self._keys: dict[int, set[Any]] = {}
        self._stamps: list[int] = []  # a heap of the timestamps in _keys (and a few stale ones)
        self._due: list[Any] = []  # the keys of the timestamp being fired, by packed key
        self._next = 0  # the next of them to fire
        self._due_ts: int | None = None
        for key, ts in list(self._derive(self.table)):
            self.register(key, ts)

    def __len__(self) -> int:
        return len(self._due) - self._next + sum(len(keys) for keys in self._keys.values())

    def register(self, key: Any, ts: int) -> bool:
        if ts == self._due_ts and self._next < len(self._due):  # between two chunks of its timestamp
            due = self._due
            if key in due[self._next:]:
                return False
            bisect.insort(due, key, lo=self._next, key=_pack)
            return True
        keys = self._keys.get(ts)
        if keys is None:
            self._keys[ts] = {key}
            heapq.heappush(self._stamps, ts)
            return True
        if key in keys:
            return False
        keys.add(key)
        return True

    def delete(self, key: Any, ts: int) -> bool:
        if ts == self._due_ts and key in self._due[self._next:]:
            self._due.remove(key)
            return True
        keys = self._keys.get(ts)
        if keys is None or key not in keys:
            return False
        keys.discard(key)
        return True

    def _earliest_pending(self) -> int | None:
        """The earliest timestamp with keys in `_keys` (not the one being fired)."""
        heap, by_ts = self._stamps, self._keys
        while heap:
            ts = heap[0]
            if by_ts.get(ts):
                return ts
            heapq.heappop(heap)  # every key deleted, or a duplicate of one that fired
            by_ts.pop(ts, None)
        return None

    def _resume_in_order(self) -> None:
        """A timer registered, between two chunks, for a timestamp before the one being fired fires first (as the
        per-key queue does): put the rest of the current timestamp's keys back and start over from the heap."""
        if self._next < len(self._due):
            earliest, due_ts = self._earliest_pending(), self._due_ts
            assert due_ts is not None
            if earliest is not None and earliest < due_ts:
                rest = self._due[self._next:]
                keys = self._keys.get(due_ts)
                if keys is None:
                    self._keys[due_ts] = set(rest)
                    heapq.heappush(self._stamps, due_ts)
                else:
                    keys.update(rest)
                self._due, self._next, self._due_ts = [], 0, None

    def peek(self) -> int | None:
        self._resume_in_order()
        if self._next < len(self._due):
            return self._due_ts
        return self._earliest_pending()

    def pop_due(self, upto: int) -> tuple[int, Any] | None:
        self._resume_in_order()
        if self._next >= len(self._due):
            ts = self.peek()
            if ts is None or ts > upto:
                return None
            heapq.heappop(self._stamps)
            self._due = sorted(self._keys.pop(ts), key=_pack)
            self._next = 0
            self._due_ts = ts
        elif self._due_ts > upto:  # type: ignore[operator]
            return None
        key = self._due[self._next]
        self._next += 1
        return self._due_ts, key  # type: ignore[return-value]


class KeyedTimers(TimerService):
    """`ctx.timers` of a keyed operator: timers for the key of the record being processed."""

    __slots__ = ("event", "processing", "_key_of")

    def __init__(self, event: TimerQueue, processing: TimerQueue, key_of: Callable[[], Any]) -> None:
        self.event = event
        self.processing = processing
        self._key_of = key_of

    def index_event_timers(self, derive: Callable[[dict[Any, Any]], list[tuple[Any, int]]]) -> None:
        """Event-time timers that follow from the operator's state (RuntimeHooks.event_timers_from_state): an
        index per timestamp over the same table instead of a timer queue."""
        self.event = TimerIndex(self.event.table, derive)  # type: ignore[assignment]

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
