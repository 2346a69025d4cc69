"""The user's side of asynchronous keyed state: `AsyncKeyedProcessFunction` and its state handles.

A function's `process` is a coroutine; `await state.value()` and `await state.update(v)` are requests the
task's runner (runtime/execution/async_state.py) batches into backend round trips while records of other
keys run (README: Asynchronous state). This module holds only what user code sees; the runner implements
`AsyncKeyedContext`'s three requests (`_read`, `_write`, `_delete`).

State handles may be made once in `open(ctx)` and used by every record: a handle finds the record it serves
through a context variable that each record's asyncio task sets for itself (`CURRENT_RECORD`).
"""

from __future__ import annotations

import contextvars
from collections.abc import Awaitable
from typing import Any

CURRENT_RECORD: contextvars.ContextVar[AsyncKeyedContext] = contextvars.ContextVar("sluice_async_record")


class AsyncStateUsageError(RuntimeError):
    """Asynchronous state was used outside a record (in open(), or from a task the runner did not start)."""


class AsyncValueState:
    """One value per key, read and written asynchronously.

    Made by a record's context, it serves that record; made in `open()`, it serves whichever record uses it
    (the current record's context variable says which)."""

    __slots__ = ("_ctx", "_name", "_default")

    def __init__(self, ctx: AsyncKeyedContext | None, name: str, default: Any) -> None:
        self._ctx = ctx
        self._name = name
        self._default = default

    def _current(self) -> AsyncKeyedContext:
        if self._ctx is not None:
            return self._ctx
        ctx = CURRENT_RECORD.get(None)
        if ctx is None:
            raise AsyncStateUsageError(f"state {self._name!r} used outside process()/on_timer()")
        return ctx

    async def value(self) -> Any:
        """The value of the current record's key, or the default."""
        return await self._current()._read(self._name, self._default)

    async def update(self, value: Any) -> None:
        """Set the value of the current record's key."""
        await self._current()._write(self._name, value)

    async def clear(self) -> None:
        """Remove the value of the current record's key."""
        await self._current()._delete(self._name)


class AsyncListState:
    """A list per key, stored as one value: each change reads and rewrites it (the key is held meanwhile)."""

    __slots__ = ("_value",)

    def __init__(self, ctx: AsyncKeyedContext | None, name: str) -> None:
        self._value = AsyncValueState(ctx, name, None)

    async def get(self) -> list[Any]:
        """The key's items, a new list."""
        return list(await self._value.value() or [])

    async def add(self, item: Any) -> None:
        """Append one item to the key's list."""
        await self._value.update([*(await self.get()), item])

    async def update(self, items: list[Any]) -> None:
        """Replace the key's list with `items` (an empty list removes it)."""
        await (self._value.update(list(items)) if items else self._value.clear())

    async def clear(self) -> None:
        """Remove the key's list."""
        await self._value.clear()


class AsyncMapState:
    """A map per key, stored as one value (small maps; per-entry storage comes with MapState proper)."""

    __slots__ = ("_value",)

    def __init__(self, ctx: AsyncKeyedContext | None, name: str) -> None:
        self._value = AsyncValueState(ctx, name, None)

    async def items(self) -> dict[Any, Any]:
        """The key's map, a new dict."""
        return dict(await self._value.value() or {})

    async def get(self, map_key: Any, default: Any = None) -> Any:
        """The value at `map_key` in the key's map, or `default`."""
        return (await self.items()).get(map_key, default)

    async def put(self, map_key: Any, value: Any) -> None:
        """Set `map_key` to `value` in the key's map."""
        await self._value.update({**(await self.items()), map_key: value})

    async def remove(self, map_key: Any) -> None:
        """Remove `map_key` from the key's map (the map goes when it is empty)."""
        items = await self.items()
        items.pop(map_key, None)
        await (self._value.update(items) if items else self._value.clear())

    async def clear(self) -> None:
        """Remove the key's map."""
        await self._value.clear()


class AsyncStateFactory:
    """Makes state handles: `open(ctx)` gets one whose handles serve every record (see AsyncValueState)."""

    _prefix = ""

    def _bound(self) -> AsyncKeyedContext | None:
        return None

    def value_state(self, name: str, default: Any = None) -> AsyncValueState:
        """A handle on one value per key, read and written with `await`."""
        return AsyncValueState(self._bound(), self._prefix + name, default)

    def list_state(self, name: str) -> AsyncListState:
        """A handle on a list per key."""
        return AsyncListState(self._bound(), self._prefix + name)

    def map_state(self, name: str) -> AsyncMapState:
        """A handle on a map per key."""
        return AsyncMapState(self._bound(), self._prefix + name)


class AsyncOpenContext(AsyncStateFactory):
    """What `open` sees: where the operator runs, and state handles for its records."""

    def __init__(self, *, subtask_index: int, parallelism: int, name: str, state_prefix: str = "") -> None:
        self.subtask_index = subtask_index
        self.parallelism = parallelism
        self.name = name
        self._prefix = state_prefix


class AsyncKeyedContext(AsyncStateFactory):
    """What `process` sees: the record's key (and event timestamp), `emit`, and asynchronous state of that key.

    The runner's subclass carries out the requests."""

    key: Any
    timestamp: int | None  # the record's event time (jobs with event time), else None

    def _bound(self) -> AsyncKeyedContext | None:
        return self

    def emit(self, value: Any) -> None:
        """An output of this record, released when the record finishes."""
        raise NotImplementedError

    def register_event_time_timer(self, timestamp: int) -> None:
        """Call `on_timer(timestamp, None, ctx)` for this key once the watermark reaches `timestamp` (a job with
        event time). Takes effect when this record finishes, like its state writes."""
        raise NotImplementedError

    def delete_event_time_timer(self, timestamp: int) -> None:
        """Remove this key's event-time timer at `timestamp`; takes effect when this record finishes."""
        raise NotImplementedError

    def _read(self, name: str, default: Any) -> Awaitable[Any]:
        raise NotImplementedError

    def _write(self, name: str, value: Any) -> Awaitable[None]:
        raise NotImplementedError

    def _delete(self, name: str) -> Awaitable[None]:
        raise NotImplementedError


class AsyncKeyedProcessFunction:
    """Per-record logic with asynchronous keyed state: override `async def process(self, record, ctx)`.

    `open(ctx)` (plain or async) runs once per task before any record: make state handles there with
    `ctx.value_state(...)` and use them in every record."""

    def open(self, ctx: AsyncOpenContext) -> Any:
        """Runs once before the first record; may be `async def`."""

    def close(self) -> None:
        """Runs once when the task ends."""

    async def process(self, record: Any, ctx: AsyncKeyedContext) -> None:
        """Handle one record of `ctx.key`: await state reads and writes, `ctx.emit` outputs."""
        raise NotImplementedError

    async def on_timer(self, timestamp: int, payload: Any, ctx: AsyncKeyedContext) -> None:
        """A timer of `ctx.key` is due; runs like a record of its key, after every record before the watermark
        that made it due and before that watermark goes on. In a task: an event-time timer the function
        registered (`ctx.register_event_time_timer`), `timestamp` its time, `payload` None."""
