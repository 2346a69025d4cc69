"""The few operators SQL needs that the DataStream API does not have as such, built on its public classes:
CUMULATE windows (a WindowAssigner), the unbounded group aggregation (a KeyedProcessFunction emitting a
changelog), regular joins (a KeyedCoProcessFunction), Top-N and deduplication, the per-record functions of
window table functions without an aggregation; and the operators that wait for a window to fire (its end in each
row, a timer at window_end - 1): window Top-N, window joins, the aggregation of a window aggregation's windows;
the row-time OVER aggregation; the Calc that reads CURRENT_WATERMARK."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from runtime.api import MIN_WATERMARK, KeyedCoProcessFunction, KeyedProcessFunction, ProcessFunction
from runtime.api.windows import WindowAssigner
from runtime.sql.changelog import DELETE, INSERT, UPDATE_AFTER, UPDATE_BEFORE


@dataclass(frozen=True)
class CumulativeEventTimeWindows(WindowAssigner):
    """Flink's CUMULATE: windows of `step_ms`, 2*`step_ms`, ... up to `max_size_ms`, all starting at the start
    of the max-size window: a record is in every one of them that ends after it."""

    step_ms: int
    max_size_ms: int
    offset_ms: int = 0

    def assign(self, ts: int) -> list[tuple[int, int]]:
        start = ts - (ts - self.offset_ms) % self.max_size_ms
        first_end = ts - (ts - self.offset_ms) % self.step_ms + self.step_ms
        return [(start, end) for end in range(first_end, start + self.max_size_ms + 1, self.step_ms)]


@dataclass(frozen=True)
class CumulativeProcessingTimeWindows(CumulativeEventTimeWindows):
    """CUMULATE over a PROCTIME() column: the same windows on the operator's wall clock."""

    event_time = False


def correlate_rows(fn: Callable[..., Any], args: Callable[[Any], tuple[Any, ...]], width: int, left_outer: bool,
                   text: str) -> Callable[[Any], list[Any]]:
    """A row -> the row joined with each row the table function `fn` yields for `args(row)` (a plain value is a
    one-column row); `left_outer`: a row it yields none for, once, padded with NULLs."""
    nulls = (None,) * width

    def rows(row: Any) -> list[Any]:
        out = []
        for produced in fn(*args(row)) or ():
            values = tuple(produced) if isinstance(produced, tuple | list) else (produced,)
            if len(values) != width:
                raise ValueError(f"table function {text} yielded {produced!r}: {width} columns expected")
            out.append((*row, *values))
        if not out and left_outer:
            out.append((*row, *nulls))
        return out
    return rows


class GroupAggregateFunction(KeyedProcessFunction):
    """An unbounded GROUP BY: per key the accumulator in value state; every input row updates it and emits the
    change of the key's result row, as Flink's GroupAggFunction: +I the first time, then -U old and +U new (none
    when the result did not change). Output rows are (*key, *results)."""

    def __init__(self, aggregate: Any, key_arity: int) -> None:
        self.aggregate = aggregate
        self.key_arity = key_arity

    def open(self, ctx: Any) -> None:
        self.accumulators = ctx.value_state("accumulators", None)

    def process(self, record: Any, ctx: Any) -> None:
        agg = self.aggregate
        acc = self.accumulators.value()
        key = ctx.current_key
        prefix = tuple(key) if self.key_arity != 1 else (key,)
        if acc is None:
            acc = agg.add(record, agg.create_accumulator())
            self.accumulators.update(acc)
            ctx.emit((INSERT, (*prefix, *agg.get_result(acc))))
            return
        before = tuple(agg.get_result(acc))  # a restored accumulator is a list: compare values, not types
        acc = agg.add(record, acc)
        self.accumulators.update(acc)
        after = tuple(agg.get_result(acc))
        if after != before:
            ctx.emit((UPDATE_BEFORE, (*prefix, *before)))
            ctx.emit((UPDATE_AFTER, (*prefix, *after)))


class RetractingGroupAggregateFunction(KeyedProcessFunction):
    """An unbounded GROUP BY over an updating input, Flink's GroupAggFunction with retraction: the input is
    (kind, row) pairs; +I and +U add the row to its key's accumulator (runtime/sql/retracting.py), -U and -D
    retract it. The key's result row changes as over an append-only input (+I the first time, then -U old, +U
    new; nothing when it did not change), and when its last row is retracted the key's row is deleted (-D) and
    its state dropped. A retraction for a key with no state (its rows expired or never seen) is ignored, as
    Flink ignores it. Output rows are (*key, *results)."""

    def __init__(self, aggregate: Any, key_arity: int) -> None:
        self.aggregate = aggregate
        self.key_arity = key_arity

    def open(self, ctx: Any) -> None:
        self.accumulators = ctx.value_state("accumulators", None)

    def process(self, record: Any, ctx: Any) -> None:
        kind, row = record
        agg = self.aggregate
        acc = self.accumulators.value()
        retract = kind in (UPDATE_BEFORE, DELETE)
        key = ctx.current_key
        prefix = tuple(key) if self.key_arity != 1 else (key,)
        if acc is None:
            if retract:
                return
            acc = agg.add(row, agg.create_accumulator())
            self.accumulators.update(acc)
            ctx.emit((INSERT, (*prefix, *agg.get_result(acc))))
            return
        before = tuple(agg.get_result(acc))
        acc = agg.retract(row, acc) if retract else agg.add(row, acc)
        if agg.rows(acc) <= 0:
            self.accumulators.clear()
            ctx.emit((DELETE, (*prefix, *before)))
            return
        self.accumulators.update(acc)
        after = tuple(agg.get_result(acc))
        if after != before:
            ctx.emit((UPDATE_BEFORE, (*prefix, *before)))
            ctx.emit((UPDATE_AFTER, (*prefix, *after)))


class WindowGroupAggregateFunction(KeyedProcessFunction):
    """GROUP BY window_start, window_end (and keys) over the rows of a window aggregation or a window TVF, Flink's
    window aggregation over window properties: keyed by the group, which holds its window, the accumulator is
    kept until the watermark passes the window's end (the timer at window_end - 1), then its row (*key,
    *results) is emitted once, insert-only, and the state dropped. Rows whose window already fired are dropped,
    as Flink drops them."""

    def __init__(self, aggregate: Any, end_key: int) -> None:
        self.aggregate = aggregate
        self.end_key = end_key

    def open(self, ctx: Any) -> None:
        self.accumulators = ctx.value_state("accumulators", None)

    def process(self, record: Any, ctx: Any) -> None:
        fires_at = ctx.current_key[self.end_key] - 1
        if fires_at <= ctx.current_watermark:
            return
        acc = self.accumulators.value()
        if acc is None:
            acc = self.aggregate.create_accumulator()
            ctx.timers.register_event_time(fires_at)
        self.accumulators.update(self.aggregate.add(record, acc))

    def on_timer(self, timestamp: int, ctx: Any) -> None:
        acc = self.accumulators.value()
        self.accumulators.clear()
        if acc is not None:
            ctx.emit((*ctx.current_key, *self.aggregate.get_result(acc)))


def window_rows(assign: Callable[[int], list[tuple[int, int]]], time_index: int) -> Callable[[Any], list[Any]]:
    """A window TVF without aggregation: the row once per window, with window_start, window_end, window_time."""
    def rows(row: Any) -> list[Any]:
        return [(*row, start, end, end - 1) for start, end in assign(row[time_index])]
    return rows


def tumble_row(size_ms: int, offset_ms: int, time_index: int) -> Callable[[Any], Any]:
    def row(r: Any) -> Any:
        t = r[time_index]
        start = t - (t - offset_ms) % size_ms
        return (*r, start, start + size_ms, start + size_ms - 1)
    return row


def window_output(key_arity: int) -> Callable[[Any], Any]:
    """(key, start, end, results) from the window operator -> (*keys, window_start, window_end, window_time,
    *results)."""
    if key_arity == 1:
        return lambda e: (e[0], e[1], e[2], e[2] - 1, *e[3])
    return lambda e: (*e[0], e[1], e[2], e[2] - 1, *e[3])


class RegularJoinFunction(KeyedCoProcessFunction):
    """A regular (unbounded) equi-join, Flink's StreamingJoinOperator: per key both sides' rows are kept, each
    with the number of rows of the other side it joins (with `ttl_ms`, Flink's table.exec.state.ttl, they
    expire); every arriving row joins the other side's rows that pass `condition`. Inner over append-only
    inputs: insert-only output (plain rows). Otherwise a changelog of +I/-D: a row of an outer side without a
    match is emitted padded with NULLs (+I), and retracted (-D) when its first match arrives. An updating side
    (`updating_left`/`updating_right`: (kind, row) pairs) retracts with -U/-D: the row leaves the state, its
    joined rows are retracted, and an outer row of the other side left without a match goes out padded again."""

    def __init__(self, how: str, left_width: int, right_width: int,
                 condition: Callable[[Any], Any] | None = None, ttl_ms: int | None = None, *,
                 updating_left: bool = False, updating_right: bool = False) -> None:
        self.how = how
        self.outer_left = how in ("left", "full")
        self.outer_right = how in ("right", "full")
        self.changelog = how != "inner" or updating_left or updating_right
        self.updating_left = updating_left
        self.updating_right = updating_right
        self.left_nulls = (None,) * left_width
        self.right_nulls = (None,) * right_width
        self.condition = condition
        self.ttl_ms = ttl_ms

    def open(self, ctx: Any) -> None:
        self.left = ctx.value_state("join:left", (), ttl_ms=self.ttl_ms)
        self.right = ctx.value_state("join:right", (), ttl_ms=self.ttl_ms)

    def process1(self, record: Any, ctx: Any) -> None:
        self._input(record, ctx, True, self.updating_left)

    def process2(self, record: Any, ctx: Any) -> None:
        self._input(record, ctx, False, self.updating_right)

    def _input(self, record: Any, ctx: Any, is_left: bool, updating: bool) -> None:
        if not updating:
            self._arrive(tuple(record), ctx, is_left)
        elif record[0] in (INSERT, UPDATE_AFTER):
            self._arrive(tuple(record[1]), ctx, is_left)
        else:
            self._retract(tuple(record[1]), ctx, is_left)

    def _retract(self, row: tuple[Any, ...], ctx: Any, is_left: bool) -> None:
        mine, other = (self.left, self.right) if is_left else (self.right, self.left)
        kept = list(mine.value())
        at = next((i for i, (r, _) in enumerate(kept) if r == row), None)
        if at is None:  # never seen, or expired by the TTL: nothing was joined with it that is still known
            return
        _, matches = kept.pop(at)
        mine.update(tuple(kept))
        other_outer = self.outer_right if is_left else self.outer_left
        others = list(other.value())
        changed = False
        for i, (orow, omatches) in enumerate(others):
            joined = (*row, *orow) if is_left else (*orow, *row)
            if self.condition is not None and not self.condition(joined):
                continue
            self._emit(ctx, DELETE, joined)
            if other_outer:
                others[i] = (orow, omatches - 1)
                changed = True
                if omatches == 1:  # its last match is gone: it goes out NULL-padded again
                    self._emit(ctx, INSERT, (*self.left_nulls, *orow) if is_left else (*orow, *self.right_nulls))
        if changed:
            other.update(tuple(others))
        if matches == 0 and (self.outer_left if is_left else self.outer_right):
            self._emit(ctx, DELETE, (*row, *self.right_nulls) if is_left else (*self.left_nulls, *row))

    def _emit(self, ctx: Any, kind: str, row: tuple[Any, ...]) -> None:
        ctx.emit((kind, row) if self.changelog else row)

    def _arrive(self, row: tuple[Any, ...], ctx: Any, is_left: bool) -> None:
        mine, other = (self.left, self.right) if is_left else (self.right, self.left)
        other_outer = self.outer_right if is_left else self.outer_left
        mine_outer = self.outer_left if is_left else self.outer_right
        others = list(other.value())
        condition = self.condition
        matches = 0
        changed = False
        for i, (orow, omatches) in enumerate(others):
            joined = (*row, *orow) if is_left else (*orow, *row)
            if condition is not None and not condition(joined):
                continue
            matches += 1
            if other_outer:
                if omatches == 0:  # its NULL-padded row was emitted: retract it
                    padded = (*self.left_nulls, *orow) if is_left else (*orow, *self.right_nulls)
                    self._emit(ctx, DELETE, padded)
                others[i] = (orow, omatches + 1)
                changed = True
            self._emit(ctx, INSERT, joined)
        if changed:
            other.update(tuple(others))
        if matches == 0 and mine_outer:
            self._emit(ctx, INSERT, (*row, *self.right_nulls) if is_left else (*self.left_nulls, *row))
        mine.update((*mine.value(), (row, matches)))


class TopNFunction(KeyedProcessFunction):
    """ROW_NUMBER() OVER (PARTITION BY ... ORDER BY ...) <= N over an append-only input, Flink's
    AppendOnlyTopNFunction: per partition the N first rows in the order; a row entering the top N is emitted
    (+I), one pushed out retracted (-D); with the rank in the output, every row whose rank changed is retracted
    and emitted again. Ties keep the earlier row first. N = 1 ordered by rowtime ascending is deduplication keeping
    the first row: insert-only (plain rows). With `offset` m (LIMIT n OFFSET m: Flink's rank range m+1..m+n) the
    first m rows are kept, as the order needs them, but only ranks m+1..limit are emitted."""

    def __init__(self, limit: int, sort_key: Callable[[Any], Any], with_rank: bool, insert_only: bool,
                 newest_wins_ties: bool = False, offset: int = 0) -> None:
        self.limit = limit  # the last rank kept: offset + n
        self.offset = offset
        self.sort_key = sort_key
        self.with_rank = with_rank
        self.insert_only = insert_only
        # deduplication keeping the last row (ORDER BY rowtime DESC, N = 1): a row as late as the kept one
        # replaces it, as Flink's row-time deduplication does
        self.newest_wins_ties = newest_wins_ties

    def open(self, ctx: Any) -> None:
        self.top = ctx.value_state("top-n", ())

    def process(self, record: Any, ctx: Any) -> None:
        row = tuple(record)
        before = [tuple(r) for r in self.top.value()]
        after = _top_with(before, row, self.sort_key, self.limit, self.newest_wins_ties)
        if after is None:
            return
        self.top.update(tuple(after))
        if self.insert_only:  # rows only ever append (no order, or the first row): its rank is len(before) + 1
            if len(before) >= self.offset:
                ctx.emit((*row, len(before) + 1) if self.with_rank else row)
            return
        _emit_top_changes(ctx, before[self.offset:], after[self.offset:], self.with_rank, self.offset)


class RetractableTopNFunction(KeyedProcessFunction):
    """ROW_NUMBER() OVER (PARTITION BY ... ORDER BY ...) <= N over an updating input, Flink's
    RetractableTopNFunction: the input is (kind, row) pairs; per partition every row is kept in order (a row
    retracted from the top N lets the next one in, so the rows below it must be at hand), +I and +U insert a
    row (after its equals: the earlier row stays first), -U and -D remove one equal row (a row never seen is
    ignored). What changed in the top N is emitted: rows leaving it -D, rows entering it +I; with the rank in the
    output, every row whose rank changed is retracted and emitted again. State grows with the partition's rows
    (as Flink's does: it keeps them all too). With `offset` m only ranks m+1..limit are the output."""

    def __init__(self, limit: int, sort_key: Callable[[Any], Any], with_rank: bool, offset: int = 0) -> None:
        self.limit = limit
        self.offset = offset
        self.sort_key = sort_key
        self.with_rank = with_rank

    def open(self, ctx: Any) -> None:
        self.rows = ctx.value_state("retractable-top-n", ())

    def process(self, record: Any, ctx: Any) -> None:
        kind, row = record
        row = tuple(row)
        rows = [tuple(r) for r in self.rows.value()]
        before = rows[self.offset:self.limit]
        if kind in (UPDATE_BEFORE, DELETE):
            if row not in rows:
                return
            rows.remove(row)
        else:
            position = _insert_position([self.sort_key(r) for r in rows], self.sort_key(row), False)
            rows.insert(position, row)
        if rows:
            self.rows.update(tuple(rows))
        else:
            self.rows.clear()
        _emit_top_changes(ctx, before, rows[self.offset:self.limit], self.with_rank, self.offset)


def _emit_top_changes(ctx: Any, before: list[Any], after: list[Any], with_rank: bool, offset: int = 0) -> None:
    """What changed from top N `before` to `after` (the ranks from offset + 1 on): -D for the rows that left it
    (with the rank, also those whose rank changed), then +I for the rows that entered it (or took a new rank)."""
    if with_rank:
        old = [(r, offset + i + 1) for i, r in enumerate(before)]
        new = [(r, offset + i + 1) for i, r in enumerate(after)]
    else:
        old = [(r, 0) for r in before]
        new = [(r, 0) for r in after]
    for r, rank in _missing(old, new):
        ctx.emit((DELETE, (*r, rank) if with_rank else r))
    for r, rank in _missing(new, old):
        ctx.emit((INSERT, (*r, rank) if with_rank else r))


def _missing(these: list[Any], others: list[Any]) -> list[Any]:
    """The entries of `these` not in `others`, counting duplicates (two equal rows are two entries)."""
    left = list(others)
    out = []
    for entry in these:
        if entry in left:
            left.remove(entry)
        else:
            out.append(entry)
    return out


class SortKey:
    """A sort key of several columns with their own directions, comparable with `<` (NULLs first ascending,
    last descending, as Flink orders them)."""

    __slots__ = ("values", "descending")

    def __init__(self, values: tuple[Any, ...], descending: tuple[bool, ...]) -> None:
        self.values = values
        self.descending = descending

    def __lt__(self, other: SortKey) -> bool:
        for a, b, desc in zip(self.values, other.values, self.descending, strict=True):
            if a == b:
                continue
            if a is None or b is None:
                return (a is None) != desc
            return (a > b) if desc else (a < b)
        return False


def _top_with(top: list[Any], row: Any, sort_key: Callable[[Any], Any], limit: int,
              newest_wins_ties: bool) -> list[Any] | None:
    """The top `limit` rows `top` with `row` in its place (the last pushed out when full), or None when it does
    not enter."""
    position = _insert_position([sort_key(r) for r in top], sort_key(row), newest_wins_ties)
    if position >= limit:
        return None
    return (top[:position] + [row] + top[position:])[:limit]


def _insert_position(keys: list[Any], key: Any, newest_wins_ties: bool) -> int:
    """Where a row of sort key `key` goes among rows of sort keys `keys` (in order): after every equal key (the
    earlier row stays first), or before them when the newest row wins ties."""
    for i, k in enumerate(keys):
        if key < k or (newest_wins_ties and not k < key):
            return i
    return len(keys)


class WindowTopNFunction(KeyedProcessFunction):
    """ROW_NUMBER() OVER (PARTITION BY window_start, window_end, ... ORDER BY ...) <= N over a window TVF or a
    window aggregation, Flink's WindowRank / WindowDeduplicate: keyed by the partition (which holds the window),
    the N first rows of the order are kept, and emitted once, insert-only, when the watermark passes the
    window's end (the timer at window_end - 1: each row's timestamp is its window_time). A row whose window
    already fired is dropped, as Flink drops it. Ties keep the earlier row first, or the later one when
    `newest_wins_ties` (deduplication keeping the last row)."""

    def __init__(self, limit: int, sort_key: Callable[[Any], Any], end_index: int, with_rank: bool,
                 newest_wins_ties: bool = False) -> None:
        self.limit = limit
        self.sort_key = sort_key
        self.end_index = end_index
        self.with_rank = with_rank
        self.newest_wins_ties = newest_wins_ties

    def open(self, ctx: Any) -> None:
        self.top = ctx.value_state("window-top-n", ())

    def process(self, record: Any, ctx: Any) -> None:
        row = tuple(record)
        fires_at = row[self.end_index] - 1
        if fires_at <= ctx.current_watermark:
            return
        before = [tuple(r) for r in self.top.value()]
        after = _top_with(before, row, self.sort_key, self.limit, self.newest_wins_ties)
        if after is None:
            return
        if not before:
            ctx.timers.register_event_time(fires_at)
        self.top.update(tuple(after))

    def on_timer(self, timestamp: int, ctx: Any) -> None:
        rows = self.top.value()
        self.top.clear()
        for rank, r in enumerate(rows, 1):
            ctx.emit((*r, rank) if self.with_rank else tuple(r))


class WindowJoinFunction(KeyedCoProcessFunction):
    """Two window TVFs (or window aggregations) joined on window_start, window_end and equi keys, Flink's
    WindowJoin: keyed by (window, keys), both sides' rows of a window are kept until the watermark passes its
    end (the timer at window_end - 1), then joined once and dropped: each pair passing `condition` is emitted
    (insert-only); with an outer side, its rows without a match come padded with NULLs. Rows whose window
    already fired are dropped, as Flink drops them."""

    def __init__(self, how: str, left_width: int, right_width: int, left_end: int, right_end: int,
                 condition: Callable[[Any], Any] | None = None) -> None:
        self.outer_left = how in ("left", "full")
        self.outer_right = how in ("right", "full")
        self.left_nulls = (None,) * left_width
        self.right_nulls = (None,) * right_width
        self.left_end = left_end
        self.right_end = right_end
        self.condition = condition

    def open(self, ctx: Any) -> None:
        self.left = ctx.list_state("window-join:left")
        self.right = ctx.list_state("window-join:right")

    def process1(self, record: Any, ctx: Any) -> None:
        self._arrive(tuple(record), ctx, self.left, record[self.left_end] - 1)

    def process2(self, record: Any, ctx: Any) -> None:
        self._arrive(tuple(record), ctx, self.right, record[self.right_end] - 1)

    def _arrive(self, row: tuple[Any, ...], ctx: Any, side: Any, fires_at: int) -> None:
        if fires_at <= ctx.current_watermark:
            return
        side.add(row)
        ctx.timers.register_event_time(fires_at)

    def on_timer(self, timestamp: int, ctx: Any) -> None:
        lefts = [tuple(r) for r in self.left.get()]
        rights = [tuple(r) for r in self.right.get()]
        self.left.update([])
        self.right.update([])
        condition = self.condition
        right_matched = [False] * len(rights)
        for left in lefts:
            matched = False
            for i, right in enumerate(rights):
                joined = (*left, *right)
                if condition is not None and not condition(joined):
                    continue
                matched = True
                right_matched[i] = True
                ctx.emit(joined)
            if not matched and self.outer_left:
                ctx.emit((*left, *self.right_nulls))
        if self.outer_right:
            for right, matched in zip(rights, right_matched, strict=True):
                if not matched:
                    ctx.emit((*self.left_nulls, *right))



def _wait_for_watermark(pending: Any, ts: int, record: Any, ctx: Any) -> None:
    """Keep `record` in `pending` (timestamp -> rows in arrival order) until the watermark passes `ts`."""
    pending.put(ts, [*(pending.get(ts) or ()), tuple(record)])
    ctx.timers.register_event_time(ts)


def _due_rows(pending: Any, ts: int) -> list[tuple[Any, ...]]:
    """The rows kept for `ts`, in arrival order, taken out of `pending` (their timer fired)."""
    rows = [tuple(r) for r in pending.get(ts) or ()]
    pending.remove(ts)
    return rows

class OverAggregateFunction(KeyedProcessFunction):
    """SUM/COUNT/MIN/MAX/AVG(...) OVER (PARTITION BY ... ORDER BY rowtime ROWS|RANGE BETWEEN ... PRECEDING AND
    CURRENT ROW), Flink's row-time over aggregation: rows wait (per key and timestamp) until the watermark
    passes their timestamp, then are emitted in timestamp order, each with the aggregates of its frame appended:
    ROWS the `preceding` rows before it and itself, RANGE every row whose timestamp is at most `preceding` ms
    before its own (rows of one timestamp are peers: all of them in each other's frame); `preceding` None is
    UNBOUNDED. A row at or before the last timestamp emitted for its key is late and dropped, as Flink drops it.
    Insert-only."""

    def __init__(self, aggregate: Any, *, rows: bool, preceding: int | None, time_index: int) -> None:
        self.aggregate = aggregate
        self.rows = rows
        self.preceding = preceding
        self.time_index = time_index

    def open(self, ctx: Any) -> None:
        self.pending = ctx.map_state("over:pending")  # timestamp -> its rows, in arrival order
        self.kept = ctx.value_state("over:kept", ())  # a bounded frame's earlier rows: (timestamp, row) pairs
        self.accumulator = ctx.value_state("over:accumulator", None)  # an UNBOUNDED frame's
        self.last = ctx.value_state("over:last", None)  # the last timestamp emitted (Flink's lastTriggeringTs)

    def process(self, record: Any, ctx: Any) -> None:
        ts = record[self.time_index]
        last = self.last.value()
        if last is not None and ts <= last:
            return
        _wait_for_watermark(self.pending, ts, record, ctx)

    def on_timer(self, timestamp: int, ctx: Any) -> None:
        rows = _due_rows(self.pending, timestamp)
        self.last.update(timestamp)
        agg = self.aggregate
        if self.preceding is None:
            acc = self.accumulator.value()
            acc = agg.create_accumulator() if acc is None else acc
            if self.rows:
                for r in rows:
                    acc = agg.add(r, acc)
                    ctx.emit((*r, *agg.get_result(acc)))
            else:
                for r in rows:
                    acc = agg.add(r, acc)
                result = tuple(agg.get_result(acc))
                for r in rows:
                    ctx.emit((*r, *result))
            self.accumulator.update(acc)
            return
        kept = [(t, tuple(r)) for t, r in self.kept.value()]
        if self.rows:
            n = self.preceding
            for r in rows:  # `kept` holds the n rows before this one (fewer at the start)
                acc = agg.create_accumulator()
                for _, f in kept:
                    acc = agg.add(f, acc)
                acc = agg.add(r, acc)
                ctx.emit((*r, *agg.get_result(acc)))
                kept = (kept + [(timestamp, r)])[-n:] if n else []
        else:
            kept = [(t, k) for t, k in kept if t >= timestamp - self.preceding] + [(timestamp, r) for r in rows]
            acc = agg.create_accumulator()
            for _, f in kept:
                acc = agg.add(f, acc)
            result = tuple(agg.get_result(acc))
            for r in rows:
                ctx.emit((*r, *result))
        self.kept.update(tuple(kept))


class TemporalSortFunction(KeyedProcessFunction):
    """ORDER BY rowtime [ASC][, ...] without LIMIT, Flink's RowTimeSortOperator: each row waits (per timestamp)
    until the watermark passes its rowtime, then the rows of that timestamp go out in the order's other keys
    (ties in arrival order). A row at or behind the watermark when it arrives is late and dropped, as Flink
    drops it. Insert-only."""

    def __init__(self, time_index: int, sort_key: Callable[[Any], Any]) -> None:
        self.time_index = time_index
        self.sort_key = sort_key

    def open(self, ctx: Any) -> None:
        self.pending = ctx.map_state("sort:pending")  # timestamp -> its rows, in arrival order

    def process(self, record: Any, ctx: Any) -> None:
        ts = record[self.time_index]
        if ts <= ctx.current_watermark:
            return
        _wait_for_watermark(self.pending, ts, record, ctx)

    def on_timer(self, timestamp: int, ctx: Any) -> None:
        rows = _due_rows(self.pending, timestamp)
        for row in sorted(rows, key=self.sort_key):
            ctx.emit(row)


class WatermarkCalc(ProcessFunction):
    """A Calc whose expressions read CURRENT_WATERMARK: its filter and projection are functions of (row,
    watermark), called with the operator's current watermark (None before the first one, as Flink's NULL)."""

    def __init__(self, predicate: Callable[..., Any] | None, project: Callable[..., Any] | None,
                 build: Callable[[Any], Any] | None = None) -> None:
        self.predicate = predicate
        self.project = project
        self.build = build  # a window operator's (key, start, end, results) -> the row

    def process(self, record: Any, ctx: Any) -> None:
        wm = ctx.current_watermark
        watermark = None if wm <= MIN_WATERMARK else wm
        row = record if self.build is None else self.build(record)
        if self.predicate is not None and not self.predicate(row, watermark):
            return
        ctx.emit(row if self.project is None else self.project(row, watermark))
