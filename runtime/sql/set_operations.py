"""INTERSECT and EXCEPT (and their ALL forms) over streams, as Flink plans them: the rows of both sides keyed by
the whole row, a count per side in keyed state, the output changing with the counts. The multiplicity of a row
in the result is a pure function of its two counts (`multiplicity`); the operator emits +I or -D for each copy
that multiplicity gains or loses, so the result is updating as Flink's is (Flink's GroupAggregate and filter
send -U/+U where this sends -D/+I: the same rows in the end)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from runtime.api import KeyedProcessFunction
from runtime.sql.changelog import DELETE, INSERT, UPDATE_BEFORE


def multiplicity(kind: str, every: bool, left: int, right: int) -> int:
    """How many copies of a row with `left` copies on the left and `right` on the right the result holds."""
    if kind == "INTERSECT":
        return max(min(left, right), 0) if every else int(left > 0 and right > 0)
    return max(left - right, 0) if every else int(left > 0 and right <= 0)


def signed_rows(from_left: bool, *, updating: bool) -> Callable[[Any], tuple[bool, int, tuple[Any, ...]]]:
    """A side's stream as (from the left, +1 or -1, row): an updating side's -U and -D take a copy away."""
    if not updating:
        return lambda row: (from_left, 1, tuple(row))
    return lambda e: (from_left, -1 if e[0] in (UPDATE_BEFORE, DELETE) else 1, tuple(e[1]))


class SetOperationFunction(KeyedProcessFunction):
    """Keyed by the row: counts (left, right) in value state; each change of the row's multiplicity is emitted
    as that many +I (more copies) or -D (fewer). A row whose counts are both back to zero drops its state."""

    def __init__(self, kind: str, *, every: bool) -> None:
        self.kind = kind
        self.every = every

    def open(self, ctx: Any) -> None:
        self.counts = ctx.value_state("set:counts", None)

    def process(self, record: Any, ctx: Any) -> None:
        from_left, sign, row = record
        left, right = self.counts.value() or (0, 0)
        before = multiplicity(self.kind, self.every, left, right)
        if from_left:
            left += sign
        else:
            right += sign
        after = multiplicity(self.kind, self.every, left, right)
        if left == 0 and right == 0:
            self.counts.clear()
        else:
            self.counts.update((left, right))
        row = tuple(row)
        for _ in range(after - before):
            ctx.emit((INSERT, row))
        for _ in range(before - after):
            ctx.emit((DELETE, row))
