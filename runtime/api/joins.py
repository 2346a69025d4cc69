"""Window joins and co-groups of two streams: `a.join(b).where(ka).equal_to(kb).window(assigner).apply(fn)`.

Built as Flink builds them, out of single-input parts: each side is tagged by a map (`(0, record)` on the left,
`(1, record)` on the right), the two are unioned, keyed by the side's own key, and cut into windows by the
ordinary window operator (runtime/api/windows.py), whose contents are the tagged records. So a window join
checkpoints, restores, rescales and handles lateness exactly like any window, with no code of its own for it.

When a window fires, its records are split back into the two sides (each in arrival order):
- `join(...).apply(fn)` emits `fn(left, right)` for every pair of the window (none when a side is empty); the
  default `fn` gives `(left, right)`. Pairs come out left-major: for each left record, every right one.
- `co_group(...).apply(fn)` emits every item of `fn(lefts, rights)` (an iterable, None for nothing), once per
  window that holds a record of either side: one of the lists may be empty.
Outputs carry the event time `window.end - 1`. Records too late for all their windows go to the side output
`LATE_DATA` of the joined stream, tagged as they were: `(0, left)` or `(1, right)`.

The interval join (`KeyedStream.interval_join`) is runtime/api/interval_join.py.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from runtime.api.errors import JobDefinitionError
from runtime.api.windows import WindowAssigner, WindowOperator, _Elements

if TYPE_CHECKING:
    from runtime.api.stream import DataStream

LEFT, RIGHT = 0, 1  # the tags of the two sides in the window's contents


def _default_pair(left: Any, right: Any) -> Any:
    return (left, right)


class CoGroupWindowOperator(WindowOperator):
    """A window operator over tagged records whose firing emits every output of `group(lefts, rights)`, or for a
    join (`pair` given) `pair(left, right)` for every pair of the window."""

    def __init__(self, assigner: WindowAssigner, group: Callable[[list[Any], list[Any]], Iterable[Any] | None] | None,
                 *, pair: Callable[[Any, Any], Any] | None = None) -> None:
        super().__init__(assigner, _Elements(_unused))
        self.group = group
        self.pair = pair

    def _emit(self, ctx: Any, start: int, end: int, acc: Any) -> None:
        # the window's records (chunks of tagged records, _Elements) split back into the two sides here, in one
        # pass, and the outputs emitted as they are made: a window of a join is often a few records, so the
        # calls a generic `process` window makes per firing (a Window, its lists, the function) were a quarter of
        # the join's chain with 100 ms windows of a record per key and side
        lefts: list[Any] = []
        rights: list[Any] = []
        to_left, to_right = lefts.append, rights.append
        for chunk in acc:
            for tag, record in chunk:
                if tag == LEFT:
                    to_left(record)
                else:
                    to_right(record)
        emit = ctx.emit
        pair = self.pair
        if pair is not None:
            for left in lefts:
                for right in rights:
                    emit(pair(left, right))
            return
        assert self.group is not None
        for out in self.group(lefts, rights) or ():
            emit(out)


def _unused(key: Any, window: Any, records: list[Any]) -> Any:
    raise AssertionError("a window join's firing is CoGroupWindowOperator._emit")


class TwoStreams:
    """`a.join(b)` / `a.co_group(b)`: the two sides, waiting for their keys and windows."""

    def __init__(self, left: DataStream, right: DataStream, kind: str) -> None:
        if left.job is not right.job:
            raise JobDefinitionError(f"{kind}: both streams must belong to the same job")
        self._left = left
        self._right = right
        self._kind = kind

    def where(self, key_left: Callable[[Any], Any]) -> _Where:
        """The key of a left record."""
        if not callable(key_left):
            raise JobDefinitionError(f"{self._kind}.where needs a key function, got {key_left!r}")
        return _Where(self, key_left)


class _Where:
    def __init__(self, streams: TwoStreams, key_left: Callable[[Any], Any]) -> None:
        self._streams = streams
        self._key_left = key_left

    def equal_to(self, key_right: Callable[[Any], Any]) -> _EqualTo:
        """The key of a right record: records of both sides whose keys are equal meet in the same windows."""
        if not callable(key_right):
            raise JobDefinitionError(f"{self._streams._kind}.equal_to needs a key function, got {key_right!r}")
        return _EqualTo(self._streams, self._key_left, key_right)


class _EqualTo:
    def __init__(self, streams: TwoStreams, key_left: Callable[[Any], Any], key_right: Callable[[Any], Any]) -> None:
        self._streams = streams
        self._key_left = key_left
        self._key_right = key_right

    def window(self, assigner: WindowAssigner) -> WindowedJoin:
        """Tumbling, sliding or session windows (event or processing time), as for `KeyedStream.window`."""
        if not isinstance(assigner, WindowAssigner):
            raise JobDefinitionError(f"{assigner!r} is not a window assigner (e.g. TumblingEventTimeWindows(60_000))")
        return WindowedJoin(self._streams, self._key_left, self._key_right, assigner)


class WindowedJoin:
    """A window join or co-group waiting for its function: `apply(fn)`."""

    def __init__(self, streams: TwoStreams, key_left: Callable[[Any], Any], key_right: Callable[[Any], Any],
                 assigner: WindowAssigner) -> None:
        self._streams = streams
        self._key_left = key_left
        self._key_right = key_right
        self._assigner = assigner

    def apply(self, fn: Callable[..., Any] | None = None, *, parallelism: int | None = None,
              name: str | None = None) -> DataStream:
        """join: `fn(left, right)` per pair (default `(left, right)`); co_group: the items of `fn(lefts, rights)`."""
        kind = self._streams._kind
        if kind == "join":
            operator = CoGroupWindowOperator(self._assigner, None,
                                             pair=_default_pair if fn is None else _callable(fn, "fn(left, right)"))
        else:
            if fn is None:
                raise JobDefinitionError("co_group.apply needs a function fn(lefts, rights) -> iterable")
            operator = CoGroupWindowOperator(self._assigner, _callable(fn, "fn(lefts, rights)"))
        left, right = self._streams._left, self._streams._right
        key_left, key_right = self._key_left, self._key_right
        base = name or f"window-{kind}"
        # the tags run where each side's records are (chained to it), before the shuffle by key
        tagged_left = left.map(_tag_left, name=f"{base}-left")
        tagged_right = right.map(_tag_right, name=f"{base}-right")

        def key_of(tagged: Any) -> Any:
            return key_left(tagged[1]) if tagged[0] == LEFT else key_right(tagged[1])

        keyed = tagged_left.union(tagged_right).key_by(key_of)
        return keyed.process(operator, parallelism=parallelism, name=base)


def _tag_left(record: Any) -> Any:
    return (LEFT, record)


def _tag_right(record: Any) -> Any:
    return (RIGHT, record)


def _callable(fn: Any, shape: str) -> Callable[..., Any]:
    if not callable(fn):
        raise JobDefinitionError(f"{fn!r} is not callable as {shape}")
    return fn  # type: ignore[no-any-return]


