"""The expression compiler: a SQL expression over a row's fields -> Python source, compiled ONCE into a function.

A row is a tuple; a field is `r[i]`. Each SQL node becomes a fragment of Python source, the fragments of an
expression list are joined into one `lambda r: (...)`, and that is compiled once per operator when the plan is
built (in every process, identically): nothing walks an AST per record. NULL is None; an operator whose operands
may be NULL guards them with assignment expressions so each is evaluated once:
`(None if (_1 := r[2]) is None else _1 * 2)`. Operands declared NOT NULL (and literals) are used bare.

Helpers (built-in functions, user functions, constants that are not literals) are bound by name into the one
namespace the generated code runs in, so a call costs a global lookup and the call.

After an aggregation, `substitutions` map an expression's SQL text (a group key, an aggregate call,
window_start) to the field of the aggregated row that holds it.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from sqlglot import exp

from runtime.sql import types as T
from runtime.sql.errors import SqlError
from runtime.sql.functions import BUILTINS, PythonFunction
from runtime.sql.types import SqlType

AGGREGATES = (exp.Count, exp.Sum, exp.Min, exp.Max, exp.Avg)


@dataclass(frozen=True)
class Field:
    """A column of a row: its name, type, and the table (or alias) it can be qualified with."""

    name: str
    type: SqlType
    table: str | None = None


@dataclass(frozen=True)
class Scope:
    """The fields of the rows an expression reads, in row order."""

    fields: tuple[Field, ...]

    def resolve(self, column: exp.Column) -> int:
        name, table = column.name, column.table or None
        hits = [i for i, f in enumerate(self.fields) if f.name == name and (table is None or f.table == table)]
        if not hits:  # Flink is case-sensitive; accept another case when it names one column only
            hits = [i for i, f in enumerate(self.fields) if f.name.lower() == name.lower()
                    and (table is None or (f.table or "").lower() == table.lower())]
        if len(hits) == 1:
            return hits[0]
        where = f"{table}.{name}" if table else name
        line, col = position(column)
        if not hits:
            known = ", ".join(f.name for f in self.fields)
            raise SqlError(f"Column '{where}' not found in any table; the columns here are: {known}", line=line,
                           column=col)
        raise SqlError(f"Column '{where}' is ambiguous: qualify it with its table", line=line, column=col)

    def names(self) -> list[str]:
        return [f.name for f in self.fields]


def position(node: exp.Expr) -> tuple[int | None, int | None]:
    """Where a parsed identifier (or the first one inside `node`) starts: (line, column), or (None, None)."""
    for sub in node.walk():
        meta = sub.meta if isinstance(sub, exp.Identifier) else {}
        if "line" in meta and "col" in meta:
            width = meta.get("end", 0) - meta.get("start", 0)
            return meta["line"], max(1, meta["col"] - width)
    return None, None


@dataclass
class Code:
    """A fragment of Python source computing a value, and its SQL type (nullable when it may be None)."""

    text: str
    type: SqlType
    constant: bool = False


def interval_ms(node: exp.Expr) -> int:
    """`INTERVAL '10' SECOND` (or MINUTES, HOUR...) -> milliseconds."""
    if not isinstance(node, exp.Interval):
        raise SqlError(f"expected an interval such as INTERVAL '10' SECOND, got {node.sql()}")
    unit = (node.unit.name if node.unit is not None else "SECOND").upper().rstrip("S")
    text = node.this.name if isinstance(node.this, exp.Literal) else node.this.sql()
    if node.unit is None and " " in text:  # INTERVAL '10 SECONDS'
        text, unit = text.split(" ", 1)
        unit = unit.upper().rstrip("S")
    scale = {"MILLISECOND": 1, "SECOND": 1000, "MINUTE": 60_000, "HOUR": 3_600_000, "DAY": 86_400_000}.get(unit)
    if scale is None:
        raise SqlError(f"interval unit {unit} is not supported (MILLISECOND, SECOND, MINUTE, HOUR, DAY)")
    try:
        return int(Decimal(text) * scale)
    except ArithmeticError as exc:
        raise SqlError(f"{node.sql()} is not an interval") from exc


class ExpressionCompiler:
    """Compiles expressions over one scope into Python functions of a row (module docstring)."""

    def __init__(self, scope: Scope, functions: Mapping[str, PythonFunction] | None = None, *,
                 substitutions: Mapping[str, int] | None = None,
                 grouping: tuple[Scope, Mapping[int, int]] | None = None,
                 field_source: list[str] | None = None, watermark: str | None = None) -> None:
        self.scope = scope
        # the source of the operator's current watermark (None when unknown), for CURRENT_WATERMARK; None: the
        # rows are read where the watermark is not at hand, and CURRENT_WATERMARK is refused
        self.watermark = watermark
        # where each field of the scope is read from, when the rows are not the scope's tuples themselves (a
        # window operator's (key, start, end, results) read as the aggregated row); default r[i]
        self.field_source = field_source
        self.functions = dict(functions or {})
        self.substitutions = dict(substitutions or {})
        # after a GROUP BY: a column of the rows before it is allowed when it is a group key (its field here)
        self.grouping = grouping
        self.namespace: dict[str, Any] = {"Decimal": Decimal}
        self._names = itertools.count()

    # -- results ---------------------------------------------------------------------------------------------

    def row_function(self, nodes: list[exp.Expr]) -> tuple[Callable[[Any], tuple[Any, ...]], list[SqlType], str]:
        """A function row -> tuple of the expressions' values, their types, and its source (for explain/tests)."""
        codes = [self.compile(n) for n in nodes]
        source = f"lambda {self._params}: (" + "".join(c.text + ", " for c in codes) + ")"
        return self._build(source), [c.type for c in codes], source

    def predicate(self, node: exp.Expr) -> tuple[Callable[[Any], Any], str]:
        """A function row -> truthy when the condition is TRUE (NULL and FALSE drop the row)."""
        code = self.compile(node)
        if code.type.name not in ("BOOLEAN", "NULL"):
            raise SqlError(f"the condition {node.sql()} is a {code.type}, not a BOOLEAN")
        source = f"lambda {self._params}: {code.text}"
        return self._build(source), source

    def value_function(self, node: exp.Expr) -> tuple[Callable[[Any], Any], SqlType, str]:
        code = self.compile(node)
        source = f"lambda {self._params}: {code.text}"
        return self._build(source), code.type, source

    def build(self, source: str) -> Any:
        """Compile generated source (a lambda) in this compiler's namespace: once, at planning."""
        return eval(compile(source, "<sql expression>", "eval"), self.namespace)  # noqa: S307 - our own codegen

    _build = build

    def predicate_text(self, node: exp.Expr) -> str:
        """The source of a condition, for code that embeds it (FILTER of an aggregate)."""
        code = self.compile(node)
        if code.type.name not in ("BOOLEAN", "NULL"):
            raise SqlError(f"the condition {node.sql()} is a {code.type}, not a BOOLEAN")
        return f"({code.text})"

    @property
    def _params(self) -> str:
        """The generated functions' parameters: the row, and the watermark when CURRENT_WATERMARK may read it."""
        return "r" if self.watermark is None else f"r, {self.watermark}"

    # -- helpers ---------------------------------------------------------------------------------------------

    def _bind(self, value: Any, hint: str = "_k") -> str:
        name = f"{hint}{next(self._names)}"
        self.namespace[name] = value
        return name

    def _var(self) -> str:
        return f"_v{next(self._names)}"

    def _guarded(self, operands: list[Code], build: Callable[[list[str]], str]) -> str:
        """`build(names)` with NULL in -> NULL out: nullable operands are bound once and checked."""
        names, checks = [], []
        for c in operands:
            if c.type.nullable and not c.constant:
                v = self._var()
                checks.append(f"({v} := {c.text}) is None")
                names.append(v)
            elif c.type.name == "NULL":
                return "None"
            else:
                names.append(f"({c.text})")
        body = build(names)
        return f"(None if {' or '.join(checks)} else {body})" if checks else f"({body})"

    # -- nodes -----------------------------------------------------------------------------------------------

    def compile(self, node: exp.Expr) -> Code:
        try:
            return self._compile(node)
        except SqlError as exc:
            raise exc.at(*position(node)) from None  # the innermost node with a place names it

    def _compile(self, node: exp.Expr) -> Code:
        key = node.sql()
        if key in self.substitutions:
            i = self.substitutions[key]
            return Code(self._field(i), self.scope.fields[i].type)
        method = getattr(self, f"_c_{type(node).__name__}", None)
        if method is None:
            if isinstance(node, AGGREGATES):
                raise SqlError(f"aggregate {node.sql()} is not allowed here (only in the SELECT list or HAVING of "
                               "a GROUP BY query)")
            raise SqlError(f"expression {node.sql()} ({type(node).__name__}) is not supported yet")
        return method(node)  # type: ignore[no-any-return]

    def _c_Column(self, node: exp.Column) -> Code:
        if isinstance(node.this, exp.Star):
            raise SqlError("* is only allowed alone in a SELECT list or in COUNT(*)")
        if self.grouping is not None:
            before, keys = self.grouping
            i = keys.get(before.resolve(node), -1)
            if i < 0:
                raise SqlError(f"Expression '{node.sql()}' is not being grouped")
            return Code(self._field(i), self.scope.fields[i].type)
        i = self.scope.resolve(node)
        return Code(self._field(i), self.scope.fields[i].type)

    def _field(self, i: int) -> str:
        return f"r[{i}]" if self.field_source is None else self.field_source[i]

    def _c_Paren(self, node: exp.Paren) -> Code:
        return self.compile(node.this)

    def _c_Alias(self, node: exp.Alias) -> Code:
        return self.compile(node.this)

    def _c_Literal(self, node: exp.Literal) -> Code:
        if node.is_string:
            return Code(repr(node.this), T.STRING.not_null(), True)
        text = node.this
        if any(ch in text for ch in ".eE"):
            if "e" in text.lower():
                return Code(repr(float(text)), T.DOUBLE.not_null(), True)
            return Code(self._bind(Decimal(text), "_d"), T.DECIMAL.not_null(), True)
        value = int(text)
        return Code(repr(value), (T.INT if -(2**31) <= value < 2**31 else T.BIGINT).not_null(), True)

    def _c_Boolean(self, node: exp.Boolean) -> Code:
        return Code(repr(bool(node.this)), T.BOOLEAN.not_null(), True)

    def _c_Null(self, node: exp.Null) -> Code:
        return Code("None", T.NULL, True)

    def _c_Neg(self, node: exp.Neg) -> Code:
        c = self.compile(node.this)
        return Code(self._guarded([c], lambda n: f"-{n[0]}"), c.type, c.constant)

    def _arith(self, node: exp.Binary, op: str) -> Code:
        a, b = self.compile(node.this), self.compile(node.expression)
        if a.type.name == "INTERVAL" or b.type.name == "INTERVAL":
            return self._time_arith(a, b, op, node)
        if not (a.type.numeric or a.type.name == "NULL") or not (b.type.numeric or b.type.name == "NULL"):
            raise SqlError(f"cannot apply '{op}' to {a.type} and {b.type} in {node.sql()}")
        t = T.common_type(a.type, b.type)
        mixed_decimal = {a.type.name, b.type.name} == {"DECIMAL"} | ({a.type.name, b.type.name} - {"DECIMAL"})
        if op == "/":
            if a.type.integral and b.type.integral:  # Java's integer division: truncates toward zero
                self.namespace["_idiv"] = _idiv
                text = self._guarded([a, b], lambda n: f"_idiv({n[0]}, {n[1]})")
            else:
                self.namespace["_fdiv"] = _fdiv
                text = self._guarded([a, b], lambda n: f"_fdiv({n[0]}, {n[1]})")
                if not a.type.integral and not b.type.integral and "DOUBLE" not in (a.type.name, b.type.name):
                    t = T.DECIMAL.or_null() if t.nullable else T.DECIMAL.not_null()
        elif op == "%":
            self.namespace["_jmod"] = _jmod
            text = self._guarded([a, b], lambda n: f"_jmod({n[0]}, {n[1]})")
        elif "DECIMAL" in (a.type.name, b.type.name) and ("DOUBLE" in (a.type.name, b.type.name)
                                                           or "FLOAT" in (a.type.name, b.type.name)):
            text = self._guarded([a, b], lambda n: f"float({n[0]}) {op} float({n[1]})")
            t = SqlType("DOUBLE", t.nullable)
        else:
            text = self._guarded([a, b], lambda n: f"{n[0]} {op} {n[1]}")
            if mixed_decimal and "DECIMAL" in (a.type.name, b.type.name):
                t = SqlType("DECIMAL", t.nullable)
        return Code(text, t, a.constant and b.constant)

    def _time_arith(self, a: Code, b: Code, op: str, node: exp.Expr) -> Code:
        if op not in "+-" or not (a.type.timestamp or b.type.timestamp):
            raise SqlError(f"cannot apply '{op}' to {a.type} and {b.type} in {node.sql()}")
        t = a.type if a.type.timestamp else b.type
        return Code(self._guarded([a, b], lambda n: f"{n[0]} {op} {n[1]}"), t)

    def _c_Add(self, node: exp.Add) -> Code:
        return self._arith(node, "+")

    def _c_Sub(self, node: exp.Sub) -> Code:
        return self._arith(node, "-")

    def _c_Mul(self, node: exp.Mul) -> Code:
        return self._arith(node, "*")

    def _c_Div(self, node: exp.Div) -> Code:
        return self._arith(node, "/")

    def _c_Mod(self, node: exp.Mod) -> Code:
        return self._arith(node, "%")

    def _c_Interval(self, node: exp.Interval) -> Code:
        return Code(repr(interval_ms(node)), T.INTERVAL.not_null(), True)

    def _compare(self, node: exp.Binary, op: str) -> Code:
        a, b = self.compile(node.this), self.compile(node.expression)
        a, b = self._comparable(a, b, node)
        return Code(self._guarded([a, b], lambda n: f"{n[0]} {op} {n[1]}"), SqlType("BOOLEAN", a.type.nullable
                                                                                  or b.type.nullable))

    def _comparable(self, a: Code, b: Code, node: exp.Expr) -> tuple[Code, Code]:
        """A timestamp compared with a string literal: the literal read as a timestamp, as Flink casts it."""
        for x, y in ((a, b), (b, a)):
            if x.type.timestamp and y.type.name == "STRING" and y.constant:
                value = T.parse_timestamp(eval(y.text))  # noqa: S307 - a literal we generated
                y.text, y.type = repr(value), x.type.not_null()
        if a.type.name != "NULL" and b.type.name != "NULL":
            kinds = {("n" if t.numeric else t.name) for t in (a.type, b.type)}
            if len(kinds) > 1 and not kinds <= {"TIMESTAMP", "TIMESTAMP_LTZ"}:
                raise SqlError(f"cannot compare {a.type} with {b.type} in {node.sql()}")
        return a, b

    def _c_EQ(self, node: exp.EQ) -> Code:
        return self._compare(node, "==")

    def _c_NEQ(self, node: exp.NEQ) -> Code:
        return self._compare(node, "!=")

    def _c_GT(self, node: exp.GT) -> Code:
        return self._compare(node, ">")

    def _c_GTE(self, node: exp.GTE) -> Code:
        return self._compare(node, ">=")

    def _c_LT(self, node: exp.LT) -> Code:
        return self._compare(node, "<")

    def _c_LTE(self, node: exp.LTE) -> Code:
        return self._compare(node, "<=")

    def _logic(self, node: exp.Binary, both: str) -> Code:
        a, b = self.compile(node.this), self.compile(node.expression)
        for c in (a, b):
            if c.type.name not in ("BOOLEAN", "NULL"):
                raise SqlError(f"{both.upper()} needs BOOLEAN operands, got {c.type} in {node.sql()}")
        nullable = a.type.nullable or b.type.nullable
        if not nullable:
            return Code(f"({a.text} {both} {b.text})", T.BOOLEAN.not_null())
        self.namespace["_and3"], self.namespace["_or3"] = _and3, _or3
        # three-valued logic; the right side is a lambda so it is evaluated only when it matters
        return Code(f"_{both}3({a.text}, lambda: {b.text})", T.BOOLEAN)

    def _c_And(self, node: exp.And) -> Code:
        return self._logic(node, "and")

    def _c_Or(self, node: exp.Or) -> Code:
        return self._logic(node, "or")

    def _c_Not(self, node: exp.Not) -> Code:
        c = self.compile(node.this)
        return Code(self._guarded([c], lambda n: f"not {n[0]}"), c.type)

    def _c_Is(self, node: exp.Is) -> Code:
        c = self.compile(node.this)
        if not isinstance(node.expression, exp.Null):
            raise SqlError(f"IS {node.expression.sql()} is not supported (IS NULL, IS NOT NULL)")
        return Code(f"({c.text} is None)", T.BOOLEAN.not_null())

    def _c_Between(self, node: exp.Between) -> Code:
        v, lo, hi = self.compile(node.this), self.compile(node.args["low"]), self.compile(node.args["high"])
        self._comparable(v, lo, node)
        self._comparable(v, hi, node)
        nullable = v.type.nullable or lo.type.nullable or hi.type.nullable
        return Code(self._guarded([v, lo, hi], lambda n: f"{n[1]} <= {n[0]} <= {n[2]}"), SqlType("BOOLEAN", nullable))

    def _c_In(self, node: exp.In) -> Code:
        v = self.compile(node.this)
        items = [self.compile(e) for e in node.expressions]
        if not items or node.args.get("query") is not None:
            raise SqlError(f"IN with a subquery is not supported yet: {node.sql()}")
        if all(i.constant for i in items):
            values = frozenset(eval(i.text, self.namespace) for i in items)  # noqa: S307 - our literals
            name = self._bind(values, "_set")
            return Code(self._guarded([v], lambda n: f"{n[0]} in {name}"), SqlType("BOOLEAN", v.type.nullable))
        return Code(self._guarded([v], lambda n: f"{n[0]} in ({', '.join(i.text for i in items)},)"),
                    SqlType("BOOLEAN", v.type.nullable))

    def _c_Like(self, node: exp.Like) -> Code:
        import re

        c, pattern = self.compile(node.this), node.expression
        if not (isinstance(pattern, exp.Literal) and pattern.is_string):
            raise SqlError(f"LIKE needs a string literal pattern: {node.sql()}")
        regex = "".join(".*" if ch == "%" else "." if ch == "_" else re.escape(ch) for ch in pattern.this)
        name = self._bind(re.compile(regex, re.S).fullmatch, "_like")
        return Code(self._guarded([c], lambda n: f"{name}({n[0]}) is not None"), SqlType("BOOLEAN", c.type.nullable))

    def _c_DPipe(self, node: exp.DPipe) -> Code:
        a, b = self.compile(node.this), self.compile(node.expression)
        return Code(self._guarded([a, b], lambda n: f"str({n[0]}) + str({n[1]})"),
                    SqlType("STRING", a.type.nullable or b.type.nullable))

    def _c_Case(self, node: exp.Case) -> Code:
        subject = node.this
        default = self.compile(node.args["default"]) if node.args.get("default") else Code("None", T.NULL, True)
        text, t = default.text, default.type
        for branch in reversed(node.args.get("ifs") or []):
            cond = branch.this if subject is None else exp.EQ(this=subject, expression=branch.this)
            c, v = self.compile(cond), self.compile(branch.args["true"])
            t = T.common_type(v.type, t)
            text = f"({v.text} if {c.text} else {text})"
        return Code(text, t)

    def _c_If(self, node: exp.If) -> Code:
        c, v = self.compile(node.this), self.compile(node.args["true"])
        f = self.compile(node.args["false"]) if node.args.get("false") else Code("None", T.NULL, True)
        return Code(f"({v.text} if {c.text} else {f.text})", T.common_type(v.type, f.type))

    def _c_Cast(self, node: exp.Cast) -> Code:
        c = self.compile(node.this)
        target = T.from_datatype(node.to)
        if c.type.timestamp and target.name == "STRING":
            self.namespace["_fmt_ts"] = T.format_timestamp
            return Code(self._guarded([c], lambda n: f"_fmt_ts({n[0]})"), target)
        if c.type.name == "STRING" and target.timestamp:
            self.namespace["_parse_ts"] = T.parse_timestamp
            return Code(self._guarded([c], lambda n: f"_parse_ts({n[0]})"), target)
        if target.name == "STRING" and c.type.name == "BOOLEAN":
            return Code(self._guarded([c], lambda n: f"('TRUE' if {n[0]} else 'FALSE')"), target)
        if target.name == "STRING" and c.type.name == "DECIMAL":
            return Code(self._guarded([c], lambda n: f"format({n[0]}, 'f')"), target)
        convert = {"BIGINT": "int", "INT": "int", "SMALLINT": "int", "TINYINT": "int", "DOUBLE": "float",
                   "FLOAT": "float", "STRING": "str", "BOOLEAN": "bool", "DECIMAL": "_to_decimal",
                   "TIMESTAMP": "int", "TIMESTAMP_LTZ": "int"}.get(target.name)
        if convert is None:
            raise SqlError(f"CAST to {target} is not supported yet")
        if convert == "_to_decimal":
            self.namespace["_to_decimal"] = lambda v: Decimal(str(v))
        if target.integral and c.type.name in ("DOUBLE", "FLOAT", "DECIMAL"):
            convert = "int"  # truncates toward zero, as Java's cast
        if convert == "bool" and c.type.name == "STRING":
            return Code(self._guarded([c], lambda n: f"({n[0]}.strip().lower() == 'true')"), target)
        return Code(self._guarded([c], lambda n: f"{convert}({n[0]})"), SqlType(target.name, c.type.nullable,
                                                                                  target.precision, target.scale))

    def _c_TryCast(self, node: exp.TryCast) -> Code:
        return self._c_Cast(node)  # type: ignore[arg-type]

    def _c_CurrentTimestamp(self, node: exp.Expr) -> Code:
        raise SqlError("CURRENT_TIMESTAMP is not deterministic across a replay; not supported in Sluice SQL")

    def _c_Extract(self, node: exp.Extract) -> Code:
        from runtime.sql.functions import _extract_field

        unit = node.this.name.upper()
        c = self.compile(node.expression)
        name = self._bind(_extract_field(unit), "_ext")
        return Code(self._guarded([c], lambda n: f"{name}({n[0]})"), SqlType("BIGINT", c.type.nullable))

    def _call(self, name: str, args: list[exp.Expr], node: exp.Expr) -> Code:
        upper = name.upper()
        if upper in ("TIMESTAMPADD",) and args and isinstance(args[0], exp.Column | exp.Var):
            unit = args[0].name.upper()
            args = [exp.Literal.string(unit), *args[1:]]
        if upper == "CURRENT_WATERMARK":
            return self._current_watermark(args, node)
        codes = [self.compile(a) for a in args]
        if upper in self.functions or name in self.functions:
            udf = self.functions.get(name) or self.functions[upper]
            if udf.aggregate() is not None:
                raise SqlError(f"aggregate {node.sql()} is not allowed here (only in the SELECT list or HAVING of "
                               "a GROUP BY query)")
            fn = udf.load()
            ref = self._bind(fn, "_udf")
            return Code(f"{ref}({', '.join(c.text for c in codes)})", udf.result_type(fn, [c.type for c in codes]))
        builtin = BUILTINS.get(upper)
        if builtin is None:
            raise SqlError(f"No match found for function signature {name}(...): not a built-in Sluice SQL has and "
                           "not declared with CREATE FUNCTION")
        lo, hi = builtin.arity
        if not lo <= len(codes) <= hi:
            raise SqlError(f"{upper} takes {lo if lo == hi else f'{lo} to {hi}'} arguments, got {len(codes)}: "
                           f"{node.sql()}")
        ref = self._bind(builtin.fn, f"_{upper.lower()}")
        t = builtin.result([c.type for c in codes])
        if builtin.null_safe:
            return Code(f"{ref}({', '.join(c.text for c in codes)})", t)
        nullable = builtin.may_be_null or any(c.type.nullable for c in codes)
        t = t.or_null() if nullable else t.not_null()
        return Code(self._guarded(codes, lambda n: f"{ref}({', '.join(n)})"), t)

    def _current_watermark(self, args: list[exp.Expr], node: exp.Expr) -> Code:
        """CURRENT_WATERMARK(rowtime): the watermark of the operator evaluating it (NULL before the first one),
        as Flink gives it; its argument must be the rowtime attribute of the rows."""
        if len(args) != 1 or not isinstance(args[0], exp.Column) or not self.scope.fields[
                self.scope.resolve(args[0])].type.timestamp:
            raise SqlError(f"{node.sql()}: CURRENT_WATERMARK takes the rowtime column of the rows")
        if self.watermark is None:
            raise SqlError(f"{node.sql()}: CURRENT_WATERMARK is supported in a SELECT list or WHERE over a table's "
                           "or a window's rows only")
        return Code(self.watermark, T.TIMESTAMP.or_null())

    def _c_Anonymous(self, node: exp.Anonymous) -> Code:
        return self._call(node.name, list(node.expressions), node)

    def _c_Func(self, node: exp.Func) -> Code:
        args = [a for a in node.args.values() if isinstance(a, exp.Expr)]
        return self._call(node.sql_name(), args, node)

    def __getattr__(self, name: str) -> Any:
        # every other function node sqlglot knows by class (Upper, Lower, Coalesce, Round, ...): a call by name
        if name.startswith("_c_"):
            cls = getattr(exp, name[3:], None)
            if isinstance(cls, type) and issubclass(cls, exp.Func) and not issubclass(cls, AGGREGATES):
                return self._c_known_function
        raise AttributeError(name)

    def _c_known_function(self, node: exp.Func) -> Code:
        args: list[exp.Expr] = []
        for key in node.arg_types:
            value = node.args.get(key)
            if isinstance(value, list):
                args.extend(value)
            elif isinstance(value, exp.Expr):
                args.append(value)
        name = {"Substring": "SUBSTRING", "Length": "CHAR_LENGTH", "Trim": "TRIM", "Pow": "POWER",
                "Coalesce": "COALESCE", "Ceil": "CEIL", "Floor": "FLOOR", "Round": "ROUND", "Abs": "ABS",
                "Upper": "UPPER", "Lower": "LOWER", "Concat": "CONCAT", "ConcatWs": "CONCAT_WS",
                "Initcap": "INITCAP", "Ln": "LN", "Exp": "EXP", "Sqrt": "SQRT", "Log": "LOG10",
                "TimeToStr": "DATE_FORMAT", "StrToTime": "TO_TIMESTAMP", "DateFormat": "DATE_FORMAT",
                "StrPosition": "POSITION"}.get(type(node).__name__, node.sql_name())
        return self._call(name, args, node)


def _idiv(a: int, b: int) -> int:
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def _fdiv(a: Any, b: Any) -> Any:
    if (isinstance(a, Decimal) or isinstance(b, Decimal)) and not isinstance(a, float) and not isinstance(b, float):
        return Decimal(a) / Decimal(b)
    return a / b


def _jmod(a: Any, b: Any) -> Any:
    if isinstance(a, int) and isinstance(b, int):
        r = abs(a) % abs(b)
        return r if a >= 0 else -r
    import math

    return math.fmod(a, b)


def _and3(a: Any, b: Callable[[], Any]) -> Any:
    if a is False:
        return False
    other = b()
    if other is False:
        return False
    return None if a is None or other is None else True


def _or3(a: Any, b: Callable[[], Any]) -> Any:
    if a is True:
        return True
    other = b()
    if other is True:
        return True
    return None if a is None or other is None else False

