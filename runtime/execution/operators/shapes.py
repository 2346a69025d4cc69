"""How records look inside a chain: as they are, or `(timestamp, record)` pairs in a job with event time.

Operators are written once, over the user's records (kinds.py). The shape is the one place that knows how an
element of the chain holds a record: an operator asks it, once when it is built, for the loop that applies
the user's function to a list of elements (as Beam's DoFnRunner hides WindowedValue from a DoFn). On plain
records the loop is the function over the list and nothing else; on pairs the function sees the record and
its outputs inherit the record's timestamp. The loops are whole-list comprehensions, not a wrapper called per
record, so neither shape pays a Python call per record beyond the user's function.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from operator import itemgetter
from typing import Any

from runtime.api import Context, KeyedContext

Fn = Callable[[Any], Any]
Batch = Callable[[list[Any]], list[Any]]
Each = Callable[[list[Any]], None]
ProcessCall = Callable[[Any, Any], None]
_first, _second = itemgetter(0), itemgetter(1)


class Plain:
    """Records as they are: a job without event time."""

    timed = False

    def map(self, fn: Fn) -> Batch:
        """elements -> [fn(record) for each], as elements."""
        def run(elements: list[Any]) -> list[Any]:
            return list(map(fn, elements))

        return run

    def filter(self, fn: Callable[[Any], bool]) -> Batch:
        """elements -> those whose record passes `fn`."""
        def run(elements: list[Any]) -> list[Any]:
            return list(filter(fn, elements))

        return run

    def flat_map(self, fn: Callable[[Any], Iterable[Any]]) -> Batch:
        """elements -> every output of `fn(record)`, as elements."""
        def run(elements: list[Any]) -> list[Any]:
            out: list[Any] = []
            extend = out.extend
            for record in elements:
                extend(fn(record))
            return out

        return run

    def each(self, process: ProcessCall, ctx: Context) -> Each:
        """Call `process(record, ctx)` for each element (with event time `ctx.timestamp` is its timestamp)."""
        def run(elements: list[Any]) -> None:
            for record in elements:
                process(record, ctx)

        return run

    def each_keyed(self, key_fn: Fn, process: ProcessCall, ctx: KeyedContext) -> Each:
        """`each` with `ctx.current_key` set to `key_fn(record)` first."""
        def run(elements: list[Any]) -> None:
            for record in elements:
                ctx.current_key = key_fn(record)
                process(record, ctx)

        return run

    def records(self, elements: list[Any]) -> list[Any]:
        """The records of a list of elements."""
        return elements

    def restamp(self, elements: list[Any], outputs: list[Any]) -> list[Any]:
        """One output per element, as elements (each output inherits its element's timestamp)."""
        return outputs

    def element(self, timestamp: int | None, value: Any) -> Any:
        """One output element of `value` emitted at `timestamp` (a side output)."""
        return value

    def emitter(self, add: Callable[[Any], None], ctx: Context) -> Callable[[Any], None]:
        """`ctx.emit`: `add` an element for each record the function emits."""
        return add


class Timestamped(Plain):
    """`(timestamp, record)` pairs: a job with event time (a source with `watermarks=`)."""

    timed = True

    def map(self, fn: Fn) -> Batch:
        def run(elements: list[Any]) -> list[Any]:
            return [(t, fn(record)) for t, record in elements]

        return run

    def filter(self, fn: Callable[[Any], bool]) -> Batch:
        def run(elements: list[Any]) -> list[Any]:
            return [pair for pair in elements if fn(pair[1])]

        return run

    def flat_map(self, fn: Callable[[Any], Iterable[Any]]) -> Batch:
        def run(elements: list[Any]) -> list[Any]:
            return [(t, out) for t, record in elements for out in fn(record)]

        return run

    def each(self, process: ProcessCall, ctx: Context) -> Each:
        def run(elements: list[Any]) -> None:
            for t, record in elements:
                ctx.timestamp = t
                process(record, ctx)

        return run

    def each_keyed(self, key_fn: Fn, process: ProcessCall, ctx: KeyedContext) -> Each:
        def run(elements: list[Any]) -> None:
            for t, record in elements:
                ctx.current_key = key_fn(record)
                ctx.timestamp = t
                process(record, ctx)

        return run

    def records(self, elements: list[Any]) -> list[Any]:
        return list(map(_second, elements))

    def restamp(self, elements: list[Any], outputs: list[Any]) -> list[Any]:
        return list(zip(map(_first, elements), outputs, strict=True))

    def element(self, timestamp: int | None, value: Any) -> Any:
        return (timestamp, value)

    def emitter(self, add: Callable[[Any], None], ctx: Context) -> Callable[[Any], None]:
        def emit(record: Any) -> None:
            add((ctx.timestamp, record))

        return emit


PLAIN = Plain()
TIMESTAMPED = Timestamped()


def shape_of(event_time: bool) -> Plain:
    return TIMESTAMPED if event_time else PLAIN
