"""Joins and ROW_NUMBER in SQL (runtime/sql/join_conditions.py, operators.py): time bounds read from a join's
condition, then interval joins, regular outer joins, Top-N and deduplication run through real chains, with the
changelog each emits."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("sqlglot")

import sqlglot  # noqa: E402

from runtime.sql import types as T  # noqa: E402
from runtime.sql.dialect import Flink  # noqa: E402
from runtime.sql.expressions import Field, Scope  # noqa: E402
from runtime.sql.join_conditions import conjuncts, split  # noqa: E402
from tests.support.sql_chain import SqlTailChain  # noqa: E402

LEFT = Scope((Field("id", T.BIGINT, "p"), Field("t", T.TIMESTAMP, "p")))
RIGHT = Scope((Field("seller", T.BIGINT, "a"), Field("t", T.TIMESTAMP, "a"), Field("price", T.BIGINT, "a")))


@pytest.mark.parametrize(("condition", "bounds"), [
    ("p.id = a.seller AND a.t BETWEEN p.t AND p.t + INTERVAL '10' SECOND", (0, 10_000)),
    ("p.id = a.seller AND p.t BETWEEN a.t - INTERVAL '4' SECOND AND a.t", (0, 4000)),
    ("p.id = a.seller AND a.t >= p.t - INTERVAL '1' SECOND AND a.t < p.t + INTERVAL '2' SECOND", (-1000, 1999)),
    ("p.id = a.seller AND p.t > a.t AND p.t <= a.t + INTERVAL '5' SECOND", (-5000, -1)),
    ("p.id = a.seller AND p.t = a.t", (0, 0)),
])
def test_time_bounds_become_bounds_on_right_minus_left(condition: str, bounds: tuple[int, int]) -> None:
    parsed = conjuncts(sqlglot.parse_one(f"SELECT 1 FROM x WHERE {condition}", read=Flink).args["where"].this)
    cond = split(parsed, LEFT, RIGHT, 1, 1)
    assert [k.sql() for k in cond.left_keys] == ["p.id"] and [k.sql() for k in cond.right_keys] == ["a.seller"]
    assert (cond.lower, cond.upper) == bounds
    assert cond.rest == []


def test_other_conjuncts_stay_a_filter_and_without_rowtimes_there_are_no_bounds() -> None:
    parsed = conjuncts(sqlglot.parse_one("SELECT 1 FROM x WHERE p.id = a.seller AND a.price > 10 AND "
                                         "a.t >= p.t", read=Flink).args["where"].this)
    cond = split(parsed, LEFT, RIGHT, None, None)
    assert [c.sql() for c in cond.rest] == ["a.price > 10", "a.t >= p.t"]
    assert not cond.interval


TABLES = """
CREATE TABLE person (id BIGINT, name STRING, t TIMESTAMP(3), WATERMARK FOR t AS t - INTERVAL '1' SECOND)
  WITH ('connector' = 'datagen');
CREATE TABLE auction (seller BIGINT, price BIGINT, t TIMESTAMP(3), WATERMARK FOR t AS t - INTERVAL '1' SECOND)
  WITH ('connector' = 'datagen');
"""


def printed(capsys: Any) -> list[str]:
    return capsys.readouterr().out.splitlines()


def test_an_interval_join_pairs_rows_within_the_bounds(capsys: Any) -> None:
    chain = SqlTailChain(TABLES + """CREATE TABLE out1 (name STRING, price BIGINT) WITH ('connector' = 'print');
        INSERT INTO out1 SELECT P.name, A.price FROM person P, auction A
        WHERE P.id = A.seller AND A.t BETWEEN P.t AND P.t + INTERVAL '10' SECOND;""")
    chain.feed([(1000, (1, "ann", 1000)), (2000, (2, "bob", 2000))], 0)
    chain.feed([(5000, (1, 10, 5000)), (12_000, (1, 20, 12_000)), (900, (2, 30, 900)), (2000, (2, 40, 2000))], 1)
    assert printed(capsys) == ["+I[ann, 10]", "+I[bob, 40]"]  # 12 s is past ann's 10 s; 0.9 s before bob's


def test_a_left_outer_join_emits_a_padded_row_and_retracts_it_at_the_first_match(capsys: Any) -> None:
    chain = SqlTailChain(TABLES + """CREATE TABLE out1 (name STRING, price BIGINT) WITH ('connector' = 'print');
        INSERT INTO out1 SELECT P.name, A.price FROM person P LEFT JOIN auction A ON P.id = A.seller;""")
    chain.feed([(1, (1, "ann", 1))], 0)
    chain.feed([(2, (1, 10, 2)), (3, (1, 20, 3)), (4, (9, 30, 4))], 1)
    chain.feed([(5, (1, "ann2", 5))], 0)
    assert printed(capsys) == ["+I[ann, <NULL>]", "-D[ann, <NULL>]", "+I[ann, 10]", "+I[ann, 20]",
                               "+I[ann2, 10]", "+I[ann2, 20]"]


def test_top_n_retracts_rows_leaving_the_top_and_dedup_keeps_the_first_row(capsys: Any) -> None:
    top = SqlTailChain(TABLES + """CREATE TABLE out1 (seller BIGINT, price BIGINT, rn BIGINT)
          WITH ('connector' = 'print');
        INSERT INTO out1 SELECT seller, price, rn FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY seller
          ORDER BY price DESC) AS rn FROM auction) WHERE rn <= 2;""")
    top.feed([(1, (1, 10, 1)), (2, (1, 30, 2)), (3, (1, 20, 3)), (4, (1, 5, 4))])
    assert printed(capsys) == ["+I[1, 10, 1]", "-D[1, 10, 1]", "+I[1, 30, 1]", "+I[1, 10, 2]",
                               "-D[1, 10, 2]", "+I[1, 20, 2]"]
    dedup = SqlTailChain(TABLES + """CREATE TABLE out1 (seller BIGINT, price BIGINT) WITH ('connector' = 'print');
        INSERT INTO out1 SELECT seller, price FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY seller
          ORDER BY t ASC) AS rn FROM auction) WHERE rn = 1;""")
    dedup.feed([(1, (1, 10, 1)), (2, (2, 30, 2)), (3, (1, 20, 3))])
    assert printed(capsys) == ["+I[1, 10]", "+I[2, 30]"]  # insert-only: later rows of a seller change nothing
