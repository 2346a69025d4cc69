"""How records look inside a chain: as they are, or `(timestamp, record)` pairs in a job with event time.

Operators are written once, over the user's records (kinds.py). The shape is the one place that knows how an
element of the chain holds a record: an operator asks it, once when it is built, for the loop that applies
the user's function to a list of elements and hands the outputs on (as Beam's DoFnRunner hides WindowedValue
from a DoFn). On plain records the loop is the function over the list and nothing else; on pairs the function
sees the record and its outputs inherit the record's timestamp. A loop is the operator's whole per-batch path,
not a wrapper called per record or per batch, so neither shape pays a Python call beyond the user's function
(a batch may be one record: a chunk of slow records, or `Chain.process`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from functools import partial
from operator import itemgetter
from typing import Any

from runtime.api import Context, KeyedContext

Fn = Callable[[Any], Any]
EmitBatch = Callable[[list[Any]], None]
ProcessCall = Callable[[Any, Any], None]
_first, _second = itemgetter(0), itemgetter(1)


class Plain:
    """Records as they are: a job without event time."""

    timed = False
    # the records of a list of elements, as an iterator (C functions: no Python call per batch)
    records: Callable[[list[Any]], Iterator[Any]] = staticmethod(iter)

    def map(self, fn: Fn, emit: EmitBatch) -> EmitBatch:
        """`fn(record)` of each element, as elements, to `emit`."""
        def run(elements: list[Any]) -> None:
            emit(list(map(fn, elements)))

        return run

    def filter(self, fn: Callable[[Any], bool], emit: EmitBatch) -> EmitBatch:
        """The elements whose record passes `fn`, to `emit` (unless none does)."""
        def run(elements: list[Any]) -> None:
            kept = list(filter(fn, elements))
            if kept:
                emit(kept)

        return run

    def flat_map(self, fn: Callable[[Any], Iterable[Any]], emit: EmitBatch) -> EmitBatch:
        """Every output of `fn(record)`, as elements, to `emit` (unless there is none)."""
        def run(elements: list[Any]) -> None:
            out: list[Any] = []
            extend = out.extend
            for record in elements:
                extend(fn(record))
            if out:
                emit(out)

        return run

    def each(self, process: ProcessCall, ctx: Context, after: Callable[[], None]) -> EmitBatch:
        """`process(record, ctx)` for each element (with event time `ctx.timestamp` is its timestamp), then
        `after()` (which hands on what the function emitted)."""
        def run(elements: list[Any]) -> None:
            for record in elements:
                process(record, ctx)
            after()

        return run

    def each_keyed(self, key_fn: Fn, process: ProcessCall, ctx: KeyedContext,
                   after: Callable[[], None]) -> EmitBatch:
        """`each` with `ctx.current_key` set to `key_fn(record)` first."""
        def run(elements: list[Any]) -> None:
            for record in elements:
                ctx.current_key = key_fn(record)
                process(record, ctx)
            after()

        return run

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
    records = partial(map, _second)

    def map(self, fn: Fn, emit: EmitBatch) -> EmitBatch:
        def run(elements: list[Any]) -> None:
            emit([(t, fn(record)) for t, record in elements])

        return run

    def filter(self, fn: Callable[[Any], bool], emit: EmitBatch) -> EmitBatch:
        def run(elements: list[Any]) -> None:
            kept = [pair for pair in elements if fn(pair[1])]
            if kept:
                emit(kept)

        return run

    def flat_map(self, fn: Callable[[Any], Iterable[Any]], emit: EmitBatch) -> EmitBatch:
        def run(elements: list[Any]) -> None:
            out = [(t, output) for t, record in elements for output in fn(record)]
            if out:
                emit(out)

        return run

    def each(self, process: ProcessCall, ctx: Context, after: Callable[[], None]) -> EmitBatch:
        def run(elements: list[Any]) -> None:
            for t, record in elements:
                ctx.timestamp = t
                process(record, ctx)
            after()

        return run

    def each_keyed(self, key_fn: Fn, process: ProcessCall, ctx: KeyedContext,
                   after: Callable[[], None]) -> EmitBatch:
        def run(elements: list[Any]) -> None:
            for t, record in elements:
                ctx.current_key = key_fn(record)
                ctx.timestamp = t
                process(record, ctx)
            after()

        return run

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
