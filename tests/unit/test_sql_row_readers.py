"""A format's values into a row's (runtime/sql/types.py `reader`, runtime/sql/connectors.py `_json_object`): the
fast paths and the generated row builder give exactly what the plain conversions give, for every kind of value a
JSON document holds."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import runtime.api  # noqa: F401 - the connectors module imports the API's sources
from runtime.sql.connectors import _json_object
from runtime.sql.types import SqlType, parse_timestamp, reader


def reference(t: SqlType, v: Any) -> Any:
    """The conversions as they were before the fast paths (their specification)."""
    name = t.name
    if name in ("TINYINT", "SMALLINT", "INT", "INTEGER", "BIGINT"):
        return None if v is None or v == "" else int(v)
    if name in ("FLOAT", "DOUBLE"):
        return None if v is None or v == "" else float(v)
    if name in ("TIMESTAMP", "TIMESTAMP_LTZ"):
        if v is None or v == "":
            return None
        if isinstance(v, int | float):
            return int(v)
        if isinstance(v, dt.datetime):
            return parse_timestamp(v.isoformat())
        return parse_timestamp(str(v))
    return v if v is None or isinstance(v, str) else str(v)


def outcome(fn: Any, v: Any) -> tuple[str, Any]:
    try:
        out = fn(v)
    except (ValueError, TypeError, OverflowError) as exc:
        return "error", type(exc)
    return "value", (type(out), out)


TYPES = [SqlType("BIGINT"), SqlType("INT"), SqlType("DOUBLE"), SqlType("FLOAT"), SqlType("TIMESTAMP", precision=3),
         SqlType("TIMESTAMP_LTZ", precision=3), SqlType("STRING")]
JSON_VALUES = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=8),
                        st.sampled_from(["", "12", "1.5", "true", "2024-01-02 03:04:05.123", "x"]))


@pytest.mark.parametrize("t", TYPES, ids=str)
@given(v=JSON_VALUES)
def test_a_reader_converts_as_the_plain_conversion_does(t: SqlType, v: Any) -> None:
    assert outcome(reader(t), v) == outcome(lambda x: reference(t, x), v)


def test_a_bool_is_not_taken_for_an_integer() -> None:
    assert reader(SqlType("BIGINT"))(True) == 1 and type(reader(SqlType("BIGINT"))(True)) is int
    assert reader(SqlType("TIMESTAMP", precision=3))(False) == 0
    assert reader(SqlType("DOUBLE"))(3) == 3.0 and type(reader(SqlType("DOUBLE"))(3)) is float
    assert reader(SqlType("DECIMAL", precision=10, scale=2))(1.5) == Decimal("1.5")


@given(doc=st.dictionaries(st.sampled_from(["k", "seq", "ts", "it's", 'a"b', "extra"]), JSON_VALUES, max_size=6))
def test_the_generated_row_builder_reads_every_column_by_name(doc: dict[str, Any]) -> None:
    names = ["k", "seq", "ts", "it's", 'a"b']
    types = [SqlType("STRING"), SqlType("BIGINT"), SqlType("TIMESTAMP", precision=3), SqlType("DOUBLE"),
             SqlType("STRING")]
    build = _json_object(names, [reader(t) for t in types])

    def expected(d: dict[str, Any]) -> tuple[Any, ...]:
        return tuple(reference(t, d.get(n)) for n, t in zip(names, types, strict=True))

    assert outcome(build, doc) == outcome(expected, doc)


def test_row_builders_of_one_and_of_no_column() -> None:
    assert _json_object(["only"], [reader(SqlType("BIGINT"))])({"only": "7"}) == (7,)
    assert _json_object([], [])({"a": 1}) == ()
    with pytest.raises(ValueError, match="2 column names and 1 readers"):
        _json_object(["a", "b"], [reader(SqlType("BIGINT"))])
