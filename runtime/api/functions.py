"""User function base classes and the context they receive."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from runtime.api.schema import Schema, schema_of
from runtime.api.state import (
    LIST,
    MAP,
    WHOLE,
    AggregatingState,
    Clock,
    KeyedListState,
    MapState,
    ReducingState,
    TtlValueState,
    wall_clock_ms,
)
from runtime.api.time import MIN_WATERMARK

T = TypeVar("T")


class ValueState(Generic[T]):
    """One value per key; reads and writes apply to the key of the current record."""

    __slots__ = ("_table", "_default", "_ctx")

    def __init__(self, table: dict[Any, Any], default: T, ctx: KeyedContext) -> None:
        self._table = table
        self._default = default
        self._ctx = ctx

    def value(self) -> T:
        """The value of the current key, or the default when it has none."""
        return self._table.get(self._ctx.current_key, self._default)

    def update(self, value: T) -> None:
        """Set the value of the current key."""
        self._table[self._ctx.current_key] = value

    def clear(self) -> None:
        """Remove the value of the current key (`value()` gives the default again)."""
        self._table.pop(self._ctx.current_key, None)


_ABSENT = object()


class SchemaValueState(ValueState[T]):
    """A value state whose default is a record (a dataclass instance or a dict): values that gained a field since
    the checkpoint read back with its default, incompatible ones are refused (runtime/api/schema.py)."""

    __slots__ = ("_schema",)

    def __init__(self, table: dict[Any, Any], default: T, ctx: KeyedContext, schema: Schema) -> None:
        super().__init__(table, default, ctx)
        self._schema = schema
        if type(table) is dict:  # restored in memory: every value is checked (and filled) now, at open
            for key, stored in list(table.items()):
                table[key] = schema.dump(schema.load(stored))

    def value(self) -> T:
        stored = self._table.get(self._ctx.current_key, _ABSENT)
        return self._default if stored is _ABSENT else self._schema.load(stored)  # type: ignore[no-any-return]

    def update(self, value: T) -> None:
        self._table[self._ctx.current_key] = self._schema.dump(value)


@dataclass(frozen=True)
class OutputTag:
    """Names a side output of an operator: `ctx.output(tag, value)` sends `value` there, and
    `stream.side_output(tag)` is the stream of those values. A side output nobody consumes is dropped."""

    name: str

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"an OutputTag needs a non-empty name, got {self.name!r}")


def _no_side_outputs(tag: str, value: Any) -> None:
    pass


class Context:
    """What a process function sees: where to emit, and which subtask it is.

    With event time (a source with `watermarks=`): `timestamp` is the event time of the record being
    processed (records emitted inherit it) and `current_watermark` the operator's watermark."""

    __slots__ = ("emit", "subtask_index", "parallelism", "operator_name", "timestamp", "current_watermark",
                 "_side")

    def __init__(self, emit: Callable[[Any], None], subtask_index: int, parallelism: int, operator_name: str) -> None:
        self.emit = emit
        self.subtask_index = subtask_index
        self.parallelism = parallelism
        self.operator_name = operator_name
        self.timestamp: int | None = None
        self.current_watermark: int = MIN_WATERMARK
        self._side: Callable[[str, Any], None] = _no_side_outputs  # the runtime routes side outputs

    def output(self, tag: OutputTag, value: Any) -> None:
        """Send `value` to the side output `tag` (with event time it carries the current timestamp)."""
        self._side(tag.name, value)


class KeyedContext(Context):
    """A context with keyed state, scoped to the key of the record being processed."""

    __slots__ = ("current_key", "_state", "timers", "time_domain", "ttl_states", "ttl_clock")

    def __init__(self, emit: Callable[[Any], None], subtask_index: int, parallelism: int, operator_name: str,
                 state: dict[str, dict[Any, Any]]) -> None:
        super().__init__(emit, subtask_index, parallelism, operator_name)
        self.current_key: Any = None
        self._state = state
        self.timers: TimerService = TimerService()  # the runtime installs the real one
        self.time_domain: str | None = None  # in on_timer: "event_time" or "processing_time"
        # state name -> the shape of its stored values (runtime/api/state.py), for each state with a TTL: what the
        # operator's cleanup sweeps (runtime/execution/ttl_cleanup.py)
        self.ttl_states: dict[str, str] = {}
        self.ttl_clock: Clock = wall_clock_ms  # TTL's clock (tests set their own before open)

    def _ttl(self, name: str, ttl_ms: int | None, shape: str) -> None:
        if ttl_ms is not None:
            self.ttl_states[name] = shape

    def state_table(self, name: str) -> Any:
        """The table of state `name` (a dict, or a BackendTable on a state backend)."""
        return self._state.setdefault(name, {})

    def value_state(self, name: str, default: Any = None, *,
                    ttl_ms: int | None = None) -> ValueState[Any] | TtlValueState[Any]:
        """One value per key; with `ttl_ms` it expires that long after its last write (runtime/api/state.py)."""
        table = self._state.setdefault(name, {})
        if ttl_ms is not None:
            self._ttl(name, ttl_ms, WHOLE)
            return TtlValueState(table, default, self, ttl_ms=ttl_ms, clock=self.ttl_clock)
        schema = schema_of(name, default)  # a record default: its values may gain fields (runtime/api/schema.py)
        return ValueState(table, default, self) if schema is None else SchemaValueState(table, default, self, schema)

    # -- more state kinds (runtime/api/state.py), on every state backend ---------------------------------

    def list_state(self, name: str, *, ttl_ms: int | None = None) -> KeyedListState[Any]:
        """A list per key (KeyedListState); with `ttl_ms` each item expires on its own."""
        self._ttl(name, ttl_ms, LIST)
        return KeyedListState(self._state.setdefault(name, {}), self, ttl_ms=ttl_ms, clock=self.ttl_clock)

    def map_state(self, name: str, *, ttl_ms: int | None = None) -> MapState[Any, Any]:
        """A map per key (MapState); with `ttl_ms` each map entry expires on its own."""
        self._ttl(name, ttl_ms, MAP)
        return MapState(self._state.setdefault(name, {}), self, ttl_ms=ttl_ms, clock=self.ttl_clock)

    def reducing_state(self, name: str, reduce_fn: Callable[[Any, Any], Any], *,
                       ttl_ms: int | None = None) -> ReducingState[Any]:
        """One value per key folded with `reduce_fn(accumulated, new)` on every `add`."""
        self._ttl(name, ttl_ms, WHOLE)
        return ReducingState(self._state.setdefault(name, {}), self, reduce_fn, ttl_ms=ttl_ms, clock=self.ttl_clock)

    def aggregating_state(self, name: str, agg: Any, *, ttl_ms: int | None = None) -> AggregatingState[Any, Any]:
        """`agg`: an AggregateFunction (create_accumulator, add, get_result, merge) or any object like one."""
        self._ttl(name, ttl_ms, WHOLE)
        return AggregatingState(self._state.setdefault(name, {}), self, agg, ttl_ms=ttl_ms, clock=self.ttl_clock)


class ProcessFunction:
    """Per-record logic with a context; override `process`."""

    def open(self, ctx: Context) -> None:
        """Runs once per task before the first record: make state handles here (the runtime may restore them
        first)."""
        pass

    def process(self, record: Any, ctx: Any) -> None:
        """Handle one record: emit outputs with `ctx.emit(value)`, side outputs with `ctx.output(tag, value)`."""
        raise NotImplementedError

    def close(self) -> None:
        """Runs once when the task ends (also after a failure)."""
        pass


class KeyedProcessFunction(ProcessFunction):
    """Per-record logic on a keyed stream, with keyed state from `ctx.value_state` and timers from
    `ctx.timers`; override `on_timer` to act when one fires."""

    def on_timer(self, timestamp: int, ctx: Any) -> None:
        """A timer of `ctx.current_key` fired: `ctx.timestamp` is `timestamp` (records emitted carry it),
        `ctx.time_domain` says which kind. Event-time timers fire when the watermark reaches `timestamp`."""


# -- operator list state (non-keyed) ----------------------------------------------------------------------
#
# Kept apart from the keyed context: a non-keyed ProcessFunction gets an OperatorContext, whose list states are
# checkpointed with the task and redistributed on a rescale (runtime/checkpointing/rescaling.py, rescale_lists).


class ListState(Generic[T]):
    """A list of items of one subtask of a non-keyed function (like Flink's operator ListState). Items are
    immutable by contract (a snapshot copies the list, not the items) and must be msgpack-serialisable."""

    __slots__ = ("_entry",)

    def __init__(self, entry: list[Any]) -> None:
        self._entry = entry  # [mode, items]: the runtime restores the items in place

    def get(self) -> list[T]:
        """A copy of the items, in the order they were added."""
        return list(self._entry[1])

    def add(self, item: T) -> None:
        """Append one item."""
        self._entry[1].append(item)

    def add_all(self, items: list[T]) -> None:
        """Append the items, in order."""
        self._entry[1].extend(items)

    def update(self, items: list[T]) -> None:
        """Replace all items with `items`."""
        self._entry[1][:] = list(items)

    def clear(self) -> None:
        """Remove all items."""
        self._entry[1].clear()

    def __len__(self) -> int:
        return len(self._entry[1])


class OperatorContext(Context):
    """The context of a non-keyed ProcessFunction: a Context with list state.

    `list_state(name)`: on a rescale its items are split round robin over the new subtasks (each item lands in
    exactly one). `union_list_state(name)`: every new subtask gets all items of all old subtasks. On a function
    fed by a broadcast edge both are replicated: a new subtask gets the lists of the old subtask it continues."""

    __slots__ = ("_lists",)

    def __init__(self, emit: Callable[[Any], None], subtask_index: int, parallelism: int, operator_name: str,
                 lists: dict[str, list[Any]]) -> None:
        super().__init__(emit, subtask_index, parallelism, operator_name)
        self._lists = lists

    def list_state(self, name: str) -> ListState[Any]:
        """A list of this subtask, split round robin over the new subtasks on a rescale."""
        return ListState(self._entry(name, "split"))

    operator_list_state = list_state

    def union_list_state(self, name: str) -> ListState[Any]:
        """A list of this subtask; on a rescale every new subtask gets the items of all old subtasks."""
        return ListState(self._entry(name, "union"))

    def _entry(self, name: str, mode: str) -> list[Any]:
        entry = self._lists.setdefault(name, [mode, []])
        if entry[0] != mode:
            raise ValueError(f"list state {name!r} of {self.operator_name} is a {entry[0]} list, not a {mode} one")
        return entry


# -- timers (event time) ----------------------------------------------------------------------------------


class TimerService:
    """`ctx.timers` in a KeyedProcessFunction: timers of the current key, deduplicated per (key, timestamp),
    kept in keyed state (checkpointed and rescaled with it). Timestamps are int milliseconds."""

    __slots__ = ()

    def register_event_time(self, timestamp: int) -> None:
        """Call `on_timer` for the current key once the watermark reaches `timestamp` (once per key and
        timestamp)."""
        raise RuntimeError("timers are only available in a KeyedProcessFunction run by the runtime")

    def register_processing_time(self, timestamp: int) -> None:
        """Call `on_timer` for the current key once the wall clock reaches `timestamp`."""
        raise RuntimeError("timers are only available in a KeyedProcessFunction run by the runtime")

    def delete_event_time(self, timestamp: int) -> None:
        """Remove the current key's event-time timer at `timestamp`, if there is one."""
        raise RuntimeError("timers are only available in a KeyedProcessFunction run by the runtime")

    def delete_processing_time(self, timestamp: int) -> None:
        """Remove the current key's processing-time timer at `timestamp`, if there is one."""
        raise RuntimeError("timers are only available in a KeyedProcessFunction run by the runtime")

    def current_processing_time(self) -> int:
        """The wall clock in milliseconds, as processing-time timers read it."""
        raise RuntimeError("timers are only available in a KeyedProcessFunction run by the runtime")
