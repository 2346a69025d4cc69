"""The interval join: `a.key_by(f).interval_join(b.key_by(g)).between(lower_ms, upper_ms).process(fn)`.

Flink's IntervalJoinOperator as a KeyedCoProcessFunction (runtime/api/co_functions.py), so its buffers and
timers are ordinary keyed state: checkpointed, restored and rescaled by key group with no code of their own.

Semantics (event time only): a left record at `l` and a right record at `r` of the same key join when
`l + lower_ms <= r <= l + upper_ms` (bounds inclusive unless made exclusive). `fn(left, right, ctx)` runs once
per pair and emits with `ctx.emit(...)`; the default emits `(left, right)`. A pair carries the event time
`max(l, r)`.

Per key the operator buffers each side in a MapState (timestamp -> [[record, matched], ...]). A record is
joined with the other side's buffer when it arrives, then buffered until the watermark passes the end of its
interval, when an event-time timer drops it: a left record at `l` is kept until `l + max(upper_ms, 0)`, a right
one at `r` until `r + max(-lower_ms, 0)`. Past that point every record that could still match it is late.

Late records: a record whose timestamp is <= the operator's watermark (the minimum over both inputs; an idle
input does not count) when it arrives is not joined; it goes to the side output `LATE_LEFT` or `LATE_RIGHT`
(`joined.side_output(LATE_LEFT)`), and is dropped when nobody consumes it. Its partners may already be gone, so
joining it would depend on timing; dropping it keeps the output a function of the inputs and the watermarks.

Outer variants (`.left_outer()`, `.right_outer()`, `.full_outer()`): a record of an outer side that has not
matched anything by the time the watermark passes the end of its interval is emitted once as
`fn(left, None, ctx)` (or `fn(None, right, ctx)`), with the event time of that clean-up timer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from runtime.api.co_functions import KeyedCoProcessFunction
from runtime.api.errors import JobDefinitionError
from runtime.api.functions import OutputTag

if TYPE_CHECKING:
    from runtime.api.stream import DataStream, KeyedStream

LATE_LEFT = OutputTag("interval-join-late-left")
LATE_RIGHT = OutputTag("interval-join-late-right")
HOW = ("inner", "left", "right", "full")
_LEFT_BUFFER = "interval-join:left"  # the operator's own node: no user state beside these
_RIGHT_BUFFER = "interval-join:right"


def emit_pair(left: Any, right: Any, ctx: Any) -> None:
    """The default join function: `(left, right)`."""
    ctx.emit((left, right))


class IntervalJoinFunction(KeyedCoProcessFunction):
    """The operator: input 1 is the left side, input 2 the right. `lower_ms`/`upper_ms` are inclusive here
    (exclusive bounds are moved by one millisecond when the join is built)."""

    def __init__(self, lower_ms: int, upper_ms: int, fn: Callable[[Any, Any, Any], None] = emit_pair,
                 how: str = "inner") -> None:
        if how not in HOW:
            raise ValueError(f"how must be one of {', '.join(HOW)}, got {how!r}")
        if lower_ms > upper_ms:
            raise ValueError(f"the interval is empty: lower {lower_ms} > upper {upper_ms}")
        self.lower = lower_ms
        self.upper = upper_ms
        self.fn = fn
        self.outer_left = how in ("left", "full")
        self.outer_right = how in ("right", "full")
        # how long past its own timestamp a record of each side can still be matched
        self.left_keep = max(upper_ms, 0)
        self.right_keep = max(-lower_ms, 0)

    def open(self, ctx: Any) -> None:
        self.left = ctx.map_state(_LEFT_BUFFER)
        self.right = ctx.map_state(_RIGHT_BUFFER)

    def process1(self, record: Any, ctx: Any) -> None:
        """A left record: pairs with right records in [ts + lower, ts + upper]."""
        self._process(record, ctx, True)

    def process2(self, record: Any, ctx: Any) -> None:
        """A right record: pairs with left records in [ts - upper, ts - lower]."""
        self._process(record, ctx, False)

    def _process(self, record: Any, ctx: Any, is_left: bool) -> None:
        ts = ctx.timestamp
        if ts is None:
            raise ValueError("an interval join needs event time: give its sources watermarks= "
                             "(runtime/api/time.py)")
        if ts <= ctx.current_watermark:
            ctx.output(LATE_LEFT if is_left else LATE_RIGHT, record)
            return
        if is_left:
            own, other, low, high = self.left, self.right, ts + self.lower, ts + self.upper
            mark_other = self.outer_right
        else:
            own, other, low, high = self.right, self.left, ts - self.upper, ts - self.lower
            mark_other = self.outer_left
        matched = False
        for other_ts, entries in other.items():
            if not low <= other_ts <= high:
                continue
            matched = True
            ctx.timestamp = max(ts, other_ts)
            for entry in entries:
                if is_left:
                    self.fn(record, entry[0], ctx)
                else:
                    self.fn(entry[0], record, ctx)
            if mark_other and not all(entry[1] for entry in entries):
                other.put(other_ts, [[entry[0], True] for entry in entries])  # values are immutable: rebuild
        ctx.timestamp = ts
        own.put(ts, [*own.get(ts, ()), [record, matched]])
        ctx.timers.register_event_time(ts + (self.left_keep if is_left else self.right_keep))

    def on_timer(self, timestamp: int, ctx: Any) -> None:
        """The watermark passed the end of the intervals of the records at `timestamp - keep`: drop them, emitting
        the unmatched ones of an outer side first."""
        self._clean(ctx, self.left, timestamp - self.left_keep, self.outer_left, True)
        self._clean(ctx, self.right, timestamp - self.right_keep, self.outer_right, False)

    def _clean(self, ctx: Any, buffer: Any, ts: int, outer: bool, is_left: bool) -> None:
        entries = buffer.get(ts)
        if entries is None:
            return
        if outer:
            for record, matched in entries:
                if not matched:
                    if is_left:
                        self.fn(record, None, ctx)
                    else:
                        self.fn(None, record, ctx)
        buffer.remove(ts)


class IntervalJoin:
    """`a.key_by(f).interval_join(b.key_by(g))`: waiting for its bounds."""

    def __init__(self, left: KeyedStream, right: KeyedStream) -> None:
        self._left = left
        self._right = right

    def between(self, lower_ms: int, upper_ms: int) -> IntervalJoined:
        """Join a left record at `l` with the right records in [l + lower_ms, l + upper_ms] (both inclusive)."""
        for name, value in (("lower_ms", lower_ms), ("upper_ms", upper_ms)):
            if not isinstance(value, int) or isinstance(value, bool):
                raise JobDefinitionError(f"interval_join.between: {name} must be an integer of milliseconds, "
                                        f"got {value!r}")
        if lower_ms > upper_ms:
            raise JobDefinitionError(f"interval_join.between: lower_ms {lower_ms} > upper_ms {upper_ms}: "
                                    "the interval is empty")
        return IntervalJoined(self._left, self._right, lower_ms, upper_ms)


class IntervalJoined:
    """An interval join with its bounds; options return a new one, `process(fn)` builds it."""

    def __init__(self, left: KeyedStream, right: KeyedStream, lower_ms: int, upper_ms: int,
                 how: str = "inner") -> None:
        self._left = left
        self._right = right
        self._lower = lower_ms
        self._upper = upper_ms
        self._how = how

    def _with(self, *, lower: int | None = None, upper: int | None = None, how: str | None = None) -> IntervalJoined:
        lower = self._lower if lower is None else lower
        upper = self._upper if upper is None else upper
        if lower > upper:
            raise JobDefinitionError(f"interval_join: the bounds [{lower}, {upper}] are empty")
        return IntervalJoined(self._left, self._right, lower, upper, how or self._how)

    def lower_bound_exclusive(self) -> IntervalJoined:
        """Exclude `l + lower_ms` itself."""
        return self._with(lower=self._lower + 1)

    def upper_bound_exclusive(self) -> IntervalJoined:
        """Exclude `l + upper_ms` itself."""
        return self._with(upper=self._upper - 1)

    def left_outer(self) -> IntervalJoined:
        """Also emit `fn(left, None, ctx)` for each left record that matched nothing, once the watermark passes
        the end of its interval."""
        return self._with(how="left")

    def right_outer(self) -> IntervalJoined:
        """Also emit `fn(None, right, ctx)` for each unmatched right record."""
        return self._with(how="right")

    def full_outer(self) -> IntervalJoined:
        """Both: unmatched records of either side, with None for the other."""
        return self._with(how="full")

    def process(self, fn: Callable[[Any, Any, Any], None] | None = None, *, parallelism: int | None = None,
                name: str | None = None) -> DataStream:
        """Run the join: `fn(left, right, ctx)` per pair emits with `ctx.emit(...)` (default: `(left, right)`)."""
        if fn is not None and not callable(fn):
            raise JobDefinitionError(f"interval_join.process: {fn!r} is not callable as fn(left, right, ctx)")
        label = name or "interval-join"
        if not self._left.job.event_time:
            raise JobDefinitionError(f"{label}: an interval join runs on event time only: give its sources "
                                    "watermarks=BoundedOutOfOrderness(...) (runtime/api/time.py)")
        function = IntervalJoinFunction(self._lower, self._upper, fn or emit_pair, self._how)
        return self._left.connect(self._right).process(function, parallelism=parallelism, name=label)

