"""Keyed state kinds beyond ValueState: list, map, reducing and aggregating state, and state TTL.

Each kind reads and writes one table (key -> stored value) for the key of the record being processed
(`ctx.current_key`). A table is a plain dict on the memory backend and a runtime/state/tables.py
BackendTable on rocksdb or remote, so the same code runs on every backend. Two rules make that work:

- A write replaces the stored value, it never mutates it in place: the memory backend's snapshot is a
  shallow copy of the table, encoded later on another thread, and a backend stores bytes, so an in-place
  change would be lost (or, in memory, leak into a checkpoint taken before it). Adding to a list or a map
  therefore rewrites that key's list or map: O(its size); keep per-key collections modest.
- Stored values go through msgpack: tuples come back as lists, map keys should be str, int, float, bytes
  or bool.

TTL (`ttl_ms=` on every kind) is processing-time based, Flink's default policy: a write (create or update)
sets the entry's expiry to now + ttl_ms, a read does not extend it; an expired entry is invisible to every
read and is deleted when a read comes across it, or when the operator's cleanup reaches it
(runtime/execution/ttl_cleanup.py: a few entries for every record processed and a larger share at every
checkpoint, Flink's incremental cleanup; on RocksDB and remote a key group at a time, as a compaction filter
would), so keys nobody reads again do not stay stored for ever. List and map state expire per element and
per map entry; value, reducing and aggregating state as a whole. Expiry times are wall-clock milliseconds
stored with the value, so they survive a checkpoint unchanged: after a restore, an entry that expired while
the job was down is invisible, exactly as if the job had kept running.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

T = TypeVar("T")
K = TypeVar("K")
V = TypeVar("V")
ACC = TypeVar("ACC")

_MISSING: Any = object()


# the shape of a TTL state's stored values, for the cleanup: one [expires, value], a list of [expires, item], a
# map of map key -> [expires, value]
WHOLE, LIST, MAP = "whole", "list", "map"
KEEP: Any = object()  # `expired_action`: the stored value stays as it is
DELETE: Any = object()  # `expired_action`: the key's entry goes


def expired_action(shape: str, stored: Any, now_ms: int) -> Any:
    """What the cleanup does with one stored value of a TTL state of `shape` at `now_ms`: KEEP, DELETE, or the
    value to store instead (a list or map with its expired elements dropped). Pure; a value not shaped as TTL
    state stores it (written before the state had a TTL) is kept."""
    alive: list[Any] | dict[Any, Any]
    try:
        if shape == WHOLE:
            return DELETE if stored[0] <= now_ms else KEEP
        if shape == LIST:
            alive = [pair for pair in stored if pair[0] > now_ms]
        else:
            alive = {k: pair for k, pair in stored.items() if pair[0] > now_ms}
    except (TypeError, IndexError, KeyError, AttributeError):
        return KEEP
    if len(alive) == len(stored):
        return KEEP
    return alive if alive else DELETE


def wall_clock_ms() -> int:
    """Now in wall-clock milliseconds: the clock TTL reads."""
    return int(time.time() * 1000)


Clock = Callable[[], int]


class _KeyedState:
    """What every kind shares: the table, the context whose current key it reads, and TTL."""

    __slots__ = ("_table", "_ctx", "_ttl_ms", "_clock")

    def __init__(self, table: Any, ctx: Any, ttl_ms: int | None, clock: Clock | None) -> None:
        if ttl_ms is not None and ttl_ms <= 0:
            raise ValueError(f"ttl_ms must be positive, got {ttl_ms}")
        self._table = table
        self._ctx = ctx
        self._ttl_ms = ttl_ms
        self._clock = clock or wall_clock_ms

    def _load(self) -> Any:
        """The stored value of the current key, or _MISSING (expired whole-value entries are dropped)."""
        key = self._ctx.current_key
        stored = self._table.get(key, _MISSING)
        if stored is _MISSING or self._ttl_ms is None:
            return stored
        expires, value = stored
        if expires <= self._clock():
            self._table.pop(key, None)
            return _MISSING
        return value

    def _store(self, value: Any) -> None:
        self._table[self._ctx.current_key] = value if self._ttl_ms is None else [self._stamp(), value]

    def _stamp(self) -> int:
        assert self._ttl_ms is not None
        return self._clock() + self._ttl_ms

    def clear(self) -> None:
        self._table.pop(self._ctx.current_key, None)


class TtlValueState(_KeyedState, Generic[T]):
    """A ValueState whose value expires `ttl_ms` after it was last written."""

    __slots__ = ("_default",)

    def __init__(self, table: Any, default: T, ctx: Any, *, ttl_ms: int, clock: Clock | None = None) -> None:
        super().__init__(table, ctx, ttl_ms, clock)
        self._default = default

    def value(self) -> T:
        """The value of the current key, or the default when it has none or it expired."""
        value = self._load()
        return self._default if value is _MISSING else value  # type: ignore[no-any-return]

    def update(self, value: T) -> None:
        """Set the value of the current key; it expires `ttl_ms` from now."""
        self._store(value)


class KeyedListState(_KeyedState, Generic[T]):
    """A list per key (`ctx.list_state(name)`). With TTL each element expires on its own."""

    __slots__ = ()

    def __init__(self, table: Any, ctx: Any, *, ttl_ms: int | None = None, clock: Clock | None = None) -> None:
        super().__init__(table, ctx, ttl_ms, clock)

    def _load_items(self) -> list[Any]:
        stored = self._table.get(self._ctx.current_key, _MISSING)
        if stored is _MISSING:
            return []
        if self._ttl_ms is None:
            return list(stored)
        now = self._clock()
        alive = [pair for pair in stored if pair[0] > now]
        if len(alive) != len(stored):
            self._write_items(alive, stamped=True)
        return [item for _, item in alive]

    def _write_items(self, items: list[Any], *, stamped: bool = False) -> None:
        key = self._ctx.current_key
        if not items:
            self._table.pop(key, None)
        elif self._ttl_ms is None or stamped:
            self._table[key] = items
        else:
            expires = self._stamp()
            self._table[key] = [[expires, item] for item in items]

    def get(self) -> list[T]:
        """The items in the order they were added (a new list: changing it changes nothing stored)."""
        return self._load_items()

    def add(self, item: T) -> None:
        """Append one item to the current key's list."""
        self.add_all([item])

    def add_all(self, items: list[T]) -> None:
        """Append the items, in order, to the current key's list."""
        if not items:
            return
        key = self._ctx.current_key
        if self._ttl_ms is None:
            self._table[key] = [*self._table.get(key, ()), *items]
            return
        now = self._clock()
        expires = now + self._ttl_ms
        kept = [pair for pair in self._table.get(key, ()) if pair[0] > now]
        self._table[key] = kept + [[expires, item] for item in items]

    def update(self, items: list[T]) -> None:
        """Replace the current key's list with `items` (an empty list removes it)."""
        self._write_items(list(items))


class MapState(_KeyedState, Generic[K, V]):
    """A map per key (`ctx.map_state(name)`). With TTL each map entry expires on its own."""

    __slots__ = ()

    def __init__(self, table: Any, ctx: Any, *, ttl_ms: int | None = None, clock: Clock | None = None) -> None:
        super().__init__(table, ctx, ttl_ms, clock)

    def _load_map(self) -> dict[Any, Any]:
        """The current key's live entries, unwrapped; expired ones are deleted on the way."""
        key = self._ctx.current_key
        stored = self._table.get(key, _MISSING)
        if stored is _MISSING:
            return {}
        if self._ttl_ms is None:
            return dict(stored)
        now = self._clock()
        alive = {k: pair for k, pair in stored.items() if pair[0] > now}
        if len(alive) != len(stored):
            if alive:
                self._table[key] = alive
            else:
                self._table.pop(key, None)
        return {k: v for k, (_, v) in alive.items()}

    def _raw(self) -> dict[Any, Any]:
        stored = self._table.get(self._ctx.current_key, _MISSING)
        return {} if stored is _MISSING else stored  # type: ignore[no-any-return]

    def get(self, map_key: K, default: V | None = None) -> V | None:
        """The value at `map_key` of the current key's map, or `default`."""
        return self._load_map().get(map_key, default)

    def contains(self, map_key: K) -> bool:
        """Whether the current key's map has a live entry at `map_key`."""
        return map_key in self._load_map()

    def put(self, map_key: K, value: V) -> None:
        """Set `map_key` to `value` in the current key's map."""
        self.put_all({map_key: value})

    def put_all(self, entries: dict[K, V]) -> None:
        """Set every entry of `entries` in the current key's map."""
        if not entries:
            return
        raw = self._raw()
        if self._ttl_ms is None:
            self._table[self._ctx.current_key] = {**raw, **entries}
            return
        now = self._clock()
        expires = now + self._ttl_ms
        kept = {k: pair for k, pair in raw.items() if pair[0] > now}
        kept.update({k: [expires, v] for k, v in entries.items()})
        self._table[self._ctx.current_key] = kept

    def remove(self, map_key: K) -> None:
        """Remove `map_key` from the current key's map (the map goes when it is empty)."""
        raw = self._raw()
        if map_key not in raw:
            return
        rest = {k: v for k, v in raw.items() if k != map_key}
        if rest:
            self._table[self._ctx.current_key] = rest
        else:
            self._table.pop(self._ctx.current_key, None)

    def items(self) -> Iterator[tuple[K, V]]:
        """The live (map key, value) entries of the current key's map, a copy."""
        return iter(list(self._load_map().items()))

    def keys(self) -> Iterator[K]:
        """The live map keys of the current key's map, a copy."""
        return iter(list(self._load_map()))

    def values(self) -> Iterator[V]:
        """The live values of the current key's map, a copy."""
        return iter(list(self._load_map().values()))

    def is_empty(self) -> bool:
        """Whether the current key's map has no live entry."""
        return not self._load_map()


class ReducingState(_KeyedState, Generic[T]):
    """One value per key folded with `reduce_fn(accumulated, new)` on every `add` (`ctx.reducing_state`)."""

    __slots__ = ("_reduce",)

    def __init__(self, table: Any, ctx: Any, reduce_fn: Callable[[T, T], T], *, ttl_ms: int | None = None,
                 clock: Clock | None = None) -> None:
        super().__init__(table, ctx, ttl_ms, clock)
        self._reduce = reduce_fn

    def get(self) -> T | None:
        """The folded value of the current key, or None."""
        value = self._load()
        return None if value is _MISSING else value  # type: ignore[no-any-return]

    def add(self, value: T) -> None:
        """Fold `value` into the current key's value (it becomes the value when there is none)."""
        current = self._load()
        self._store(value if current is _MISSING else self._reduce(current, value))


class AggregateFunction(Generic[T, ACC, V]):
    """An incremental aggregation (Flink's AggregateFunction): inputs T fold into an accumulator ACC (stored,
    so msgpack-serialisable), whose result V `get_result` reads. `merge` joins two accumulators (session
    windows merge with it)."""

    def create_accumulator(self) -> ACC:
        """A new, empty accumulator."""
        raise NotImplementedError

    def add(self, value: T, accumulator: ACC) -> ACC:
        """The accumulator after adding `value` (return a new one or the changed one)."""
        raise NotImplementedError

    def get_result(self, accumulator: ACC) -> V:
        """The result the accumulator stands for."""
        raise NotImplementedError

    def merge(self, a: ACC, b: ACC) -> ACC:
        """One accumulator holding what `a` and `b` hold."""
        raise NotImplementedError


class AggregatingState(_KeyedState, Generic[T, V]):
    """An accumulator per key, folded by an AggregateFunction-like object (`ctx.aggregating_state`)."""

    __slots__ = ("_agg",)

    def __init__(self, table: Any, ctx: Any, agg: Any, *, ttl_ms: int | None = None,
                 clock: Clock | None = None) -> None:
        super().__init__(table, ctx, ttl_ms, clock)
        self._agg = agg

    def get(self) -> V | None:
        """The result of the current key's accumulator, or None when it has none."""
        acc = self._load()
        return None if acc is _MISSING else self._agg.get_result(acc)  # type: ignore[no-any-return]

    def add(self, value: T) -> None:
        """Add `value` to the current key's accumulator (a new one when it has none)."""
        acc = self._load()
        self._store(self._agg.add(value, self._agg.create_accumulator() if acc is _MISSING else acc))
