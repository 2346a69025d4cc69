"""The event-time temporal join, Flink's TemporalRowTimeJoinOperator: `FROM o JOIN r FOR SYSTEM_TIME AS OF
o.rowtime ON o.k = r.pk` against a versioned table (a primary key and a rowtime). Keyed by the join key, the
left rows wait until the watermark passes their time; then each joins the version of its key valid at that
time (the right row with the latest rowtime at or before it) and is dropped; versions older than the one valid
at the watermark are dropped with it. All of it is keyed state and event-time timers, so a checkpoint holds it
and a rescale moves it with its keys."""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable
from typing import Any

from runtime.api import KeyedCoProcessFunction
from runtime.sql.changelog import DELETE, UPDATE_BEFORE


class TemporalJoinFunction(KeyedCoProcessFunction):
    """Left rows (insert-only) in `process1`, the versioned table's rows in `process2`: plain rows, or (kind, row)
    pairs when `right_changelog` (then -U is ignored, as Flink's planner sends the temporal join only +U, and a
    -D is a version too: a left row it is valid for has no match; unless not `right_deletes`: a deduplication's
    -D only says that a newer row replaced it, which that row's own version says). A version is stored at its
    rowtime (a later row of the same key and rowtime replaces it, as in Flink). Each left row is emitted when
    the watermark reaches its rowtime (the timer at it): joined when its version exists, is not a deletion and passes
    `condition`; else padded with NULLs for a LEFT join, else nothing. Insert-only output, in rowtime order
    per key."""

    def __init__(self, how: str, right_width: int, left_time: int, right_time: int,
                 condition: Callable[[Any], Any] | None = None, *, right_changelog: bool = False,
                 right_deletes: bool = True) -> None:
        self.left_outer = how == "left"
        self.right_nulls = (None,) * right_width
        self.left_time = left_time
        self.right_time = right_time
        self.condition = condition
        self.right_changelog = right_changelog
        self.right_deletes = right_deletes

    def open(self, ctx: Any) -> None:
        self.lefts = ctx.map_state("temporal:left")  # arrival number -> a left row waiting for the watermark
        self.next_left = ctx.value_state("temporal:next-left", 0)
        self.versions = ctx.map_state("temporal:versions")  # rowtime -> (is a deletion, the right row)

    def process1(self, record: Any, ctx: Any) -> None:
        row = tuple(record)
        n = self.next_left.value()
        self.lefts.put(n, row)
        self.next_left.update(n + 1)
        # a late row (its time already passed) fires at the next watermark, joining what is left then
        ctx.timers.register_event_time(row[self.left_time])

    def process2(self, record: Any, ctx: Any) -> None:
        deleted = False
        if self.right_changelog:
            kind, record = record
            if kind == UPDATE_BEFORE or (kind == DELETE and not self.right_deletes):
                return
            deleted = kind == DELETE
        row = tuple(record)
        at = row[self.right_time]
        self.versions.put(at, (deleted, row))
        ctx.timers.register_event_time(at)  # where older versions can be dropped

    def on_timer(self, timestamp: int, ctx: Any) -> None:
        # as Flink's: every left row the watermark passed goes now, and the cleanup is up to the watermark (a
        # late version behind it is dropped at once when a newer one is valid there, so a later late row misses)
        until = max(timestamp, ctx.current_watermark)
        versions = sorted((t, tuple(v)) for t, v in self.versions.items())
        times = [t for t, _ in versions]
        due = sorted((row[self.left_time], n, row) for n, row in self.lefts.items()
                     if row[self.left_time] <= until)
        for at, n, row in due:
            self.lefts.remove(n)
            # the output keeps the left row's rowtime as its event time (a window over the join assigns by it),
            # not the timer's: one firing emits every row the watermark passed
            ctx.timestamp = at
            i = bisect_right(times, at) - 1
            if i >= 0 and not versions[i][1][0]:
                joined = (*row, *versions[i][1][1])
                if self.condition is None or self.condition(joined):
                    ctx.emit(joined)
                    continue
            if self.left_outer:
                ctx.emit((*row, *self.right_nulls))
        ctx.timestamp = timestamp
        # the version valid at the watermark stays (a left row at or after it may need it); older ones go
        keep_from = bisect_right(times, until) - 1
        for t in times[:max(keep_from, 0)]:
            self.versions.remove(t)
        if self.lefts.is_empty():
            self.next_left.clear()

