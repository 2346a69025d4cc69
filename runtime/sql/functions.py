"""Built-in scalar functions and the Python functions a script declares (CREATE FUNCTION ... LANGUAGE PYTHON).

A built-in is a plain Python function over already-evaluated arguments, bound once into the namespace of the
code the expression compiler generates (runtime/sql/expressions.py): the generated code calls it directly, with
no lookup per record. NULL in, NULL out, as in Flink, unless the function says otherwise (COALESCE, CONCAT_WS).
"""

from __future__ import annotations

import datetime as dt
import importlib
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

from runtime.sql import types as T
from runtime.sql.errors import SqlError
from runtime.sql.types import SqlType


@dataclass(frozen=True)
class Builtin:
    """`fn(*args)`; `result` gives the result type from the argument types; `null_safe`: fn sees NULLs itself
    (otherwise the compiler returns NULL when an argument is NULL without calling it)."""

    fn: Callable[..., Any]
    result: Callable[[list[SqlType]], SqlType]
    null_safe: bool = False
    arity: tuple[int, int] = (1, 1)
    may_be_null: bool = False  # NULL even from non-NULL arguments (no match, no such part)


def _same(types: list[SqlType]) -> SqlType:
    return types[0]


def _const(t: SqlType) -> Callable[[list[SqlType]], SqlType]:
    return lambda types: t


def _round(value: Any, digits: int = 0) -> Any:
    if isinstance(value, int):
        return value if digits >= 0 else int(Decimal(value).quantize(Decimal(10) ** -digits, ROUND_HALF_UP))
    quantum = Decimal(1).scaleb(-digits)
    rounded = Decimal(str(value)).quantize(quantum, rounding=ROUND_HALF_UP)
    return rounded if isinstance(value, Decimal) else float(rounded)


def _substring(text: str, start: int, length: int | None = None) -> str:
    begin = start - 1 if start > 0 else (len(text) + start if start < 0 else 0)
    return text[begin:] if length is None else text[begin:begin + length]


_JAVA_PATTERN = re.compile(r"yyyy|yy|MM|dd|HH|hh|mm|ss|SSS|a|'[^']*'")
_PATTERN_PARTS = {"yyyy": "%Y", "yy": "%y", "MM": "%m", "dd": "%d", "HH": "%H", "hh": "%I", "mm": "%M", "ss": "%S",
                  "a": "%p"}


def _strftime_pattern(java: str) -> str:
    """Flink's (Java's) date pattern -> strftime; SSS (milliseconds) is filled in by the caller."""
    def part(m: re.Match[str]) -> str:
        token = m.group(0)
        if token.startswith("'"):
            return token[1:-1].replace("%", "%%")
        return "\x01" if token == "SSS" else _PATTERN_PARTS[token]
    return _JAVA_PATTERN.sub(part, java)


def _date_format(ms: Any, pattern: str = "yyyy-MM-dd HH:mm:ss") -> str:
    if isinstance(ms, str):
        ms = T.parse_timestamp(ms)
    moment = dt.datetime(1970, 1, 1) + dt.timedelta(milliseconds=ms)
    return moment.strftime(_strftime_pattern(pattern)).replace("\x01", f"{ms % 1000:03d}")


def _to_timestamp(text: str, pattern: str | None = None) -> int:
    if pattern is None:
        return T.parse_timestamp(text)
    fmt = _strftime_pattern(pattern).replace("\x01", "%f")
    parsed = dt.datetime.strptime(text, fmt)
    return T.parse_timestamp(parsed.isoformat())


_UNIT_MS = {"MILLISECOND": 1, "SECOND": 1000, "MINUTE": 60_000, "HOUR": 3_600_000, "DAY": 86_400_000,
            "WEEK": 7 * 86_400_000}


def _timestampadd(unit: str, amount: int, ms: int) -> int:
    return ms + amount * _UNIT_MS[unit.upper()]


def _extract_field(unit: str) -> Callable[[int], int]:
    attr = {"YEAR": "year", "MONTH": "month", "DAY": "day", "HOUR": "hour", "MINUTE": "minute",
            "SECOND": "second"}[unit]
    return lambda ms: getattr(dt.datetime(1970, 1, 1) + dt.timedelta(milliseconds=ms), attr)


def _coalesce(*values: Any) -> Any:
    for v in values:
        if v is not None:
            return v
    return None


def _concat_ws(sep: Any, *values: Any) -> Any:
    if sep is None:
        return None
    return sep.join(str(v) for v in values if v is not None)


def _split_index(text: str, sep: str, index: int) -> Any:
    parts = text.split(sep)
    return parts[index] if 0 <= index < len(parts) else None


_PATTERNS: dict[str, re.Pattern[str]] = {}


def _regexp_extract(text: str, pattern: str, index: int = 1) -> Any:
    """Flink's REGEXP_EXTRACT: group `index` of the first match (Java's Matcher.find), NULL without one."""
    compiled = _PATTERNS.get(pattern)
    if compiled is None:
        compiled = _PATTERNS[pattern] = re.compile(pattern)
    match = compiled.search(text)
    return None if match is None else match.group(index)


def _proctime() -> int:
    """PROCTIME(): the wall clock in ms, a processing-time attribute (what a lookup join's FOR SYSTEM_TIME AS OF
    names; its value differs on a replay, as in Flink)."""
    import time
    return time.time_ns() // 1_000_000


BUILTINS: dict[str, Builtin] = {
    "PROCTIME": Builtin(_proctime, _const(T.TIMESTAMP), arity=(0, 0)),
    "UPPER": Builtin(str.upper, _const(T.STRING)),
    "LOWER": Builtin(str.lower, _const(T.STRING)),
    "CHAR_LENGTH": Builtin(len, _const(T.INT)),
    "CHARACTER_LENGTH": Builtin(len, _const(T.INT)),
    "TRIM": Builtin(str.strip, _const(T.STRING)),
    "LTRIM": Builtin(str.lstrip, _const(T.STRING)),
    "RTRIM": Builtin(str.rstrip, _const(T.STRING)),
    "SUBSTRING": Builtin(_substring, _const(T.STRING), arity=(2, 3)),
    "SUBSTR": Builtin(_substring, _const(T.STRING), arity=(2, 3)),
    "REPLACE": Builtin(lambda s, a, b: s.replace(a, b), _const(T.STRING), arity=(3, 3)),
    "CONCAT": Builtin(lambda *a: "".join(str(x) for x in a), _const(T.STRING), arity=(1, 255)),
    "CONCAT_WS": Builtin(_concat_ws, _const(T.STRING), null_safe=True, arity=(2, 255)),
    "INITCAP": Builtin(lambda s: " ".join(w.capitalize() for w in s.split(" ")), _const(T.STRING)),
    "SPLIT_INDEX": Builtin(_split_index, _const(T.STRING), arity=(3, 3), may_be_null=True),
    "REGEXP_EXTRACT": Builtin(_regexp_extract, _const(T.STRING), arity=(2, 3), may_be_null=True),
    "REGEXP_REPLACE": Builtin(lambda s, p, r: re.sub(p, r.replace("$", "\\"), s), _const(T.STRING), arity=(3, 3)),
    "ABS": Builtin(abs, _same),
    "MOD": Builtin(lambda a, b: math.fmod(a, b) if isinstance(a, float) or isinstance(b, float)
                   else (abs(a) % abs(b)) * (1 if a >= 0 else -1), _same, arity=(2, 2)),
    "ROUND": Builtin(_round, _same, arity=(1, 2)),
    "FLOOR": Builtin(math.floor, _same),
    "CEIL": Builtin(math.ceil, _same),
    "CEILING": Builtin(math.ceil, _same),
    "SQRT": Builtin(math.sqrt, _const(T.DOUBLE)),
    "POWER": Builtin(lambda a, b: float(a) ** float(b), _const(T.DOUBLE), arity=(2, 2)),
    "LN": Builtin(math.log, _const(T.DOUBLE)),
    "LOG10": Builtin(math.log10, _const(T.DOUBLE)),
    "EXP": Builtin(math.exp, _const(T.DOUBLE)),
    "COALESCE": Builtin(_coalesce, lambda ts: _coalesce_type(ts), null_safe=True, arity=(1, 255)),
    "IFNULL": Builtin(_coalesce, lambda ts: _coalesce_type(ts), null_safe=True, arity=(2, 2)),
    "DATE_FORMAT": Builtin(_date_format, _const(T.STRING), arity=(1, 2)),
    "TO_TIMESTAMP": Builtin(_to_timestamp, _const(T.TIMESTAMP), arity=(1, 2)),
    "TIMESTAMPADD": Builtin(_timestampadd, _const(T.TIMESTAMP), arity=(3, 3)),
    "HASH_CODE": Builtin(lambda v: hash(v) & 0x7FFFFFFF, _const(T.INT)),
}


def _coalesce_type(types: list[SqlType]) -> SqlType:
    out = types[0]
    for t in types[1:]:
        out = T.common_type(out, t)
    return out.not_null() if any(not t.nullable for t in types) else out.or_null()


@dataclass(frozen=True)
class PythonFunction:
    """A scalar function of the script: `CREATE [TEMPORARY] FUNCTION name AS 'module.attr' LANGUAGE PYTHON`.
    Its result type is its `result_type` attribute (a Flink type name) when it has one, else STRING... unless
    the module says otherwise, BIGINT for ints is not guessable: so the default is the type of its first
    argument, which is what most scalar functions of a column return."""

    name: str
    target: str

    def _target(self) -> Any:
        module_name, _, attr = self.target.rpartition(".")
        if not module_name:
            raise SqlError(f"function {self.name}: {self.target!r} is not of the form 'module.function'")
        try:
            module = importlib.import_module(module_name)
        except Exception as exc:
            raise SqlError(f"function {self.name}: cannot import {module_name!r}: {type(exc).__name__}: "
                           f"{exc}") from exc
        fn = getattr(module, attr, None)
        if fn is None:
            raise SqlError(f"function {self.name}: module {module_name!r} has no {attr!r}")
        return fn

    def aggregate(self) -> Any | None:
        """The function as an aggregate, when it is one: an instance of (or the) class with PyFlink's
        AggregateFunction methods `create_accumulator()`, `accumulate(acc, *args)` and `get_value(acc)`
        (`merge(acc, accs)` too, for session windows); None for a scalar function."""
        target = self._target()
        if not all(hasattr(target, m) for m in ("create_accumulator", "accumulate", "get_value")):
            return None
        return target() if isinstance(target, type) else target

    def load(self) -> Callable[..., Any]:
        fn = self._target()
        if isinstance(fn, type):  # a ScalarFunction-like class: an instance with `eval`
            instance = fn()
            fn = getattr(instance, "eval", None) or instance
        if not callable(fn):
            raise SqlError(f"function {self.name}: {self.target!r} is not callable")
        return fn  # type: ignore[no-any-return]

    @staticmethod
    def declared(fn: Any, attribute: str) -> Any:
        """What the function (or, for a bound `eval`, its object) declares as `attribute`; None when nothing."""
        return getattr(fn, attribute, None) or getattr(getattr(fn, "__self__", None), attribute, None)

    def result_type(self, fn: Any, args: list[SqlType]) -> SqlType:
        declared = self.declared(fn, "result_type")
        if isinstance(declared, str):
            return SqlType(declared.upper())
        return args[0].or_null() if args else T.STRING
