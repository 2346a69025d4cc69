"""Functions of two inputs: `a.connect(b).process(fn)` and the broadcast state pattern.

A two-input function sees the records of both inputs in one task, with one context: keyed state (every kind)
and timers are shared by the two sides, `ctx.current_watermark` is the minimum of the two inputs' watermarks
(an idle input does not count), side outputs go out with `ctx.output(tag, value)`.

- `CoProcessFunction`: `process1(record, ctx)` for the first input, `process2(record, ctx)` for the second.
- `KeyedCoProcessFunction`: the same on `a.key_by(f).connect(b.key_by(g))`, with keyed state scoped to the
  key of the record (f's key on the first input, g's on the second) and `on_timer(timestamp, ctx)`.
- `BroadcastProcessFunction` / `KeyedBroadcastProcessFunction`: `stream.connect(rules.broadcast(descriptor))`;
  `process_element(record, ctx)` reads `ctx.broadcast_state(descriptor)` (read only), and
  `process_broadcast_element(record, ctx)` writes it. Every subtask receives every broadcast record, so every
  subtask holds the same broadcast state if the function updates it from those records alone; it is
  checkpointed with the task and on a rescale every new subtask gets a copy of it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from runtime.api.functions import KeyedContext, OperatorContext

BROADCAST_MODE = "broadcast"  # the list-state mode that holds a broadcast state (a dict) in a task's lists


def copy_items(items: list[Any] | dict[Any, Any]) -> list[Any] | dict[Any, Any]:
    """A copy of a list state's items, or of a broadcast state's map (mode BROADCAST_MODE): snapshots, restores
    and rescales copy the container, never the (immutable) values."""
    return dict(items) if isinstance(items, dict) else list(items)


class CoProcessFunction:
    """Per-record logic over two inputs; override `process1` and `process2`."""

    def open(self, ctx: Any) -> None:
        """Runs once per task before the first record of either input."""
        pass

    def process1(self, record: Any, ctx: Any) -> None:
        """A record of the first input (`a` in `a.connect(b)`)."""
        raise NotImplementedError

    def process2(self, record: Any, ctx: Any) -> None:
        """A record of the second input (`b` in `a.connect(b)`)."""
        raise NotImplementedError

    def close(self) -> None:
        """Runs once when the task ends (also after a failure)."""
        pass


class KeyedCoProcessFunction(CoProcessFunction):
    """A CoProcessFunction on two keyed streams: `ctx` is a KeyedContext whose state and timers both sides
    share (the key of a record of input 1 and of input 2 must mean the same thing: an order id on both)."""

    def on_timer(self, timestamp: int, ctx: Any) -> None:
        """A timer of `ctx.current_key` fired (registered from either side)."""


@dataclass(frozen=True)
class MapStateDescriptor:
    """Names a broadcast state: a map from keys to values, the same on every subtask."""

    name: str

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"a MapStateDescriptor needs a non-empty name, got {self.name!r}")


class BroadcastStateError(RuntimeError):
    """A write to broadcast state from the non-broadcast side (it must stay the same on every subtask)."""


class BroadcastState:
    """`ctx.broadcast_state(descriptor)`: a map. Writable in `process_broadcast_element`, read only in
    `process_element` (a write raises BroadcastStateError). Keys and values must be msgpack-serialisable and
    values are immutable by contract (a snapshot copies the map, not the values)."""

    __slots__ = ("_table", "_writable", "_name")

    def __init__(self, table: dict[Any, Any], writable: bool, name: str) -> None:
        self._table = table
        self._writable = writable
        self._name = name

    def get(self, key: Any, default: Any = None) -> Any:
        return self._table.get(key, default)

    def contains(self, key: Any) -> bool:
        return key in self._table

    __contains__ = contains

    def items(self) -> list[tuple[Any, Any]]:
        return list(self._table.items())

    def keys(self) -> list[Any]:
        return list(self._table)

    def values(self) -> list[Any]:
        return list(self._table.values())

    def __iter__(self) -> Iterator[Any]:
        return iter(list(self._table))

    def __len__(self) -> int:
        return len(self._table)

    def _check_writable(self) -> None:
        if not self._writable:
            raise BroadcastStateError(f"broadcast state {self._name!r} is read only in process_element: "
                                      "update it in process_broadcast_element")

    def put(self, key: Any, value: Any) -> None:
        self._check_writable()
        self._table[key] = value

    def put_all(self, entries: dict[Any, Any]) -> None:
        self._check_writable()
        self._table.update(entries)

    def remove(self, key: Any) -> None:
        self._check_writable()
        self._table.pop(key, None)

    def clear(self) -> None:
        self._check_writable()
        self._table.clear()


class _BroadcastAccess:
    """How a broadcast context finds its maps: in the task's list state, one [BROADCAST_MODE, dict] entry per
    descriptor (checkpointed and replicated on a rescale with the task's lists)."""

    def __init__(self, lists: dict[str, list[Any]], descriptors: tuple[MapStateDescriptor, ...],
                 operator_name: str) -> None:
        self.lists = lists
        self.names = {d.name for d in descriptors}
        self.operator_name = operator_name
        self.writable = False

    def state(self, descriptor: MapStateDescriptor) -> BroadcastState:
        name = descriptor.name if isinstance(descriptor, MapStateDescriptor) else descriptor
        if name not in self.names:
            raise KeyError(f"{self.operator_name} has no broadcast state {name!r}: its broadcast input was made "
                           f"with {sorted(self.names)}")
        entry = self.lists.setdefault(name, [BROADCAST_MODE, {}])
        return BroadcastState(entry[1], self.writable, name)


class BroadcastContext(OperatorContext):
    """The context of a BroadcastProcessFunction: an OperatorContext with `broadcast_state(descriptor)`."""

    __slots__ = ("_broadcast",)

    def __init__(self, emit: Callable[[Any], None], subtask_index: int, parallelism: int, operator_name: str,
                 lists: dict[str, list[Any]], descriptors: tuple[MapStateDescriptor, ...]) -> None:
        super().__init__(emit, subtask_index, parallelism, operator_name, lists)
        self._broadcast = _BroadcastAccess(lists, descriptors, operator_name)

    def broadcast_state(self, descriptor: MapStateDescriptor) -> BroadcastState:
        """The broadcast state named by `descriptor` (read only in process_element)."""
        return self._broadcast.state(descriptor)


class KeyedBroadcastContext(KeyedContext):
    """The context of a KeyedBroadcastProcessFunction: a KeyedContext with `broadcast_state(descriptor)`. In
    `process_broadcast_element` there is no current key (`ctx.current_key` is None): use keyed state from
    `process_element` and `on_timer`."""

    __slots__ = ("_broadcast",)

    def __init__(self, emit: Callable[[Any], None], subtask_index: int, parallelism: int, operator_name: str,
                 state: dict[str, dict[Any, Any]], lists: dict[str, list[Any]],
                 descriptors: tuple[MapStateDescriptor, ...]) -> None:
        super().__init__(emit, subtask_index, parallelism, operator_name, state)
        self._broadcast = _BroadcastAccess(lists, descriptors, operator_name)

    def broadcast_state(self, descriptor: MapStateDescriptor) -> BroadcastState:
        """The broadcast state named by `descriptor` (read only in process_element and on_timer)."""
        return self._broadcast.state(descriptor)


class BroadcastProcessFunction:
    """The broadcast state pattern on a non-keyed stream: `stream.connect(rules.broadcast(descriptor))`."""

    def open(self, ctx: Any) -> None:
        """Runs once per task before the first record (broadcast state is already restored)."""
        pass

    def process_element(self, record: Any, ctx: Any) -> None:
        """A record of the main input; `ctx.broadcast_state(descriptor)` is read only here."""
        raise NotImplementedError

    def process_broadcast_element(self, record: Any, ctx: Any) -> None:
        """A record of the broadcast input (every subtask gets each one); update the broadcast state here."""
        raise NotImplementedError

    def close(self) -> None:
        pass


class KeyedBroadcastProcessFunction(BroadcastProcessFunction):
    """The broadcast state pattern on a keyed stream: `stream.key_by(f).connect(rules.broadcast(descriptor))`,
    with keyed state and timers on the main side."""

    def on_timer(self, timestamp: int, ctx: Any) -> None:
        """A timer of `ctx.current_key` fired (broadcast state is read only here)."""
