"""SQL types as Sluice keeps their values in rows (tuples), and the conversions at the edges.

Inside a plan a TIMESTAMP is an int of epoch milliseconds (UTC; Flink's TIMESTAMP(3) has no zone and Sluice reads
it as UTC), so window assignment is integer arithmetic and state stays msgpack-friendly. DECIMAL values are
Python Decimals (exact, as Flink's), BIGINT/INT ints, DOUBLE floats, STRING str, BOOLEAN bool, BYTES bytes, a MAP
a dict (Kafka's headers, MAP<STRING, BYTES>); NULL is None.
Connectors convert at the edges: `reader(type)` turns a value read from a file into the row's form, `writer`
turns it back into what the format writes (a timestamp as Flink's JSON format writes it: 'yyyy-MM-dd HH:mm:ss'
with the fraction's trailing zeros dropped).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from sqlglot import exp

from runtime.sql.errors import SqlError

INTEGRAL = ("TINYINT", "SMALLINT", "INT", "BIGINT")
FRACTIONAL = ("FLOAT", "DOUBLE", "DECIMAL")
NUMERIC = INTEGRAL + FRACTIONAL
TIMESTAMPS = ("TIMESTAMP", "TIMESTAMP_LTZ")


@dataclass(frozen=True)
class SqlType:
    """A column's type: `name` as Flink spells it, `nullable` unless NOT NULL."""

    name: str
    nullable: bool = True
    precision: int | None = None
    scale: int | None = None

    def __str__(self) -> str:
        text = self.name
        if self.precision is not None:
            text += f"({self.precision}" + (f", {self.scale})" if self.scale is not None else ")")
        return text + ("" if self.nullable else " NOT NULL")

    @property
    def integral(self) -> bool:
        return self.name in INTEGRAL

    @property
    def numeric(self) -> bool:
        return self.name in NUMERIC

    @property
    def timestamp(self) -> bool:
        return self.name in TIMESTAMPS

    def not_null(self) -> SqlType:
        return SqlType(self.name, False, self.precision, self.scale)

    def or_null(self) -> SqlType:
        return SqlType(self.name, True, self.precision, self.scale)


BIGINT = SqlType("BIGINT")
INT = SqlType("INT")
DOUBLE = SqlType("DOUBLE")
STRING = SqlType("STRING")
BOOLEAN = SqlType("BOOLEAN")
TIMESTAMP = SqlType("TIMESTAMP", precision=3)
DECIMAL = SqlType("DECIMAL")
NULL = SqlType("NULL")
INTERVAL = SqlType("INTERVAL")

_BY_DTYPE = {
    "TINYINT": "TINYINT", "SMALLINT": "SMALLINT", "INT": "INT", "BIGINT": "BIGINT", "FLOAT": "FLOAT",
    "DOUBLE": "DOUBLE", "DECIMAL": "DECIMAL", "TEXT": "STRING", "VARCHAR": "STRING", "CHAR": "STRING",
    "BOOLEAN": "BOOLEAN", "TIMESTAMP": "TIMESTAMP", "TIMESTAMPLTZ": "TIMESTAMP_LTZ", "DATETIME": "TIMESTAMP",
    "DATE": "DATE", "BIGDECIMAL": "DECIMAL", "BYTES": "BYTES", "VARBINARY": "BYTES", "BINARY": "BYTES",
    "MAP": "MAP",
}


def from_datatype(node: exp.DataType, *, nullable: bool = True) -> SqlType:
    """A parsed type (`BIGINT`, `TIMESTAMP(3)`, `DECIMAL(10, 2)`, `STRING`) as a SqlType."""
    dtype = node.this.name if hasattr(node.this, "name") else str(node.this)
    if dtype.upper() == "USERDEFINED":  # a type name sqlglot does not know, as BYTES
        dtype = str(node.args.get("kind") or "")
    name = _BY_DTYPE.get(dtype.upper())
    if name is None:
        supported = ", ".join(sorted(set(_BY_DTYPE.values())))
        raise SqlError(f"type {node.sql()} is not supported yet (supported: {supported})")
    params = [int(p.this.this) for p in node.expressions if isinstance(p, exp.DataTypeParam)
              and isinstance(p.this, exp.Literal)]
    precision = params[0] if params else (3 if name in TIMESTAMPS else None)
    scale = params[1] if len(params) > 1 else None
    return SqlType(name, nullable, precision, scale)


def common_type(a: SqlType, b: SqlType) -> SqlType:
    """The type of a CASE or COALESCE over both, or of arithmetic between them."""
    if a.name == "NULL":
        return b.or_null()
    if b.name == "NULL":
        return a.or_null()
    nullable = a.nullable or b.nullable
    if a.name == b.name:
        return SqlType(a.name, nullable, a.precision, a.scale)
    order = ("TINYINT", "SMALLINT", "INT", "BIGINT", "DECIMAL", "FLOAT", "DOUBLE")
    if a.name in order and b.name in order:
        return SqlType(max(a.name, b.name, key=order.index), nullable)
    return SqlType(a.name, nullable)


# -- timestamps --------------------------------------------------------------------------------------------

_EPOCH = dt.datetime(1970, 1, 1)


def parse_timestamp(text: str) -> int:
    """'yyyy-MM-dd HH:mm:ss[.fff]' or ISO 8601 ('T', optional 'Z') -> epoch milliseconds (UTC)."""
    value = text.strip().replace("T", " ").rstrip("Z")
    try:
        parsed = dt.datetime.fromisoformat(value)
    except ValueError as exc:
        raise ValueError(f"{text!r} is not a timestamp ('yyyy-MM-dd HH:mm:ss[.SSS]')") from exc
    if parsed.tzinfo is not None:
        parsed = parsed.astimezone(dt.UTC).replace(tzinfo=None)
    delta = parsed - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1000 + delta.microseconds // 1000


def format_timestamp(ms: int) -> str:
    """Epoch milliseconds -> Flink's SQL form 'yyyy-MM-dd HH:mm:ss[.f]' (trailing zeros of the fraction dropped)."""
    moment = _EPOCH + dt.timedelta(milliseconds=ms)
    text = moment.strftime("%Y-%m-%d %H:%M:%S")
    millis = ms % 1000
    if millis:
        text += "." + f"{millis:03d}".rstrip("0")
    return text


# -- the edges: values read from a format, values written to one -------------------------------------------


def reader(t: SqlType) -> Callable[[Any], Any]:
    """A function turning a value as a format holds it (JSON, CSV text, Parquet) into the row's form."""
    name = t.name
    # each first returns a value already of the row's form as it is (`type(v) is int`: not a bool, which int()
    # turns into 0 or 1): most values of a well-typed source are, and the checks after it cost per value
    if name in INTEGRAL:
        return lambda v: v if type(v) is int else None if v is None or v == "" else int(v)
    if name in ("FLOAT", "DOUBLE"):
        return lambda v: v if type(v) is float else None if v is None or v == "" else float(v)
    if name == "DECIMAL":
        return lambda v: None if v is None or v == "" else Decimal(str(v))
    if name == "BOOLEAN":
        return lambda v: None if v is None or v == "" else (v if isinstance(v, bool) else str(v).lower() == "true")
    if name in ("MAP", "BYTES"):  # a MAP's value is a dict, BYTES bytes (metadata: Kafka's headers)
        return lambda v: v
    if name in TIMESTAMPS:
        def read_timestamp(v: Any) -> Any:
            if type(v) is int:  # epoch milliseconds
                return v
            if v is None or v == "":
                return None
            if isinstance(v, int | float):
                return int(v)
            if isinstance(v, dt.datetime):
                return parse_timestamp(v.isoformat())
            return parse_timestamp(str(v))
        return read_timestamp
    return lambda v: v if type(v) is str or v is None or isinstance(v, str) else str(v)


def writer(t: SqlType) -> Callable[[Any], Any] | None:
    """A function turning a row's value into what JSON and CSV write, or None where it is written as it is."""
    if t.name in TIMESTAMPS:
        return lambda v: None if v is None else format_timestamp(v)
    if t.name == "DECIMAL":
        return lambda v: None if v is None else float(v)
    if t.name in ("BYTES", "MAP"):  # as Flink's JSON format: bytes base64-encoded (a MAP's bytes values too)
        return _bytes_as_text
    return None


def _bytes_as_text(v: Any) -> Any:
    import base64

    if isinstance(v, bytes | bytearray):
        return base64.b64encode(v).decode("ascii")
    if isinstance(v, dict):
        return {k: _bytes_as_text(x) for k, x in v.items()}
    return v
