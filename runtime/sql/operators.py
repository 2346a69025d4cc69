"""The few operators SQL needs that the DataStream API does not have as such, built on its public classes:
CUMULATE windows (a WindowAssigner), the unbounded group aggregation (a KeyedProcessFunction emitting a
changelog), and the per-record functions of window table functions without an aggregation."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from runtime.api import KeyedProcessFunction
from runtime.api.windows import WindowAssigner
from runtime.sql.changelog import INSERT, UPDATE_AFTER, UPDATE_BEFORE


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
        before = agg.get_result(acc)
        acc = agg.add(record, acc)
        self.accumulators.update(acc)
        after = agg.get_result(acc)
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
