"""Aggregate calls over an updating input (a changelog of +I, -U, +U, -D): one accumulator that both adds and
retracts a row, as Flink's GroupAggregate with retraction does it.

The accumulator is a list: slot 0 counts the group's rows (Flink's record counter: at zero the group is gone and
its row is deleted), then one slot per call. COUNT and COUNT(*) subtract; SUM and AVG keep [sum, count of
non-NULL values] and subtract (Flink's SumWithRetract: the sum is NULL once no value is left); MIN and MAX keep
[current, {value: count}], the multiset of the group's values (Flink's MinWithRetract / MaxWithRetract): a
retraction of the current extreme picks the next one from the multiset; COUNT(DISTINCT) keeps {value: count}.
Map keys are the values themselves (a DECIMAL as its exact text), so the accumulator stays msgpack-friendly as
keyed state must (runtime/api/state.py). The calls' arguments and FILTER conditions are compiled once into one
function of the row; accumulators in state are never changed in place (each change builds a new list).
"""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal
from typing import Any

from runtime.sql.aggregates import AggregateCall, _avg
from runtime.sql.errors import SqlError
from runtime.sql.expressions import ExpressionCompiler


class RetractingAggregate:
    """`add(row, acc)`, `retract(row, acc)`, `rows(acc)` (how many rows the group holds) and
    `get_result(acc)`: the results of `calls` in order (module docstring)."""

    def __init__(self, calls: list[AggregateCall], compiler: ExpressionCompiler) -> None:
        self.calls = calls
        self.kinds = [c.kind for c in calls]
        self.decimal = [False] * len(calls)
        parts: list[str] = []  # per call: (argument or None, condition or True)
        for i, call in enumerate(calls):
            if call.kind not in ("COUNT_STAR", "COUNT", "COUNT_DISTINCT", "SUM", "AVG", "MIN", "MAX"):
                raise SqlError(f"aggregate {call.text} is not supported over an updating input")
            arg = compiler.compile(call.argument).text if call.argument is not None else "None"
            if call.argument is not None:
                self.decimal[i] = compiler.compile(call.argument).type.name == "DECIMAL"
            cond = compiler.predicate_text(call.condition) if call.condition is not None else "True"
            parts.append(f"({arg}, {cond}), ")
        self._inputs: Callable[[Any], Any] = compiler.build("lambda r: (" + "".join(parts) + ")")
        self.width = 1 + len(calls)

    def create_accumulator(self) -> list[Any]:
        acc: list[Any] = [0]
        for kind in self.kinds:
            if kind in ("COUNT_STAR", "COUNT"):
                acc.append(0)
            elif kind == "COUNT_DISTINCT":
                acc.append({})
            elif kind in ("SUM", "AVG"):
                acc.append([None, 0])
            else:
                acc.append([None, {}])
        return acc

    def rows(self, acc: Any) -> int:
        return int(acc[0])

    def add(self, row: Any, acc: Any) -> list[Any]:
        return self._change(row, acc, 1)

    def retract(self, row: Any, acc: Any) -> list[Any]:
        return self._change(row, acc, -1)

    def _change(self, row: Any, acc: Any, sign: int) -> list[Any]:
        out = [acc[0] + sign]
        for i, ((value, passes), kind, slot) in enumerate(zip(self._inputs(row), self.kinds, acc[1:], strict=True)):
            if not passes or (value is None and kind != "COUNT_STAR"):
                out.append(slot)
            elif kind in ("COUNT_STAR", "COUNT"):
                out.append(slot + sign)
            elif kind == "COUNT_DISTINCT":
                out.append(_counted(slot, value, sign))
            elif kind in ("SUM", "AVG"):
                total, count = slot
                if self.decimal[i]:
                    change = Decimal(value) * sign
                    total = str(change if total is None else Decimal(total) + change)
                else:
                    total = value * sign if total is None else total + value * sign
                count += sign
                out.append([None if count == 0 else total, count])
            else:
                out.append(self._extreme(slot, value, sign, kind == "MAX", self.decimal[i]))
        return out

    @staticmethod
    def _extreme(slot: Any, value: Any, sign: int, is_max: bool, decimal: bool) -> list[Any]:
        current, counts = slot
        key = str(value) if decimal else value
        counts = _counted(counts, key, sign)
        number: Callable[[Any], Any] = Decimal if decimal else _same

        def better(a: Any, b: Any) -> bool:  # a is further out than b
            return number(a) > number(b) if is_max else number(a) < number(b)
        if sign > 0:
            if current is None or better(key, current):
                current = key
        elif key == current and key not in counts:  # its last copy retracted: the next one from the multiset
            current = None
            for k in counts:
                if current is None or better(k, current):
                    current = k
        return [current, counts]

    def get_result(self, acc: Any) -> tuple[Any, ...]:
        results: list[Any] = []
        for kind, slot, call, decimal in zip(self.kinds, acc[1:], self.calls, self.decimal, strict=True):
            if kind in ("COUNT_STAR", "COUNT"):
                results.append(slot)
            elif kind == "COUNT_DISTINCT":
                results.append(len(slot))
            elif kind == "SUM":
                results.append(Decimal(slot[0]) if decimal and slot[0] is not None else slot[0])
            elif kind == "AVG":
                results.append(_avg(slot[0], slot[1], call.type.name))
            else:
                results.append(Decimal(slot[0]) if decimal and slot[0] is not None else slot[0])
        return tuple(results)


def _counted(counts: Any, key: Any, sign: int) -> dict[Any, int]:
    """A multiset {value: count} with `key` added (sign 1) or removed once (sign -1; absent keys stay absent:
    a retraction of a row never added changes nothing)."""
    n = counts.get(key, 0) + sign
    if n < 0:
        return dict(counts)
    out = dict(counts)
    if n == 0:
        out.pop(key, None)
    else:
        out[key] = n
    return out


def _same(value: Any) -> Any:
    return value
