"""A join's condition split the way the planner needs it (pure): equality of a left and a right column (the
join keys), bounds on the distance of the two sides' rowtimes (an interval join), and what is left (a filter).

Time bounds are read from comparisons between `left_time [± INTERVAL]` and `right_time [± INTERVAL]`: `=`, `<`,
`<=`, `>`, `>=` and BETWEEN, in either order, and become bounds on `right_time - left_time`: [lower, upper],
inclusive (a strict comparison moves its bound by one millisecond, as time is in milliseconds).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlglot import exp

from runtime.sql.errors import SqlError
from runtime.sql.expressions import Scope, interval_ms


@dataclass
class JoinCondition:
    left_keys: list[exp.Expr] = field(default_factory=list)
    right_keys: list[exp.Expr] = field(default_factory=list)
    lower: int | None = None  # right_time - left_time >= lower
    upper: int | None = None  # right_time - left_time <= upper
    rest: list[exp.Expr] = field(default_factory=list)

    @property
    def interval(self) -> bool:
        return self.lower is not None and self.upper is not None


def conjuncts(node: exp.Expr | None) -> list[exp.Expr]:
    if node is None:
        return []
    if isinstance(node, exp.And):
        return conjuncts(node.this) + conjuncts(node.expression)
    if isinstance(node, exp.Paren):
        return conjuncts(node.this)
    return [node]


def side_of(node: exp.Expr, left: Scope, right: Scope) -> str | None:
    """'left' or 'right' when every column of `node` is of that side, 'both', or None for no column."""
    sides = set()
    for column in node.find_all(exp.Column):
        sides.add(_column_side(column, left, right))
    if not sides:
        return None
    return sides.pop() if len(sides) == 1 else "both"


def _column_side(column: exp.Column, left: Scope, right: Scope) -> str:
    found = []
    for name, scope in (("left", left), ("right", right)):
        try:
            scope.resolve(column)
            found.append(name)
        except SqlError:
            pass
    if len(found) != 1:
        what = "ambiguous between the joined tables: qualify it" if found else "not a column of the joined tables"
        raise SqlError(f"Column '{column.sql()}' is {what}")
    return found[0]


def split(conditions: list[exp.Expr], left: Scope, right: Scope, left_time: int | None,
          right_time: int | None) -> JoinCondition:
    out = JoinCondition()
    for c in conditions:
        if isinstance(c, exp.EQ):
            a, b = side_of(c.this, left, right), side_of(c.expression, left, right)
            if {a, b} == {"left", "right"} and not _is_time(c, left, right, left_time, right_time):
                lhs, rhs = (c.this, c.expression) if a == "left" else (c.expression, c.this)
                out.left_keys.append(lhs)
                out.right_keys.append(rhs)
                continue
        if not _time_bound(c, out, left, right, left_time, right_time):
            out.rest.append(c)
    return out


def _is_time(c: exp.Binary, left: Scope, right: Scope, left_time: int | None, right_time: int | None) -> bool:
    return _time_term(c.this, left, right, left_time, right_time) is not None and \
        _time_term(c.expression, left, right, left_time, right_time) is not None


def _time_term(node: exp.Expr, left: Scope, right: Scope, left_time: int | None,
               right_time: int | None) -> tuple[str, int] | None:
    """`col`, `col + INTERVAL`, `col - INTERVAL` over a side's rowtime -> (side, offset ms)."""
    offset = 0
    if isinstance(node, exp.Paren):
        return _time_term(node.this, left, right, left_time, right_time)
    if isinstance(node, exp.Add | exp.Sub) and isinstance(node.expression, exp.Interval):
        offset = interval_ms(node.expression) * (1 if isinstance(node, exp.Add) else -1)
        node = node.this
    if not isinstance(node, exp.Column):
        return None
    side = _column_side(node, left, right)
    index = (left if side == "left" else right).resolve(node)
    if index != (left_time if side == "left" else right_time):
        return None
    return side, offset


def _time_bound(c: exp.Expr, out: JoinCondition, left: Scope, right: Scope, left_time: int | None,
                right_time: int | None) -> bool:
    if left_time is None or right_time is None:
        return False
    if isinstance(c, exp.Between):
        low = exp.GTE(this=c.this, expression=c.args["low"])
        high = exp.LTE(this=c.this, expression=c.args["high"])
        probe = JoinCondition()
        if _time_bound(low, probe, left, right, left_time, right_time) and \
                _time_bound(high, probe, left, right, left_time, right_time):
            _merge(out, probe.lower, probe.upper)
            return True
        return False
    ops = {exp.GTE: (">=", 0), exp.GT: (">=", 1), exp.LTE: ("<=", 0), exp.LT: ("<=", 1), exp.EQ: ("=", 0)}
    kind = ops.get(type(c))  # type: ignore[arg-type]
    if kind is None:
        return False
    a = _time_term(c.this, left, right, left_time, right_time)  # type: ignore[attr-defined]
    b = _time_term(c.expression, left, right, left_time, right_time)  # type: ignore[attr-defined]
    if a is None or b is None or a[0] == b[0]:
        return False
    op, strict = kind
    if a[0] == "right":  # r + ra  op  l + lb  ->  r - l  op  lb - ra
        bound = b[1] - a[1]
        if op == ">=":
            _merge(out, bound + strict, None)
        elif op == "<=":
            _merge(out, None, bound - strict)
        else:
            _merge(out, bound, bound)
    else:  # l + la  op  r + rb  ->  r - l  (op reversed)  la - rb
        bound = a[1] - b[1]
        if op == ">=":
            _merge(out, None, bound - strict)
        elif op == "<=":
            _merge(out, bound + strict, None)
        else:
            _merge(out, bound, bound)
    return True


def _merge(out: JoinCondition, lower: int | None, upper: int | None) -> None:
    if lower is not None:
        out.lower = lower if out.lower is None else max(out.lower, lower)
    if upper is not None:
        out.upper = upper if out.upper is None else min(out.upper, upper)
