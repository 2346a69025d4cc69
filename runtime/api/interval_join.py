"""The interval join: `a.key_by(f).interval_join(b.key_by(g)).between(lower_ms, upper_ms).process(fn)`.

Flink's IntervalJoinOperator as a KeyedCoProcessFunction (runtime/api/co_functions.py), so its buffers and
timers are ordinary keyed state: checkpointed, restored and rescaled by key group with no code of their own.

Semantics (event time only): a left record at `l` and a right record at `r` of the same key join when
`l + lower_ms <= r <= l + upper_ms` (bounds inclusive unless made exclusive). `fn(left, right, ctx)` runs once
per pair and emits with `ctx.emit(...)`; the default emits `(left, right)`. A pair carries the event time
`max(l, r)`.

Per key the operator buffers each side as a tuple of (timestamp, record, matched) entries. A record is joined
with the other side's buffer when it arrives, then buffered until the watermark passes the end of its interval,
when an event-time timer drops it: a left record at `l` is kept until `l + max(upper_ms, 0)`, a right one at
`r` until `r + max(-lower_ms, 0)`. Past that point every record that could still match it is late. An inner
join's clean-up timers are coalesced per key into 1 s buckets of event time (IntervalJoinFunction).

Late records: a record whose timestamp is <= the operator's watermark (the minimum over both inputs; an idle
input does not count) when it arrives is not joined; it goes to the side output `LATE_LEFT` or `LATE_RIGHT`
(`joined.side_output(LATE_LEFT)`), and is dropped when nobody consumes it. Its partners may already be gone, so
joining it would depend on timing; dropping it keeps the output a function of the inputs and the watermarks.

Outer variants (`.left_outer()`, `.right_outer()`, `.full_outer()`): a record of an outer side that has not
matched anything by the time the watermark passes the end of its interval is emitted once as
`fn(left, None, ctx)` (or `fn(None, right, ctx)`), with the event time of that clean-up timer.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable
from operator import itemgetter
from typing import TYPE_CHECKING, Any

from runtime.api.co_functions import KeyedCoProcessFunction
from runtime.api.errors import JobDefinitionError
from runtime.api.functions import OutputTag
from runtime.api.runtime_hooks import RuntimeHooks

if TYPE_CHECKING:
    from runtime.api.stream import DataStream, KeyedStream

LATE_LEFT = OutputTag("interval-join-late-left")
LATE_RIGHT = OutputTag("interval-join-late-right")
HOW = ("inner", "left", "right", "full")
_timestamp = itemgetter(0)  # of a buffer entry (timestamp, record, matched): the key buffers are sorted by
# an inner join's clean-up timers per key: one per second of event time. A key that keeps receiving records drops
# passed ones whenever it adds one, so this bounds only what a key that went quiet keeps past its intervals.
CLEANUP_GRAIN_MS = 1000
_LEFT_BUFFER = "interval-join:left"  # the operator's own node: no user state beside these
_RIGHT_BUFFER = "interval-join:right"


def emit_pair(left: Any, right: Any, ctx: Any) -> None:
    """The default join function: `(left, right)`."""
    ctx.emit((left, right))


class IntervalJoinFunction(KeyedCoProcessFunction, RuntimeHooks):
    """The operator: input 1 is the left side, input 2 the right. `lower_ms`/`upper_ms` are inclusive here
    (exclusive bounds are moved by one millisecond when the join is built).

    State, per key and side, in the tables `interval-join:left` / `interval-join:right`: a tuple of the
    buffered records as `(timestamp, record, matched)` entries sorted by timestamp, equal ones in arrival order
    (a read of the key's buffer is one table lookup and a bisection; adding one rebuilds the key's tuple, since
    stored values are immutable). A savepoint
    of the earlier layout (a MapState per side, timestamp -> [[record, matched], ...], and one timer per
    key and timestamp in the timer table) is converted when it is restored (`_derive_timers`).

    Clean-up timers: a record is dropped once the watermark passes the end of its interval. An inner join
    coalesces those timers per key into `cleanup_grain_ms` buckets (the end of the interval rounded up to the
    grain: one timer per key and bucket instead of one per record), since when a record leaves is invisible
    in its output: a record past the end of its interval can no longer match a record that is not late. An
    outer join emits its unmatched records at that end, so its grain is 1 ms (exact)."""

    def __init__(self, lower_ms: int, upper_ms: int, fn: Callable[[Any, Any, Any], None] = emit_pair,
                 how: str = "inner", cleanup_grain_ms: int | None = None) -> None:
        if how not in HOW:
            raise ValueError(f"how must be one of {', '.join(HOW)}, got {how!r}")
        if lower_ms > upper_ms:
            raise ValueError(f"the interval is empty: lower {lower_ms} > upper {upper_ms}")
        if cleanup_grain_ms is not None and (not isinstance(cleanup_grain_ms, int) or cleanup_grain_ms < 1):
            raise ValueError(f"cleanup_grain_ms must be a positive integer, got {cleanup_grain_ms!r}")
        self.lower = lower_ms
        self.upper = upper_ms
        self.fn = fn
        self.outer_left = how in ("left", "full")
        self.outer_right = how in ("right", "full")
        # how long past its own timestamp a record of each side can still be matched
        self.left_keep = max(upper_ms, 0)
        self.right_keep = max(-lower_ms, 0)
        # per side, key -> its buffer list, for the buffers made since the last snapshot (by the batch loops, on
        # the memory path): no snapshot holds them, so they change in place (`before_snapshot`)
        self._owned_left: dict[Any, Any] = {}
        self._owned_right: dict[Any, Any] = {}
        if self.outer_left or self.outer_right:
            self.grain = 1
        else:
            self.grain = cleanup_grain_ms if cleanup_grain_ms is not None else CLEANUP_GRAIN_MS

    def cleanup_time(self, end: int) -> int:
        """When the timer of a record whose interval ends at `end` fires: `end` rounded up to the grain."""
        grain = self.grain
        return end if grain == 1 else -(-end // grain) * grain

    def open(self, ctx: Any) -> None:
        self.left = ctx.state_table(_LEFT_BUFFER)
        self.right = ctx.state_table(_RIGHT_BUFFER)

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
        key = ctx.current_key
        if is_left:
            own, other, low, high = self.left, self.right, ts + self.lower, ts + self.upper
            mark_other, keep = self.outer_right, self.left_keep
        else:
            own, other, low, high = self.right, self.left, ts - self.upper, ts - self.lower
            mark_other, keep = self.outer_left, self.right_keep
        matched = False
        others = other.get(key)
        if others:
            first = bisect_left(others, low, key=_timestamp)
            last = bisect_right(others, high, key=_timestamp)
            if first < last:
                matched = True
                fn = self.fn
                for entry in others[first:last]:
                    other_ts = entry[0]
                    ctx.timestamp = ts if ts > other_ts else other_ts
                    if is_left:
                        fn(record, entry[1], ctx)
                    else:
                        fn(entry[1], record, ctx)
                ctx.timestamp = ts
                if mark_other and not all(e[2] for e in others[first:last]):  # immutable values: rebuild
                    other[key] = (*others[:first], *((e[0], e[1], True) for e in others[first:last]),
                                  *others[last:])
        own[key] = _inserted(own.get(key), (ts, record, matched), None)
        ctx.timers.register_event_time(self.cleanup_time(ts + keep))

    def before_snapshot(self) -> None:
        """For the runtime, at every snapshot's synchronous part, before the tables are copied: the memory
        path's snapshot is a shallow copy, so from now on every buffer it holds is copied before it changes
        (copy on write, as Flink's CopyOnWriteStateMap)."""
        self._owned_left.clear()
        self._owned_right.clear()

    def on_timer(self, timestamp: int, ctx: Any) -> None:
        """The watermark passed the end of the intervals of the key's records up to `timestamp - keep`: drop
        them, emitting the unmatched ones of an outer side first."""
        key = ctx.current_key
        self._clean(ctx, key, self.left, timestamp - self.left_keep, self.outer_left, True)
        self._clean(ctx, key, self.right, timestamp - self.right_keep, self.outer_right, False)

    def _clean(self, ctx: Any, key: Any, buffer: Any, upto: int, outer: bool, is_left: bool) -> None:
        entries = buffer.get(key)
        if not entries or entries[0][0] > upto:
            return
        done = bisect_right(entries, upto, key=_timestamp)
        if outer:
            fn = self.fn
            for _, record, matched in entries[:done]:
                if not matched:
                    if is_left:
                        fn(record, None, ctx)
                    else:
                        fn(None, record, ctx)
        owned = self._owned_left if is_left else self._owned_right
        mine = owned.get(key) is entries  # made by a batch loop since the last snapshot: change it in place
        if done == len(entries):
            buffer.pop(key, None)
            owned.pop(key, None)
        elif mine:
            del entries[:done]
        else:
            buffer[key] = list(entries[done:])

    # -- for the runtime (runtime/execution/operators/two_input.py) -----------------------------------------

    def event_timers_from_state(self, ctx: Any) -> Callable[[dict[Any, Any]], list[tuple[Any, int]]]:
        """The clean-up timers follow from the buffers, so the join keeps no timer table: the task fires them
        from an index per timestamp (runtime/execution/timers.py, TimerIndex), rebuilt by `_derive_timers`
        after a restore."""
        left, right = ctx.state_table(_LEFT_BUFFER), ctx.state_table(_RIGHT_BUFFER)
        return lambda legacy: self._derive_timers(left, right, legacy)

    def _derive_timers(self, left: Any, right: Any, legacy: dict[Any, Any]) -> list[tuple[Any, int]]:
        """Every (key, timestamp) of a clean-up timer the buffers imply. A savepoint of the earlier layout
        (per key a map timestamp -> [[record, matched], ...], and a timer per key and timestamp in `legacy`)
        is converted here: its entries in timestamp order, and its timers dropped since the buffers imply
        them (every buffered record's timer was still registered: a timer fired only with its records)."""
        self.before_snapshot()  # the tables were restored in place: their buffers are new objects
        out: list[tuple[Any, int]] = []
        for table, keep in ((left, self.left_keep), (right, self.right_keep)):
            for key, entries in list(table.items()):
                if isinstance(entries, dict):
                    entries = tuple((int(ts), e[0], bool(e[1])) for ts in sorted(entries) for e in entries[ts])
                    table[key] = entries
                out.extend((key, stamp) for stamp in {self.cleanup_time(e[0] + keep) for e in entries})
        legacy.clear()
        return out

    def timed_batch_runners(self, key_fns: tuple[Callable[[Any], Any], Callable[[Any], Any]], ctx: Any,
                            after: Callable[[], None]) -> tuple[Callable[[list[Any]], None], ...] | None:
        """The per-batch paths of an inner join's two inputs, over lists of (timestamp, record) elements: what
        `process1` / `process2` do per element, with the tables, bounds and timer index bound once, and a
        key's records whose intervals the watermark has passed dropped from its buffer whenever a record is
        added to it (its clean-up timer then finds less to do). A late record, and one without a timestamp,
        takes `process1` / `process2` in its place in the batch. The watermark does not move within a batch
        (markers are between batches). None for an outer join (per record: its matches mark entries)."""
        if self.outer_left or self.outer_right:
            return None
        left_table, right_table = ctx.state_table(_LEFT_BUFFER), ctx.state_table(_RIGHT_BUFFER)
        register = ctx.timers.event.register  # the TimerIndex the operator put in place first
        fn, grain = self.fn, self.grain
        in_memory = type(left_table) is dict  # a state backend stores bytes: every change is a write

        def make(is_left: bool) -> Callable[[list[Any]], None]:
            key_fn = key_fns[0] if is_left else key_fns[1]
            own, other = (left_table, right_table) if is_left else (right_table, left_table)
            owned = (self._owned_left if is_left else self._owned_right) if in_memory else None
            own_get, other_get = own.get, other.get
            below, above = (self.lower, self.upper) if is_left else (-self.upper, -self.lower)
            keep = self.left_keep if is_left else self.right_keep
            per_record = self.process1 if is_left else self.process2

            def run(elements: list[Any]) -> None:
                watermark = ctx.current_watermark
                expired = watermark - keep  # an own record at or before this can match nothing more
                for t, record in elements:
                    key = key_fn(record)
                    if t is None or t <= watermark:
                        ctx.current_key = key
                        ctx.timestamp = t
                        per_record(record, ctx)
                        continue
                    matched = False
                    others = other_get(key)
                    low, high = t + below, t + above
                    # in order, the other side's newest entries are the ones in range: none when its newest is
                    # below the range (this side is ahead), all from the start when its oldest is in it
                    if others and others[-1][0] >= low and others[0][0] <= high:
                        i = 0 if others[0][0] >= low else bisect_left(others, low, key=_timestamp)
                        n = len(others)
                        while i < n:
                            entry = others[i]
                            other_ts = entry[0]
                            if other_ts > high:
                                break
                            matched = True
                            ctx.current_key = key
                            ctx.timestamp = t if t > other_ts else other_ts
                            if is_left:
                                fn(record, entry[1], ctx)
                            else:
                                fn(entry[1], record, ctx)
                            i += 1
                    end = t + keep
                    due = end if grain == 1 else -(-end // grain) * grain
                    entries: Any = own_get(key)
                    if not entries:
                        own[key] = new = [(t, record, matched)]
                        if owned is not None:
                            owned[key] = new
                        register(key, due)
                        continue
                    last = entries[-1][0]
                    mine = owned is not None and owned.get(key) is entries
                    if mine:  # no snapshot holds it: change it in place
                        if last <= t:
                            if entries[0][0] <= expired:
                                del entries[:bisect_right(entries, expired, key=_timestamp)]
                            entries.append((t, record, matched))
                        else:
                            entries.insert(bisect_right(entries, t, key=_timestamp), (t, record, matched))
                            if entries[0][0] <= expired:
                                del entries[:bisect_right(entries, expired, key=_timestamp)]
                    else:  # a new list, in place from now until the next snapshot
                        new = _inserted(entries, (t, record, matched), expired)
                        own[key] = new
                        if owned is not None:
                            owned[key] = new
                    # a buffered entry's timer is pending (a timer drops every entry of its bucket): the last
                    # entry's bucket needs no second registration
                    last_end = last + keep
                    if not due - grain < last_end <= due:  # another bucket than the last entry's
                        register(key, due)
                after()

            return run

        return make(True), make(False)


def _inserted(entries: Any, entry: tuple[int, Any, bool], expired: int | None) -> list[Any]:
    """A new buffer: a key's buffer (sorted by timestamp, equal ones in arrival order) with `entry` added,
    without the entries at or before `expired` (None: keep all)."""
    if not entries:
        return [entry]
    at = bisect_right(entries, entry[0], key=_timestamp)
    first = 0 if expired is None else min(bisect_right(entries, expired, key=_timestamp), at)
    return [*entries[first:at], entry, *entries[at:]]


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

