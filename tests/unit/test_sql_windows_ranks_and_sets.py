"""WITH, SELECT DISTINCT, UNION, window Top-N, window deduplication and window joins in SQL (runtime/sql/logical.py,
operators.py): the plans they become and the exact changelogs they emit, run through real operator chains in this
process (tests/support/sql_chain.py)."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("sqlglot")

from runtime.api import Job  # noqa: E402
from runtime.sql.errors import SqlError  # noqa: E402
from runtime.sql.explain import explain  # noqa: E402
from runtime.sql.session import session_of  # noqa: E402
from tests.support.sql_chain import SqlTailChain  # noqa: E402

BIDS = """
CREATE TABLE bids (auction BIGINT, bidder BIGINT, price BIGINT, ts TIMESTAMP(3),
  WATERMARK FOR ts AS ts - INTERVAL '1' SECOND) WITH ('connector' = 'datagen');
CREATE TABLE person (id BIGINT, name STRING, ts TIMESTAMP(3), WATERMARK FOR ts AS ts - INTERVAL '1' SECOND)
  WITH ('connector' = 'datagen');
"""


def printed(capsys: Any) -> list[str]:
    return capsys.readouterr().out.splitlines()


def print_table(cols: str) -> str:
    return f"CREATE TABLE out1 ({cols}) WITH ('connector' = 'print');\n"


def tumbled(auction: int, bidder: int, price: int, ts: int) -> tuple[int, Any]:
    """A bid as TUMBLE(bids, ts, 10 s) gives it: (timestamp, (*bid, window_start, window_end, window_time))."""
    start = ts - ts % 10_000
    return ts, (auction, bidder, price, ts, start, start + 10_000, start + 9999)


# -- WITH, DISTINCT, UNION ----------------------------------------------------------------------------------


def test_with_names_queries_for_the_statement_and_distinct_emits_each_row_once(capsys: Any) -> None:
    chain = SqlTailChain(BIDS + print_table("a BIGINT, b BIGINT") + """
        INSERT INTO out1 WITH pricey (x, y) AS (SELECT auction, bidder FROM bids WHERE price > 2),
          again AS (SELECT x, y FROM pricey)
        SELECT DISTINCT x, y FROM again;""")
    assert chain.names == ["GroupAggregate(groupBy=[x, y], select=[x, y])", "Sink: out1"]
    chain.feed([(1, (1, 2)), (2, (1, 2)), (3, (1, 3)), (4, (1, 3)), (5, (2, 2))])
    assert printed(capsys) == ["+I[1, 2]", "+I[1, 3]", "+I[2, 2]"]  # a row seen again changes nothing


def test_union_is_union_all_then_distinct_and_with_on_the_insert_or_the_query_is_the_same(capsys: Any) -> None:
    chain = SqlTailChain(BIDS + print_table("a BIGINT, b BIGINT") + """
        WITH p AS (SELECT auction, bidder FROM bids WHERE price > 2)
        INSERT INTO out1 SELECT auction, bidder FROM p UNION SELECT bidder, auction FROM bids;""")
    assert chain.names == ["GroupAggregate(groupBy=[auction, bidder], select=[auction, bidder])", "Sink: out1"]
    chain.feed([(1, (1, 2)), (2, (2, 1)), (3, (1, 2)), (4, (1, 3))])
    assert printed(capsys) == ["+I[1, 2]", "+I[2, 1]", "+I[1, 3]"]


@pytest.mark.parametrize(("query", "message"), [
    ("INSERT INTO files SELECT DISTINCT auction, bidder FROM bids",
     "Table sink 'default_catalog.default_database.files' doesn't support consuming update changes which is "
     "produced by node GroupAggregate(groupBy=[auction, bidder], select=[auction, bidder])"),
    ("INSERT INTO files SELECT auction, bidder FROM bids UNION SELECT id, id FROM person",
     "Table sink 'default_catalog.default_database.files' doesn't support consuming update changes which is "
     "produced by node GroupAggregate(groupBy=[auction, bidder], select=[auction, bidder])"),
    ("INSERT INTO files WITH w (a) AS (SELECT auction, bidder FROM bids) SELECT * FROM w",
     "WITH w (a): 1 column names for a query of 2 columns"),
    ("INSERT INTO files WITH w AS (SELECT auction, bidder FROM bids) SELECT * FROM v",
     "Object 'v' not found: no table or view of that name was created (tables: bids, files, person)"),
    ("INSERT INTO files SELECT DISTINCT ON (auction) auction, bidder FROM bids",
     "SELECT DISTINCT ON is not Flink SQL: use ROW_NUMBER() OVER (PARTITION BY ...) = 1"),
])
def test_distinct_and_union_update_so_an_append_only_sink_refuses_them_as_flink_does(query: str,
                                                                                  message: str) -> None:
    text = BIDS + "CREATE TABLE files (a BIGINT, b BIGINT) WITH ('connector' = 'filesystem', 'path' = 'o', " \
                  "'format' = 'json');\n" + query + ";"
    with pytest.raises(SqlError) as caught:
        Job("q").sql(text)
    assert caught.value.message == message
    assert caught.value.line == 7


# -- window Top-N and deduplication ------------------------------------------------------------------------


def test_window_top_n_over_a_window_aggregation_appends_the_ranked_rows_once_the_window_fires(capsys: Any) -> None:
    chain = SqlTailChain(BIDS + print_table("ws TIMESTAMP(3), auction BIGINT, n BIGINT, rn BIGINT") + """
        INSERT INTO out1 SELECT window_start, auction, n, rn FROM (
          SELECT *, ROW_NUMBER() OVER (PARTITION BY window_start, window_end ORDER BY n DESC) AS rn FROM (
            SELECT auction, window_start, window_end, COUNT(*) AS n
            FROM TABLE(TUMBLE(TABLE bids, DESCRIPTOR(ts), INTERVAL '10' SECOND))
            GROUP BY auction, window_start, window_end)) WHERE rn <= 2;""")
    assert chain.names[0].startswith("WindowRank(partitionBy=[window_start, window_end], orderBy=[n DESC], "
                                     "rankRange=[1..2]")
    # the window aggregation's rows (auction, window_start, window_end, n), at window_time
    chain.feed([(9999, (1, 0, 10_000, 3)), (9999, (2, 0, 10_000, 5)), (9999, (3, 0, 10_000, 4))])
    chain.watermark(9998)
    assert printed(capsys) == []  # nothing before the window fires: insert-only, no retraction ever
    chain.watermark(9999)
    assert printed(capsys) == ["+I[1970-01-01 00:00:00, 2, 5, 1]", "+I[1970-01-01 00:00:00, 3, 4, 2]"]
    chain.feed([(9999, (4, 0, 10_000, 9))])  # its window fired: dropped, as Flink drops it
    chain.watermark(20_000)
    assert printed(capsys) == []


def test_window_deduplication_over_a_window_tvf_keeps_the_last_row_of_each_window_and_key(capsys: Any) -> None:
    chain = SqlTailChain(BIDS + print_table("auction BIGINT, price BIGINT, ts TIMESTAMP(3), ws TIMESTAMP(3)") + """
        INSERT INTO out1 SELECT auction, price, ts, window_start FROM (
          SELECT *, ROW_NUMBER() OVER (PARTITION BY window_start, window_end, auction ORDER BY ts DESC) AS rn
          FROM TABLE(TUMBLE(TABLE bids, DESCRIPTOR(ts), INTERVAL '10' SECOND))) WHERE rn = 1;""")
    assert chain.names[0].startswith("WindowDeduplicate(partitionBy=[window_start, window_end, auction], "
                                     "orderBy=[ts DESC]")
    chain.feed([tumbled(1, 0, 5, 1000), tumbled(1, 0, 6, 3000), tumbled(1, 0, 7, 3000), tumbled(1, 0, 1, 2000),
                tumbled(2, 0, 1, 500), tumbled(1, 0, 8, 12_000)])
    chain.watermark(9999)
    assert printed(capsys) == ["+I[1, 7, 1970-01-01 00:00:03, 1970-01-01 00:00:00]",  # the later of two at 3 s
                               "+I[2, 1, 1970-01-01 00:00:00.5, 1970-01-01 00:00:00]"]
    chain.feed([tumbled(1, 0, 9, 9000)])  # late
    chain.watermark(30_000)
    assert printed(capsys) == ["+I[1, 8, 1970-01-01 00:00:12, 1970-01-01 00:00:10]"]


def test_a_rank_partitioned_by_a_renamed_or_qualified_column_of_a_join_reads_the_projection() -> None:
    job = Job("q")
    job.sql(BIDS + print_table("id BIGINT, name STRING, price BIGINT, bid_ts TIMESTAMP(3)") + """
        INSERT INTO out1 SELECT id, name, price, bid_ts FROM (
          SELECT P.*, B.price, B.ts AS bid_ts,
            ROW_NUMBER() OVER (PARTITION BY P.id ORDER BY B.price DESC, B.ts ASC) AS rownum
          FROM person P, bids B WHERE P.id = B.bidder) WHERE rownum <= 1;""")
    shown = explain(session_of(job))
    assert "Deduplicate(partitionBy=[id], orderBy=[price DESC, bid_ts ASC], rankRange=[1..1], outputRank=[true])" \
        "  changelog=[I,D]" in shown


# -- window joins ------------------------------------------------------------------------------------------


WINDOW_JOIN = """
    INSERT INTO out1 SELECT P.id, P.name, B.price, P.ws FROM (
      SELECT id, name, window_start AS ws, window_end AS we
      FROM TABLE(TUMBLE(TABLE person, DESCRIPTOR(ts), INTERVAL '10' SECOND)) GROUP BY id, name, window_start, window_end
    ) P {how} JOIN (
      SELECT * FROM TABLE(TUMBLE(TABLE bids, DESCRIPTOR(ts), INTERVAL '10' SECOND))
    ) B ON P.id = B.bidder AND P.ws = B.window_start AND P.we = B.window_end AND B.price > 2;"""


def test_a_window_join_pairs_the_rows_of_each_window_once_it_fires(capsys: Any) -> None:
    chain = SqlTailChain(BIDS + print_table("id BIGINT, name STRING, price BIGINT, ws TIMESTAMP(3)")
                         + WINDOW_JOIN.format(how=""))
    assert chain.names[0].startswith("WindowJoin(joinType=[InnerJoin], where=[P.id = B.bidder AND "
                                     "P.ws = B.window_start AND P")
    chain.feed([(9999, (7, "ann", 0, 10_000)), (19_999, (7, "ann", 10_000, 20_000))], 0)  # window aggregation rows
    chain.feed([tumbled(1, 7, 5, 1000), tumbled(1, 7, 1, 2000), tumbled(1, 8, 9, 3000), tumbled(1, 7, 6, 12_000)],
               1)
    chain.watermark(9998)
    assert printed(capsys) == []
    chain.watermark(9999)
    assert printed(capsys) == ["+I[7, ann, 5, 1970-01-01 00:00:00]"]  # 1 fails B.price > 2; bidder 8 no person
    chain.feed([tumbled(1, 7, 50, 4000)], 1)  # its window fired: dropped
    chain.watermark(20_000)
    assert printed(capsys) == ["+I[7, ann, 6, 1970-01-01 00:00:10]"]


def test_a_left_window_join_pads_the_rows_without_a_match_when_the_window_fires(capsys: Any) -> None:
    chain = SqlTailChain(BIDS + print_table("id BIGINT, name STRING, price BIGINT, ws TIMESTAMP(3)")
                         + WINDOW_JOIN.format(how="LEFT"))
    assert chain.names[0].startswith("WindowJoin(joinType=[LeftOuterJoin]")
    chain.feed([(9999, (7, "ann", 0, 10_000)), (9999, (8, "bob", 0, 10_000))], 0)
    chain.feed([tumbled(1, 7, 5, 1000), tumbled(1, 8, 1, 2000)], 1)
    chain.watermark(9999)
    assert sorted(printed(capsys)) == ["+I[7, ann, 5, 1970-01-01 00:00:00]", "+I[8, bob, <NULL>, 1970-01-01 00:00:00]"]


def test_windows_joined_on_their_bounds_are_a_window_join_and_other_joins_stay_regular() -> None:
    job = Job("q")
    job.sql(BIDS + print_table("id BIGINT, name STRING, price BIGINT, ws TIMESTAMP(3)") + WINDOW_JOIN.format(how="")
            + WINDOW_JOIN.format(how="").replace("AND P.we = B.window_end", ""))
    shown = explain(session_of(job))
    assert shown.count("WindowJoin(joinType=[InnerJoin], where=[P.id = B.bidder AND P.ws = B.window_start AND "
                       "P.we = B.window_end AND B.price > 2])  changelog=[I]") == 1
    assert "state both sides' rows per key and window, until it fires" in shown
    assert shown.count("Join(joinType=[InnerJoin], where=[P.id = B.bidder AND P.ws = B.window_start AND " \
                       "B.price > 2])  changelog=[I]") == 1  # only the start equal: a regular join


def test_grouping_a_window_aggregations_rows_by_their_window_aggregates_each_window_once(capsys: Any) -> None:
    chain = SqlTailChain(BIDS + print_table("top BIGINT, ws TIMESTAMP(3), we TIMESTAMP(3)") + """
        INSERT INTO out1 SELECT MAX(c.n), c.ws, c.we FROM (
          SELECT auction, COUNT(*) AS n, window_start AS ws, window_end AS we
          FROM TABLE(TUMBLE(TABLE bids, DESCRIPTOR(ts), INTERVAL '10' SECOND))
          GROUP BY auction, window_start, window_end) c
        GROUP BY c.ws, c.we;""")
    assert chain.names[0] == "WindowAggregate(groupBy=[c.ws, c.we], window=[the input's windows], select=[MAX(c.n)])"
    chain.feed([(9999, (1, 3, 0, 10_000)), (9999, (2, 5, 0, 10_000)), (19_999, (1, 2, 10_000, 20_000))])
    chain.watermark(9998)
    assert printed(capsys) == []
    chain.watermark(9999)
    assert printed(capsys) == ["+I[5, 1970-01-01 00:00:00, 1970-01-01 00:00:10]"]
    chain.feed([(9999, (3, 9, 0, 10_000))])  # its window fired: dropped
    chain.watermark(19_999)
    assert printed(capsys) == ["+I[2, 1970-01-01 00:00:10, 1970-01-01 00:00:20]"]


# -- OVER aggregations and CURRENT_WATERMARK ----------------------------------------------------------------


def bid(auction: int, price: int, ts: int) -> tuple[int, Any]:
    return ts, (auction, 0, price, ts)


@pytest.mark.parametrize(("frame", "after_late"), [
    # the row at 3 s sees the row at 2 s before it (and, for the second one at 3 s, the first)
    ("ROWS BETWEEN 1 PRECEDING AND CURRENT ROW", ["+I[1, 10, 110, 2]", "+I[1, 1000, 1010, 2]"]),
    # rows of one timestamp are peers: both rows at 3 s see each other and everything from 1 s on
    ("RANGE BETWEEN INTERVAL '2' SECOND PRECEDING AND CURRENT ROW", ["+I[1, 10, 1111, 4]", "+I[1, 1000, 1111, 4]"]),
    ("RANGE BETWEEN INTERVAL '1' SECOND PRECEDING AND CURRENT ROW", ["+I[1, 10, 1110, 3]", "+I[1, 1000, 1110, 3]"]),
    ("", ["+I[1, 10, 1111, 4]", "+I[1, 1000, 1111, 4]"]),  # Flink's default: RANGE UNBOUNDED PRECEDING
    ("ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW", ["+I[1, 10, 111, 3]", "+I[1, 1000, 1111, 4]"]),
])
def test_over_aggregates_emit_each_row_in_rowtime_order_with_its_frame_once_the_watermark_passes_it(
        capsys: Any, frame: str, after_late: list[str]) -> None:
    chain = SqlTailChain(BIDS + print_table("a BIGINT, p BIGINT, s BIGINT, c BIGINT") + f"""
        INSERT INTO out1 SELECT auction, price, SUM(price) OVER w, COUNT(*) OVER w FROM bids
        WINDOW w AS (PARTITION BY auction ORDER BY ts {frame});""")
    assert chain.names[0].startswith("OverAggregate(partitionBy=[auction], orderBy=[ts ASC], window=[")
    chain.feed([bid(1, 1, 1000), bid(1, 10, 3000), bid(1, 100, 2000), bid(1, 1000, 3000), bid(2, 5, 1000)])
    chain.watermark(2500)
    assert printed(capsys) == ["+I[1, 1, 1, 1]", "+I[2, 5, 5, 1]", "+I[1, 100, 101, 2]"]
    chain.feed([bid(1, 7, 2000)])  # at or before the last timestamp emitted for its key: late, dropped
    chain.watermark(5000)
    assert printed(capsys) == after_late


@pytest.mark.parametrize(("query", "message"), [
    ("SELECT auction, SUM(price) OVER (PARTITION BY auction ORDER BY price) FROM bids",
     "an OVER window must be ORDER BY the rowtime attribute ascending (a column with a WATERMARK FOR it); other "
     "orders and processing time are not supported"),
    ("SELECT SUM(price) OVER (ORDER BY ts ROWS 2 PRECEDING), MAX(price) OVER (ORDER BY ts) FROM bids",
     "the OVER aggregates of one SELECT must use the same window (Flink's rule): OVER (ORDER BY ts ROWS BETWEEN 2 "
     "PRECEDING AND CURRENT ROW); OVER (ORDER BY ts)"),
    ("SELECT auction, CURRENT_WATERMARK(price) FROM bids",
     "CURRENT_WATERMARK(price): CURRENT_WATERMARK takes the rowtime column of the rows"),
])
def test_over_windows_and_current_watermark_that_cannot_be_planned_say_why(query: str, message: str) -> None:
    with pytest.raises(SqlError) as caught:
        Job("q").sql(BIDS + print_table("a BIGINT, b BIGINT") + f"INSERT INTO out1 {query};")
    assert caught.value.message == message
    assert caught.value.line == 7 and caught.value.column is not None and caught.value.column > 1  # in the query


def test_current_watermark_is_the_operators_watermark_and_null_before_the_first(capsys: Any) -> None:
    chain = SqlTailChain(BIDS + print_table("a BIGINT, s BIGINT, wm TIMESTAMP(3)") + """
        INSERT INTO out1 SELECT auction, s, CURRENT_WATERMARK(ts) FROM (
          SELECT auction, ts, SUM(price) OVER (ORDER BY ts) AS s FROM bids)
        WHERE CURRENT_WATERMARK(ts) IS NULL OR ts > CURRENT_WATERMARK(ts);""")
    assert chain.names[2].startswith("Calc(select=[auction, s, CURRENT_WATERMARK(ts) AS EXPR$2], where=[")
    chain.feed([bid(1, 1, 1000), bid(2, 10, 3000)])
    chain.watermark(1500)  # the OVER emits the row at 1 s before the watermark reaches the Calc: NULL there
    chain.watermark(5000)
    assert printed(capsys) == ["+I[1, 1, <NULL>]", "+I[2, 11, 1970-01-01 00:00:01.5]"]


def test_a_subquery_written_twice_is_one_operator_as_flinks_sub_plan_reuse_makes_it() -> None:
    counts = """(SELECT auction, COUNT(*) AS n, window_start AS ws, window_end AS we
        FROM TABLE(HOP(TABLE bids, DESCRIPTOR(ts), INTERVAL '2' SECOND, INTERVAL '10' SECOND))
        GROUP BY auction, window_start, window_end)"""
    job = Job("q")
    job.sql(BIDS + print_table("auction BIGINT, n BIGINT") + f"""
        INSERT INTO out1 SELECT a.auction, a.n FROM {counts} a
        JOIN (SELECT MAX(c.n) AS top, c.ws, c.we FROM {counts} c GROUP BY c.ws, c.we) m
        ON a.ws = m.ws AND a.we = m.we AND a.n >= m.top;""")
    names = [n.name.split("(")[0] for n in job.nodes]
    assert names.count("WindowAggregate") == 2  # the HOP counts once, the per-window maximum over them
    assert names.count("Source: bids") == 1
    shown = explain(session_of(job))
    assert "Calc(select=[auction, COUNT(*) AS n, window_start AS ws, window_end AS we])  changelog=[I]  (reused)" \
        in shown
    # two INSERTs of one query into one table stay two sinks (each writes its rows)
    twice = Job("q")
    twice.sql(BIDS + print_table("a BIGINT") + "INSERT INTO out1 SELECT auction FROM bids; "
              "INSERT INTO out1 SELECT auction FROM bids;")
    assert [n.kind for n in twice.nodes].count("sink") == 2


CLICKS = """
CREATE TABLE clicks (user_id BIGINT, url STRING, pt AS PROCTIME()) WITH ('connector' = 'datagen');
"""


@pytest.mark.parametrize(("window", "size_ms"), [
    ("TUMBLE(TABLE clicks, DESCRIPTOR(pt), INTERVAL '1' MINUTE)", 60_000),
    ("HOP(TABLE clicks, DESCRIPTOR(pt), INTERVAL '30' SECOND, INTERVAL '1' MINUTE)", 30_000),
    ("CUMULATE(TABLE clicks, DESCRIPTOR(pt), INTERVAL '30' SECOND, INTERVAL '1' MINUTE)", 30_000),
])
def test_processing_time_windows_fire_on_the_operators_wall_clock(window: str, size_ms: int, capsys: Any) -> None:
    chain = SqlTailChain(CLICKS + print_table("user_id BIGINT, ws TIMESTAMP(3), we TIMESTAMP(3), c BIGINT") +
                         f"INSERT INTO out1 SELECT user_id, window_start, window_end, COUNT(*) FROM TABLE({window}) "
                         "GROUP BY user_id, window_start, window_end;")
    assert "time_col=[pt]" in chain.names[0], chain.names
    chain.feed([(1, "a", 0), (2, "b", 0), (1, "c", 0)])  # the PROCTIME() column's value plays no part
    timers = chain.chain.timers
    assert timers is not None
    due = timers.timers.processing.peek()
    # the first window to end: the next multiple of its size (HOP: slide, CUMULATE: step) on the wall clock, minus 1
    assert due is not None and due % size_ms == size_ms - 1 and not printed(capsys)
    timers.fire_processing(due, 64)
    lines = printed(capsys)
    assert [(line.split(",")[0], line.split(",")[-1]) for line in lines] == [("+I[1", " 2]"), ("+I[2", " 1]")], lines


def test_a_window_over_a_column_that_is_neither_rowtime_nor_proctime_is_refused() -> None:
    with pytest.raises(SqlError, match=r"column url is not a time attribute: .* or a processing-time column"):
        Job("refused").sql(CLICKS + print_table("user_id BIGINT, c BIGINT") +
                           "INSERT INTO out1 SELECT user_id, COUNT(*) FROM TABLE(TUMBLE(TABLE clicks, DESCRIPTOR(url), "
                           "INTERVAL '1' MINUTE)) GROUP BY user_id, window_start, window_end;")
