"""The few operators SQL needs that the DataStream API does not have as such, built on its public classes:
CUMULATE windows (a WindowAssigner), the unbounded group aggregation (a KeyedProcessFunction emitting a
changelog), regular joins (a KeyedCoProcessFunction), Top-N and deduplication, and the per-record functions of
window table functions without an aggregation."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from runtime.api import KeyedCoProcessFunction, KeyedProcessFunction
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
    """A regular (unbounded) equi-join, Flink's StreamingJoinOperator over append-only inputs: per key both
    sides' rows are kept (with `ttl_ms`, Flink's table.exec.state.ttl, they expire), every arriving row joins
    the other side's rows that pass `condition`. Inner: insert-only output (plain rows). Outer: a changelog;
    a row of an outer side without a match is emitted padded with NULLs (+I), and retracted (-D) when its
    first match arrives."""

    def __init__(self, how: str, left_width: int, right_width: int,
                 condition: Callable[[Any], Any] | None = None, ttl_ms: int | None = None) -> None:
        self.how = how
        self.outer_left = how in ("left", "full")
        self.outer_right = how in ("right", "full")
        self.changelog = how != "inner"
        self.left_nulls = (None,) * left_width
        self.right_nulls = (None,) * right_width
        self.condition = condition
        self.ttl_ms = ttl_ms

    def open(self, ctx: Any) -> None:
        self.left = ctx.value_state("join:left", (), ttl_ms=self.ttl_ms)
        self.right = ctx.value_state("join:right", (), ttl_ms=self.ttl_ms)

    def process1(self, record: Any, ctx: Any) -> None:
        self._arrive(tuple(record), ctx, True)

    def process2(self, record: Any, ctx: Any) -> None:
        self._arrive(tuple(record), ctx, False)

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
    the first row: insert-only (plain rows)."""

    def __init__(self, limit: int, sort_key: Callable[[Any], Any], with_rank: bool, insert_only: bool,
                 newest_wins_ties: bool = False) -> None:
        self.limit = limit
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
        key = self.sort_key(row)
        before = [tuple(r) for r in self.top.value()]
        keys = [self.sort_key(r) for r in before]
        position = len(keys)
        newest = self.newest_wins_ties
        for i, k in enumerate(keys):
            if key < k or (newest and not k < key):  # else after every equal key: the earlier row stays first
                position = i
                break
        if position >= self.limit:
            return
        after = before[:position] + [row] + before[position:]
        after = after[:self.limit]
        self.top.update(tuple(after))
        if self.insert_only:
            ctx.emit((*row, 1) if self.with_rank else row)
            return
        if self.with_rank:
            old = {(r, i + 1) for i, r in enumerate(before)}
            new = {(r, i + 1) for i, r in enumerate(after)}
            for r, rank in [(r, i + 1) for i, r in enumerate(before) if (r, i + 1) not in new]:
                ctx.emit((DELETE, (*r, rank)))
            for r, rank in [(r, i + 1) for i, r in enumerate(after) if (r, i + 1) not in old]:
                ctx.emit((INSERT, (*r, rank)))
            return
        if len(before) == self.limit:
            ctx.emit((DELETE, before[-1]))
        ctx.emit((INSERT, row))


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
