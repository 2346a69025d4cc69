"""The Flink dialect on sqlglot and the catalog a script's DDL builds: what parses into what, and bad SQL as one
line naming the line, the column and what was expected (runtime/sql/dialect.py, parse.py, catalog.py)."""

from __future__ import annotations

import pytest

pytest.importorskip("sqlglot")

from runtime.sql import types as T  # noqa: E402
from runtime.sql.catalog import Catalog, Column, Watermark  # noqa: E402
from runtime.sql.dialect import StatementSet, WindowTableFunction  # noqa: E402
from runtime.sql.errors import SqlError  # noqa: E402
from runtime.sql.parse import parse_script  # noqa: E402

BIDS = """CREATE TABLE bids (
  auction BIGINT NOT NULL,
  price BIGINT,
  date_time TIMESTAMP(3),
  doubled AS price * 2,
  WATERMARK FOR date_time AS date_time - INTERVAL '4' SECOND,
  PRIMARY KEY (auction) NOT ENFORCED
) WITH ('connector' = 'filesystem', 'path' = 'bids/', 'format' = 'json')"""


def catalog_of(text: str) -> Catalog:
    catalog = Catalog()
    for statement in parse_script(text):
        catalog.apply(statement.node)
    return catalog


def test_create_table_records_columns_computed_columns_watermark_key_and_options() -> None:
    table = catalog_of(BIDS).table("bids")
    assert [c.name for c in table.columns] == ["auction", "price", "date_time", "doubled"]
    assert table.columns[0] == Column("auction", T.SqlType("BIGINT", nullable=False))
    assert table.columns[2].type == T.SqlType("TIMESTAMP", precision=3)
    assert table.columns[3].type is None and table.columns[3].computed is not None
    assert [c.name for c in table.physical] == ["auction", "price", "date_time"]
    assert table.watermark == Watermark("date_time", 4000)
    assert table.primary_key == ("auction",)
    assert table.options == {"connector": "filesystem", "path": "bids/", "format": "json"}


def test_set_view_and_function_statements_go_to_the_catalog() -> None:
    catalog = catalog_of(BIDS + """;
        SET 'parallelism.default' = '4';
        SET 'execution.checkpointing.interval' = '10s';
        CREATE VIEW cheap AS SELECT auction FROM bids WHERE price < 10;
        CREATE TEMPORARY FUNCTION fx AS 'udfs.fx' LANGUAGE PYTHON;""")
    assert catalog.options == {"parallelism.default": "4", "execution.checkpointing.interval": "10s"}
    assert list(catalog.views) == ["cheap"]
    assert catalog.functions["fx"].target == "udfs.fx"


def test_statement_sets_in_both_spellings_fold_into_one_statement() -> None:
    for text in ("EXECUTE STATEMENT SET BEGIN INSERT INTO a SELECT * FROM b; INSERT INTO c SELECT * FROM b; END;",
                 "BEGIN STATEMENT SET; INSERT INTO a SELECT * FROM b; INSERT INTO c SELECT * FROM b; END;"):
        (statement,) = parse_script(text)
        assert isinstance(statement.node, StatementSet)
        assert [i.this.name for i in statement.node.expressions] == ["a", "c"]


def test_window_table_functions_take_positional_and_named_arguments_and_session_partitions() -> None:
    (a,) = parse_script("SELECT * FROM TABLE(HOP(TABLE bids, DESCRIPTOR(date_time), INTERVAL '2' SECOND, "
                        "INTERVAL '10' SECOND))")
    (b,) = parse_script("SELECT * FROM TABLE(TUMBLE(DATA => TABLE bids, TIMECOL => DESCRIPTOR(date_time), "
                        "SIZE => INTERVAL '10' MINUTES))")
    (c,) = parse_script("SELECT * FROM TABLE(SESSION(TABLE bids PARTITION BY bidder, auction, "
                        "DESCRIPTOR(date_time), INTERVAL '5' SECOND))")
    hop, tumble, session = (s.node.find(WindowTableFunction) for s in (a, b, c))
    assert hop.args["kind"].name == "HOP" and len(hop.expressions) == 2
    assert tumble.args["kind"].name == "TUMBLE" and tumble.expressions[0].sql() == "INTERVAL '10' MINUTES"
    assert [p.name for p in session.args["partition"]] == ["bidder", "auction"]


def test_statements_know_the_line_and_column_they_start_at() -> None:
    statements = parse_script("SET 'a' = 'b';\n\n  CREATE VIEW v AS SELECT 1 AS x FROM t;\n"
                              "INSERT INTO o SELECT * FROM v;")
    assert [(s.line, s.column) for s in statements] == [(1, 1), (3, 3), (4, 1)]


@pytest.mark.parametrize(("text", "message"), [
    ("SELECT a FROM t WHERE (", "line 1, column 23: an expression is missing near '('"),
    ("SELECT a\nFROM t WHERE a >", "line 2, column 16: an expression is missing near '>'"),
    ("SELECT a b c FROM t", "line 1, column 12: unexpected 'c'"),
    ("CREATE TABLE (a INT)", "line 1, column 14: expected table name, got '('"),
    ("SELECT CAST(a AS ) FROM t", "line 1, column 18: expected TYPE, got ')'"),
    ("SELECT 1 FROM t;\nSELECT 'abc FROM t", "line 2, column 8: a string literal is not closed (a ' is missing), "
                                            "or a character is not SQL"),
    ("EXECUTE STATEMENT SET BEGIN INSERT INTO a SELECT * FROM b;", "line 1, column 1: the statement set is not "
                                                                   "closed: END; expected"),
])
def test_bad_sql_is_one_line_naming_line_column_and_what_was_expected(text: str, message: str) -> None:
    with pytest.raises(SqlError) as caught:
        parse_script(text)
    assert str(caught.value) == message
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(("ddl", "message"), [
    ("CREATE TABLE x (a BIGINT)", "table x: WITH ('connector' = '...') is missing (filesystem, datagen, print, "
                                  "blackhole)"),
    ("CREATE TABLE x (a BIGINT, a STRING) WITH ('connector' = 'print')", "table x: column a is declared twice"),
    ("CREATE TABLE x (a BIGINT, WATERMARK FOR a AS a - INTERVAL '1' SECOND) WITH ('connector' = 'print')",
     "table x: the watermark's column a is a BIGINT; a rowtime attribute must be a TIMESTAMP(3) or "
     "TIMESTAMP_LTZ(3)"),
    ("CREATE TABLE x (a TIMESTAMP(3), WATERMARK FOR a AS a + INTERVAL '1' SECOND) WITH ('connector' = 'print')",
     "WATERMARK FOR a AS a + INTERVAL '1' SECOND: only `a` and `a - INTERVAL ...` (bounded out-of-orderness) are "
     "supported"),
    ("CREATE TABLE x (a BIGINT, PRIMARY KEY (b) NOT ENFORCED) WITH ('connector' = 'print')",
     "table x: primary key column b is not a column of the table"),
    ("CREATE TABLE x (a MAP<STRING, INT>) WITH ('connector' = 'print')", None),
    ("CREATE FUNCTION f AS 'm.f' LANGUAGE JAVA", "function f: only LANGUAGE PYTHON functions are supported "
                                                 "(CREATE FUNCTION f AS 'module.function' LANGUAGE PYTHON)"),
])
def test_bad_ddl_is_refused_with_what_is_wrong(ddl: str, message: str | None) -> None:
    with pytest.raises(SqlError) as caught:
        catalog_of(ddl)
    if message is not None:
        assert str(caught.value) == message


def test_a_second_create_of_a_name_is_refused_unless_if_not_exists() -> None:
    text = "CREATE TABLE x (a BIGINT) WITH ('connector' = 'print');"
    with pytest.raises(SqlError, match="Object 'x' already exists"):
        catalog_of(text + text)
    catalog = catalog_of(text + text.replace("CREATE TABLE x", "CREATE TABLE IF NOT EXISTS x"))
    assert list(catalog.tables) == ["x"]
