"""Aggregate calls (COUNT, COUNT DISTINCT, SUM, MIN, MAX, AVG, Python aggregate functions, with FILTER) compiled
into one accumulator.

All the aggregate calls of a query share one accumulator: a tuple with a slot per call (AVG takes two: sum and
count). `add(row, acc)`, `merge(a, b)` and `result(acc)` are generated as single Python functions, once, so
adding a row is one call however many aggregates there are. Accumulators stay msgpack-friendly, as keyed state
must (runtime/api/state.py): ints, floats, strings, None, and a dict of seen values for COUNT DISTINCT; a
DECIMAL sum is kept as its exact text; a Python aggregate function's slot holds its own accumulator (any
picklable value). Values in state are never mutated: every add builds a new tuple.

Result types follow Flink: COUNT is BIGINT NOT NULL, SUM and MIN/MAX keep the argument's type, AVG of an integral
column is integral (truncated, as Flink's), of a DECIMAL a DECIMAL, else DOUBLE.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from sqlglot import exp

from runtime.api.state import AggregateFunction
from runtime.sql import types as T
from runtime.sql.errors import SqlError
from runtime.sql.expressions import AGGREGATES, ExpressionCompiler
from runtime.sql.types import SqlType


@dataclass(frozen=True)
class AggregateCall:
    """One aggregate of the query: `kind` (COUNT_STAR, COUNT, COUNT_DISTINCT, SUM, MIN, MAX, AVG), its argument
    and FILTER condition (None when absent), the SQL text the SELECT list refers to it by, its result type."""

    kind: str
    argument: exp.Expr | None
    condition: exp.Expr | None
    text: str
    type: SqlType
    arguments: tuple[exp.Expr, ...] = ()  # kind PYTHON: the arguments of the Python aggregate function
    function: Any = None  # kind PYTHON: its AggregateFunction-like instance


def find_aggregates(nodes: list[exp.Expr], is_python_aggregate: Callable[[str], bool] = lambda name: False
                    ) -> list[exp.Expr]:
    """The aggregate calls in `nodes` (outermost; FILTER-wrapped ones whole), each SQL text once, in order; a call
    of a function whose name `is_python_aggregate` is one too."""
    def aggregate(node: exp.Expr) -> bool:
        return isinstance(node, AGGREGATES) or (isinstance(node, exp.Anonymous) and is_python_aggregate(node.name))

    found: dict[str, exp.Expr] = {}
    for node in nodes:
        for sub in node.walk(bfs=False):
            filtered = isinstance(sub, exp.Filter) and aggregate(sub.this)
            if filtered or (aggregate(sub) and not isinstance(sub.parent, exp.Filter)):
                found.setdefault(sub.sql(), sub)
    return list(found.values())


def describe_call(node: exp.Expr, compiler: ExpressionCompiler) -> AggregateCall:
    condition = None
    text = node.sql()
    if isinstance(node, exp.Filter):
        condition = node.expression.this if isinstance(node.expression, exp.Where) else node.expression
        node = node.this
    if isinstance(node, exp.Anonymous):  # a Python aggregate function (find_aggregates found it one)
        udf = compiler.functions.get(node.name) or compiler.functions[node.name.upper()]
        function = udf.aggregate()
        if any(isinstance(a, exp.Distinct) for a in node.expressions):
            raise SqlError(f"{text}: DISTINCT is supported in COUNT only")
        types = [compiler.compile(a).type for a in node.expressions]
        return AggregateCall("PYTHON", None, condition, text, udf.result_type(function, types),
                             tuple(node.expressions), function)
    arg = node.this
    distinct = isinstance(arg, exp.Distinct)
    if distinct:
        if len(arg.expressions) != 1:
            raise SqlError(f"{text}: DISTINCT over one column only")
        arg = arg.expressions[0]
    if isinstance(node, exp.Count):
        if isinstance(arg, exp.Star) or arg is None:
            return AggregateCall("COUNT_STAR", None, condition, text, T.BIGINT.not_null())
        return AggregateCall("COUNT_DISTINCT" if distinct else "COUNT", arg, condition, text, T.BIGINT.not_null())
    if distinct:
        raise SqlError(f"{text}: DISTINCT is supported in COUNT only")
    arg_type = compiler.compile(arg).type
    kind = type(node).__name__.upper()
    if kind in ("SUM", "AVG") and not arg_type.numeric:
        raise SqlError(f"{text}: {kind} needs a numeric argument, got {arg_type}")
    if kind == "AVG":
        result = arg_type if arg_type.numeric and arg_type.name != "FLOAT" else T.DOUBLE
        return AggregateCall(kind, arg, condition, text, result.or_null())
    return AggregateCall(kind, arg, condition, text, arg_type.or_null())


class CompiledAggregate(AggregateFunction):
    """The generated accumulator of a query's aggregate calls (module docstring), an AggregateFunction so the
    window operator (runtime/api/windows.py) and the group aggregation run it alike."""

    def __init__(self, calls: list[AggregateCall], compiler: ExpressionCompiler) -> None:
        self.calls = calls
        slots: list[str] = []  # the initial value of each slot
        adds: list[str] = []
        merges: list[str] = []
        results: list[str] = []
        ns = compiler.namespace
        ns.update(_avg=_avg, _dsum=_dsum, _Decimal=Decimal)
        for call in calls:
            i = len(slots)
            a = f"a[{i}]"
            arg = compiler.compile(call.argument) if call.argument is not None else None
            v = f"_a{i}"
            decimal = arg is not None and arg.type.name == "DECIMAL"
            plus = (lambda x, y: f"_dsum({x}, {y})") if decimal else (lambda x, y: f"{x} + {y}")
            text = arg.text if arg is not None else ""
            first = f"str({v})" if decimal else v  # a DECIMAL sum is kept as its text (module docstring)
            merge_sum = f"(a[{i}] if b[{i}] is None else b[{i}] if a[{i}] is None else {plus(f'a[{i}]', f'b[{i}]')})"
            if call.kind == "COUNT_STAR":
                slots.append("0")
                add = f"{a} + 1"
                merges.append(f"a[{i}] + b[{i}]")
                results.append(a)
            elif call.kind == "COUNT":
                slots.append("0")
                add = f"{a} + 1" if arg is not None and not arg.type.nullable else f"{a} + ({text} is not None)"
                merges.append(f"a[{i}] + b[{i}]")
                results.append(a)
            elif call.kind == "COUNT_DISTINCT":
                slots.append("{}")
                add = f"({a} if ({v} := {text}) is None or {v} in {a} else {{**{a}, {v}: 1}})"
                merges.append(f"{{**a[{i}], **b[{i}]}}")
                results.append(f"len({a})")
            elif call.kind == "SUM":
                if arg is not None and not arg.type.nullable and not decimal and call.condition is None:
                    # every row adds a value and a group (a window) has a row before its result is read: the sum
                    # is never NULL, so it starts at 0 with no checks at all, as a hand-written one would
                    slots.append("0")
                    add = f"{a} + {text}"
                else:
                    slots.append("None")
                    add = f"({a} if ({v} := {text}) is None else {first} if {a} is None else {plus(a, v)})"
                merges.append(merge_sum)
                results.append(f"(None if {a} is None else _Decimal({a}))" if decimal else a)
            elif call.kind in ("MIN", "MAX"):
                cmp = "<" if call.kind == "MIN" else ">"
                slots.append("None")
                keep = f"str({v})" if decimal else v
                better = f"_Decimal({v}) {cmp} _Decimal({a})" if decimal else f"{v} {cmp} {a}"
                add = f"({a} if ({v} := {text}) is None else {keep} if {a} is None or {better} else {a})"
                pick = f"_Decimal(b[{i}]) {cmp} _Decimal(a[{i}])" if decimal else f"b[{i}] {cmp} a[{i}]"
                merges.append(f"(a[{i}] if b[{i}] is None else b[{i}] if a[{i}] is None or {pick} else a[{i}])")
                results.append(f"(None if {a} is None else _Decimal({a}))" if decimal else a)
            elif call.kind == "PYTHON":
                ref = f"_udaf{i}"
                ns[ref] = PythonAggregate(call.function, call.text)
                slots.append(f"{ref}.initial")
                add = f"{ref}.add({a}{''.join(', ' + compiler.compile(x).text for x in call.arguments)})"
                merges.append(f"{ref}.merge(a[{i}], b[{i}])")
                results.append(f"{ref}.result({a})")
            elif call.kind == "AVG":
                slots += ["None", "0"]
                c = f"a[{i + 1}]"
                add_sum = f"({a} if ({v} := {text}) is None else {first} if {a} is None else {plus(a, v)})"
                add_count = f"{c} + ({v} is not None)"
                if call.condition is not None:
                    cond = compiler.predicate_text(call.condition)
                    add_sum = f"({add_sum} if {cond} else {a})"
                    add_count = f"({add_count} if {cond} else {c})"
                adds += [add_sum, add_count]
                merges += [merge_sum, f"a[{i + 1}] + b[{i + 1}]"]
                results.append(f"_avg({a}, {c}, {call.type.name!r})")
                continue
            else:
                raise SqlError(f"aggregate {call.text} is not supported")
            if call.condition is not None:
                add = f"({add} if {compiler.predicate_text(call.condition)} else {a})"
            adds.append(add)
        self.width = len(slots)
        self.initial_source = "(" + "".join(s + ", " for s in slots) + ")"
        self.add_source = "lambda r, a: (" + "".join(s + ", " for s in adds) + ")"
        self.merge_source = "lambda a, b: (" + "".join(s + ", " for s in merges) + ")"
        self.result_source = "lambda a: (" + "".join(s + ", " for s in results) + ")"
        build = compiler.build
        # accumulators are never changed in place (every add builds a new tuple, a distinct set a new dict), so
        # all groups can start from the one initial value
        self._initial = build(f"lambda: {self.initial_source}")()
        self.add = build(self.add_source)  # type: ignore[method-assign]
        self.merge = build(self.merge_source)  # type: ignore[method-assign]
        if results == [f"a[{i}]" for i in range(len(slots))]:
            self.get_result = _same  # type: ignore[method-assign]  # each slot is its result: no new tuple
        else:
            self.get_result = build(self.result_source)  # type: ignore[method-assign]

    def create_accumulator(self) -> Any:
        return self._initial


class PythonAggregate:
    """A Python aggregate function (PyFlink's AggregateFunction shape) as one slot of the generated accumulator.
    Its `accumulate` changes the accumulator it is given, while a value in keyed state (and in a snapshot being
    written) must never change in place: each add and merge works on a deep copy."""

    def __init__(self, function: Any, text: str) -> None:
        self.function = function
        self.text = text
        self.initial = function.create_accumulator()  # shared by every group: it is copied before any change

    def add(self, accumulator: Any, *args: Any) -> Any:
        accumulator = copy.deepcopy(accumulator)
        self.function.accumulate(accumulator, *args)
        return accumulator

    def merge(self, a: Any, b: Any) -> Any:
        merge = getattr(self.function, "merge", None)
        if merge is None:
            raise SqlError(f"{self.text}: the aggregate function has no merge(accumulator, accumulators), which "
                           "merging windows (SESSION) need")
        accumulator = copy.deepcopy(a)
        merge(accumulator, [b])
        return accumulator

    def result(self, accumulator: Any) -> Any:
        return self.function.get_value(accumulator)


def _same(accumulator: Any) -> Any:
    return accumulator


def _dsum(a: Any, b: Any) -> str:
    return str(Decimal(a) + Decimal(b))


def _avg(total: Any, count: int, kind: str) -> Any:
    if total is None or count == 0:
        return None
    if kind in T.INTEGRAL:
        q = abs(total) // count
        return q if total >= 0 else -q
    if kind == "DECIMAL":
        return Decimal(total) / count
    return total / count


_unused: Callable[..., Any] = exp.Expr
