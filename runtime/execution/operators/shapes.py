"""How records look inside a chain: as they are, or `(timestamp, record)` pairs in a job with event time.

Operators are written once, over the user's records. The shape adapts the user's functions to the chain's
elements once, when the operator is built (as Beam's DoFnRunner hides WindowedValue from a DoFn): on plain
records it hands each function back unchanged, so the per-record path of a job without event time is the
user's function and nothing else; on pairs it wraps the function so that it sees the record and its outputs
inherit the record's timestamp.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from runtime.api import Context

Fn = Callable[[Any], Any]
ProcessCall = Callable[[Any, Context], None]


class Plain:
    """Records as they are: a job without event time."""

    timed = False

    def map(self, fn: Fn) -> Fn:
        """`fn(record) -> output` as a function of an element."""
        return fn

    def predicate(self, fn: Callable[[Any], bool]) -> Callable[[Any], bool]:
        return fn

    def expand(self, fn: Callable[[Any], Iterable[Any]]) -> Callable[[Any], Iterable[Any]]:
        """`fn(record) -> outputs` (flat_map) as a function of an element giving elements."""
        return fn

    def key(self, fn: Fn) -> Fn:
        return fn

    def records(self, elements: list[Any]) -> list[Any]:
        """The records of a list of elements (what a sink writes)."""
        return elements

    def element(self, timestamp: int | None, value: Any) -> Any:
        """One output element of `value` emitted at `timestamp` (a side output)."""
        return value

    def emitter(self, add: Callable[[Any], None], ctx: Context) -> Callable[[Any], None]:
        """`ctx.emit`: `add` an element for each record the function emits."""
        return add

    def process(self, process: ProcessCall) -> ProcessCall:
        """`process(record, ctx)` as a function of an element: with event time `ctx.timestamp` is set first."""
        return process


class Timestamped(Plain):
    """`(timestamp, record)` pairs: a job with event time (a source with `watermarks=`)."""

    timed = True

    def map(self, fn: Fn) -> Fn:
        def on_pair(pair: Any) -> Any:
            return (pair[0], fn(pair[1]))

        return on_pair

    def predicate(self, fn: Callable[[Any], bool]) -> Callable[[Any], bool]:
        def on_pair(pair: Any) -> bool:
            return fn(pair[1])

        return on_pair

    def expand(self, fn: Callable[[Any], Iterable[Any]]) -> Callable[[Any], Iterable[Any]]:
        def on_pair(pair: Any) -> list[Any]:
            t = pair[0]
            return [(t, out) for out in fn(pair[1])]

        return on_pair

    def key(self, fn: Fn) -> Fn:
        def on_pair(pair: Any) -> Any:
            return fn(pair[1])

        return on_pair

    def records(self, elements: list[Any]) -> list[Any]:
        return [record for _, record in elements]

    def element(self, timestamp: int | None, value: Any) -> Any:
        return (timestamp, value)

    def emitter(self, add: Callable[[Any], None], ctx: Context) -> Callable[[Any], None]:
        def emit(record: Any) -> None:
            add((ctx.timestamp, record))

        return emit

    def process(self, process: ProcessCall) -> ProcessCall:
        def on_pair(pair: Any, ctx: Context) -> None:
            ctx.timestamp = pair[0]
            process(pair[1], ctx)

        return on_pair


PLAIN = Plain()
TIMESTAMPED = Timestamped()


def shape_of(event_time: bool) -> Plain:
    return TIMESTAMPED if event_time else PLAIN
