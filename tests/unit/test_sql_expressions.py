"""The expression compiler (runtime/sql/expressions.py): SQL expressions compiled once into a Python function of a
tuple row, with Flink's semantics for NULL, integer division, CASE, CAST and the built-in functions; and the
aggregate accumulator generated from a query's aggregate calls (runtime/sql/aggregates.py)."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

pytest.importorskip("sqlglot")

import sqlglot  # noqa: E402

from runtime.sql import types as T  # noqa: E402
from runtime.sql.aggregates import CompiledAggregate, describe_call, find_aggregates  # noqa: E402
from runtime.sql.dialect import Flink  # noqa: E402
from runtime.sql.errors import SqlError  # noqa: E402
from runtime.sql.expressions import ExpressionCompiler, Field, Scope  # noqa: E402

SCOPE = Scope((Field("a", T.BIGINT), Field("b", T.STRING), Field("ts", T.TIMESTAMP), Field("d", T.DOUBLE),
               Field("n", T.BIGINT.not_null())))
ROW = (7, "hello", 1_700_000_000_123, 2.5, 3)
NULLS = (None, None, None, None, 3)


def value(text: str, row: tuple[Any, ...] = ROW) -> Any:
    fn, _, _ = ExpressionCompiler(SCOPE).value_function(sqlglot.parse_one(text, read=Flink))
    return fn(row)


@pytest.mark.parametrize(("text", "expected", "on_nulls"), [
    ("a * 2 + 1", 15, None),
    ("-a", -7, None),
    ("a / 2", 3, None),
    ("-a / 2", -3, None),  # Java's integer division truncates toward zero
    ("a % 4", 3, None),
    ("-a % 4", -3, None),
    ("d * 2", 5.0, None),
    ("0.908 * a", Decimal("6.356"), None),
    ("a > 5 AND b IS NOT NULL", True, False),  # NULL AND FALSE is FALSE
    ("a > 5 OR n > 1", True, True),  # NULL OR TRUE is TRUE
    ("a > 5 OR n > 10", True, None),  # NULL OR FALSE is NULL
    ("NOT a > 5", False, None),
    ("b IS NULL", False, True),
    ("a BETWEEN 1 AND 7", True, None),
    ("a IN (1, 7, 9)", True, None),
    ("b LIKE 'he%o'", True, None),
    ("b LIKE 'h_llo'", True, None),
    ("b LIKE 'x%'", False, None),
    ("CASE WHEN a > 10 THEN 'big' WHEN a > 5 THEN 'mid' ELSE 'small' END", "mid", "small"),
    ("CASE a WHEN 7 THEN 'seven' ELSE 'other' END", "seven", "other"),
    ("CAST(a AS STRING)", "7", None),
    ("CAST(d AS BIGINT)", 2, None),
    ("CAST(ts AS STRING)", "2023-11-14 22:13:20.123", None),
    ("CAST('2020-01-01 00:00:01' AS TIMESTAMP(3))", 1_577_836_801_000, 1_577_836_801_000),
    ("UPPER(b)", "HELLO", None),
    ("CHAR_LENGTH(b)", 5, None),
    ("SUBSTRING(b, 2, 3)", "ell", None),
    ("b || '!'", "hello!", None),
    ("CONCAT(b, '-', CAST(n AS STRING))", "hello-3", None),
    ("COALESCE(b, 'none')", "hello", "none"),
    ("DATE_FORMAT(ts, 'yyyy-MM-dd HH:mm')", "2023-11-14 22:13", None),
    ("DATE_FORMAT(ts, 'HH:mm:ss.SSS')", "22:13:20.123", None),
    ("ts - INTERVAL '4' SECOND", 1_699_999_996_123, None),
    ("ts > '2023-11-14 00:00:00'", True, None),
    ("TIMESTAMPADD(MINUTE, 2, ts)", 1_700_000_120_123, None),
    ("EXTRACT(HOUR FROM ts)", 22, None),
    ("ROUND(d)", 3.0, None),
    ("ABS(-a)", 7, None),
    ("MOD(a, 3)", 1, None),
])
def test_compiled_expressions_follow_flink_semantics(text: str, expected: Any, on_nulls: Any) -> None:
    assert value(text) == expected
    assert value(text, NULLS) == on_nulls


def test_one_function_computes_a_whole_select_list_with_field_types() -> None:
    nodes = [sqlglot.parse_one(t, read=Flink) for t in ("a", "b", "n * 2", "CAST(a AS DOUBLE)")]
    fn, types, source = ExpressionCompiler(SCOPE).row_function(nodes)
    assert fn(ROW) == (7, "hello", 6, 7.0)
    assert [str(t) for t in types] == ["BIGINT", "STRING", "BIGINT NOT NULL", "DOUBLE"]
    assert source.startswith("lambda r: (r[0], r[1], ((r[4]) * (2)),")  # a NOT NULL column is used bare


@pytest.mark.parametrize(("text", "message"), [
    ("x + 1", "Column 'x' not found in any table; the columns here are: a, b, ts, d, n"),
    ("a + b", "cannot apply '+' to BIGINT and STRING in a + b"),
    ("a = 'x'", "cannot compare BIGINT with STRING NOT NULL in a = 'x'"),
    ("nope(a)", "No match found for function signature nope(...): not a built-in Sluice SQL has and not declared "
                "with CREATE FUNCTION"),
    ("SUBSTRING(b)", "SUBSTRING takes 2 to 3 arguments, got 1: SUBSTRING(b)"),
    ("SUM(a)", "aggregate SUM(a) is not allowed here (only in the SELECT list or HAVING of a GROUP BY query)"),
])
def test_expression_errors_name_the_expression(text: str, message: str) -> None:
    with pytest.raises(SqlError) as caught:
        value(text)
    assert caught.value.message == message


def test_aggregate_calls_share_one_generated_accumulator() -> None:
    select = sqlglot.parse_one("SELECT COUNT(*), COUNT(b), SUM(a), MIN(a), MAX(b), AVG(a), COUNT(DISTINCT b), "
                               "COUNT(*) FILTER (WHERE a > 2), SUM(d) FROM t", read=Flink)
    compiler = ExpressionCompiler(SCOPE)
    calls = [describe_call(n, compiler) for n in find_aggregates(select.expressions)]
    assert [c.kind for c in calls] == ["COUNT_STAR", "COUNT", "SUM", "MIN", "MAX", "AVG", "COUNT_DISTINCT",
                                       "COUNT_STAR", "SUM"]
    agg = CompiledAggregate(calls, compiler)
    acc = agg.create_accumulator()
    rows = [(1, "x", 0, 1.5, 0), (5, "y", 0, None, 0), (None, "x", 0, 2.0, 0), (4, None, 0, None, 0)]
    for row in rows:
        acc = agg.add(row, acc)
    # AVG of a BIGINT is a BIGINT (10 / 3 truncated), as Flink's
    assert agg.get_result(acc) == (4, 3, 10, 1, "y", 3, 2, 2, 3.5)
    assert agg.get_result(agg.merge(acc, acc)) == (8, 6, 20, 1, "y", 3, 2, 4, 7.0)
    assert agg.get_result(agg.create_accumulator()) == (0, 0, None, None, None, None, 0, 0, None)


def test_a_decimal_sum_is_exact_and_kept_as_text_in_state() -> None:
    scope = Scope((Field("p", T.DECIMAL),))
    compiler = ExpressionCompiler(scope)
    select = sqlglot.parse_one("SELECT SUM(p), MAX(p) FROM t", read=Flink)
    agg = CompiledAggregate([describe_call(n, compiler) for n in find_aggregates(select.expressions)], compiler)
    acc = agg.create_accumulator()
    for p in ("0.1", "0.2", "0.3"):
        acc = agg.add((Decimal(p),), acc)
    assert acc == ("0.6", "0.3")  # msgpack-friendly state
    assert agg.get_result(acc) == (Decimal("0.6"), Decimal("0.3"))
