"""Aggregations, DISTINCT and Top-N over an updating input (runtime/sql/retracting.py, operators.py): the plans
they become (Nexmark q4 and q6) and the exact changelogs they emit when their input's rows are updated and
retracted, run through real operator chains in this process (tests/support/sql_chain.py): the head operator of
the chain is fed the (kind, row) pairs its updating input sends."""

from __future__ import annotations

import sys
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("sqlglot")

from runtime.api import Job  # noqa: E402
from runtime.sql.explain import explain  # noqa: E402
from runtime.sql.session import session_of  # noqa: E402
from runtime.state.codec import decode_value, encode_value  # noqa: E402
from tests.support.sql_chain import SqlTailChain  # noqa: E402

BIDS = """
CREATE TABLE bids (auction BIGINT, bidder BIGINT, price BIGINT, ts TIMESTAMP(3),
  WATERMARK FOR ts AS ts - INTERVAL '1' SECOND) WITH ('connector' = 'datagen');
"""
# the MAX price per auction and bidder: an updating input ([I,UB,UA]) for the query over it
FINALS = "(SELECT MAX(price) AS final, bidder AS category FROM bids GROUP BY auction, bidder) Q"


def printed(capsys: Any) -> list[str]:
    return capsys.readouterr().out.splitlines()


def print_table(cols: str) -> str:
    return f"CREATE TABLE out1 ({cols}) WITH ('connector' = 'print');\n"


def changes(*pairs: tuple[str, tuple[Any, ...]]) -> list[tuple[None, Any]]:
    return [(None, pair) for pair in pairs]


def test_a_group_by_of_a_group_by_adds_and_retracts_and_deletes_a_group_whose_rows_are_all_gone(capsys: Any) -> None:
    chain = SqlTailChain(BIDS + print_table("category BIGINT, a BIGINT, n BIGINT, hi BIGINT, lo BIGINT, s BIGINT")
                         + f"INSERT INTO out1 SELECT category, AVG(final), COUNT(*), MAX(final), MIN(final), "
                           f"SUM(final) FROM {FINALS} GROUP BY category;")
    assert chain.names[0].startswith("GroupAggregate(groupBy=[category], select=[AVG(final), COUNT(*), MAX(final)")
    chain.feed(changes(("+I", (10, 1)), ("+I", (20, 1)),
                       ("-U", (20, 1)), ("+U", (30, 1)),  # the MAX of one auction went from 20 to 30
                       ("+I", (10, 1)),  # a second 10: the multiset holds {10: 2, 30: 1}
                       ("-D", (30, 1)),  # the current MAX retracted: the next one is 10
                       ("-D", (5, 2)),  # a retraction for a group never seen changes nothing
                       ("-D", (10, 1)), ("-D", (10, 1))))  # the group's last row gone: -D, state dropped
    assert printed(capsys) == [
        "+I[1, 10, 1, 10, 10, 10]",
        "-U[1, 10, 1, 10, 10, 10]", "+U[1, 15, 2, 20, 10, 30]",
        "-U[1, 15, 2, 20, 10, 30]", "+U[1, 10, 1, 10, 10, 10]",
        "-U[1, 10, 1, 10, 10, 10]", "+U[1, 20, 2, 30, 10, 40]",
        "-U[1, 20, 2, 30, 10, 40]", "+U[1, 16, 3, 30, 10, 50]",
        "-U[1, 16, 3, 30, 10, 50]", "+U[1, 10, 2, 10, 10, 20]",
        "-U[1, 10, 2, 10, 10, 20]", "+U[1, 10, 1, 10, 10, 10]",
        "-D[1, 10, 1, 10, 10, 10]",
    ]
    chain.feed(changes(("+I", (7, 1))))  # the group comes back from nothing: +I again
    assert printed(capsys) == ["+I[1, 7, 1, 7, 7, 7]"]


def test_min_max_sum_count_distinct_and_filter_retract_to_null_and_zero(capsys: Any) -> None:
    chain = SqlTailChain(BIDS + print_table("c BIGINT, mx BIGINT, s BIGINT, d BIGINT, big BIGINT, n BIGINT")
                         + "INSERT INTO out1 SELECT category, MAX(final), SUM(final), COUNT(DISTINCT final), "
                           "COUNT(*) FILTER (WHERE final > 15), COUNT(final) FROM "
                           "(SELECT MAX(price) AS final, bidder AS category, auction FROM bids "
                           "GROUP BY auction, bidder) Q GROUP BY category;")
    chain.feed(changes(("+I", (None, 1, 1)), ("+I", (20, 1, 2)), ("+I", (20, 1, 3)), ("-D", (20, 1, 2)),
                       ("-D", (20, 1, 3))))
    assert printed(capsys) == [
        "+I[1, <NULL>, <NULL>, 0, 0, 0]",  # a NULL value is a row but no value
        "-U[1, <NULL>, <NULL>, 0, 0, 0]", "+U[1, 20, 20, 1, 1, 1]",
        "-U[1, 20, 20, 1, 1, 1]", "+U[1, 20, 40, 1, 2, 2]",
        "-U[1, 20, 40, 1, 2, 2]", "+U[1, 20, 20, 1, 1, 1]",
        "-U[1, 20, 20, 1, 1, 1]", "+U[1, <NULL>, <NULL>, 0, 0, 0]",  # no value left: MAX and SUM are NULL again
    ]


def test_an_aggregate_over_a_left_joins_output_deletes_the_group_of_a_retracted_padded_row(capsys: Any) -> None:
    chain = SqlTailChain(BIDS + print_table("a BIGINT, n BIGINT") + """
        CREATE TABLE p (id BIGINT, name STRING) WITH ('connector' = 'datagen');
        INSERT INTO out1 SELECT b.auction, COUNT(p.name) FROM bids b LEFT JOIN p ON b.bidder = p.id
        GROUP BY b.auction;""")
    padded, joined = (1, 7, 10, 0, None, None), (1, 7, 10, 0, 7, "x")
    # the bid without its person (+I padded), then the person arrives: the padded row retracted, the pair added
    chain.feed(changes(("+I", padded), ("-D", padded), ("+I", joined)))
    assert printed(capsys) == ["+I[1, 0]", "-D[1, 0]", "+I[1, 1]"]


def test_distinct_over_an_updating_input_inserts_a_row_once_and_deletes_it_with_its_last_copy(capsys: Any) -> None:
    chain = SqlTailChain(BIDS + print_table("c BIGINT") + f"INSERT INTO out1 SELECT DISTINCT category FROM {FINALS};")
    assert chain.names[0] == "GroupAggregate(groupBy=[category], select=[category])"
    chain.feed(changes(("+I", (1,)), ("+I", (1,)), ("+I", (2,)), ("-D", (1,)), ("-U", (2,)), ("-D", (1,)),
                       ("+U", (2,))))
    assert printed(capsys) == ["+I[1]", "+I[2]", "-D[2]", "-D[1]", "+I[2]"]


def test_top_n_over_an_updating_input_lets_the_next_row_in_when_a_top_row_is_retracted(capsys: Any) -> None:
    chain = SqlTailChain(BIDS + print_table("seller BIGINT, f BIGINT, rn BIGINT") + """
        INSERT INTO out1 SELECT seller, final, rn FROM (SELECT seller, final, ROW_NUMBER() OVER (PARTITION BY seller
          ORDER BY final DESC) AS rn FROM (SELECT bidder AS seller, MAX(price) AS final FROM bids
          GROUP BY auction, bidder)) WHERE rn <= 2;""")
    assert chain.names[0] == "Rank(partitionBy=[seller], orderBy=[final DESC], rankRange=[1..2], outputRank=[true])"
    chain.feed(changes(("+I", (1, 10)), ("+I", (1, 30)), ("+I", (1, 20)), ("+I", (2, 5)),
                       ("-U", (1, 30)), ("+U", (1, 40)),  # the top row updated: retracted, then it comes back
                       ("-D", (1, 99)),  # a row never seen: nothing
                       ("-D", (1, 5))))  # a row below the top 2 retracted: the top 2 is unchanged
    assert printed(capsys) == [
        "+I[1, 10, 1]",
        "-D[1, 10, 1]", "+I[1, 30, 1]", "+I[1, 10, 2]",
        "-D[1, 10, 2]", "+I[1, 20, 2]",
        "+I[2, 5, 1]",
        "-D[1, 30, 1]", "-D[1, 20, 2]", "+I[1, 20, 1]", "+I[1, 10, 2]",  # 30 gone: 10 comes back in
        "-D[1, 20, 1]", "-D[1, 10, 2]", "+I[1, 40, 1]", "+I[1, 20, 2]",
    ]


def test_a_retracting_accumulator_restored_from_state_goes_on_where_it_stopped() -> None:
    chain = SqlTailChain(BIDS + print_table("c BIGINT, mx BIGINT, mn BIGINT, a BIGINT")
                         + f"INSERT INTO out1 SELECT category, MAX(final), MIN(final), AVG(final) FROM {FINALS} "
                           "GROUP BY category;")
    outer = [n for n in chain.job.nodes if n.name.startswith("GroupAggregate(groupBy=[category]")]
    agg = outer[0].payload.aggregate
    acc = agg.create_accumulator()
    for value in (5, 9, 9, 1):
        acc = agg.add((value, 1), acc)
    restored = decode_value(encode_value(acc))  # tuples come back as lists, as keyed state gives them
    assert agg.get_result(restored) == (9, 1, 6)
    after = agg.retract((9, 1), agg.retract((1, 1), restored))
    assert agg.get_result(after) == (9, 5, 7) and agg.rows(after) == 2
    assert agg.get_result(agg.retract((9, 1), after)) == (5, 5, 5)


def test_decimal_sums_and_extremes_retract_exactly(capsys: Any) -> None:
    chain = SqlTailChain(BIDS + print_table("c BIGINT, mx DECIMAL(10, 2), s DECIMAL(10, 2), d BIGINT") + """
        INSERT INTO out1 SELECT category, MAX(f), SUM(f), COUNT(DISTINCT f) FROM (SELECT CAST(MAX(price) AS
          DECIMAL(10, 2)) AS f, bidder AS category FROM bids GROUP BY auction, bidder) Q GROUP BY category;""")
    chain.feed(changes(("+I", (Decimal("0.10"), 1)), ("+I", (Decimal("0.20"), 1)), ("+I", (Decimal("0.20"), 1)),
                       ("-D", (Decimal("0.20"), 1)), ("-D", (Decimal("0.20"), 1))))
    assert printed(capsys) == [
        "+I[1, 0.1, 0.1, 1]",
        "-U[1, 0.1, 0.1, 1]", "+U[1, 0.2, 0.3, 2]",
        "-U[1, 0.2, 0.3, 2]", "+U[1, 0.2, 0.5, 2]",
        "-U[1, 0.2, 0.5, 2]", "+U[1, 0.2, 0.3, 2]",
        "-U[1, 0.2, 0.3, 2]", "+U[1, 0.1, 0.1, 1]",  # exact: 0.1 again, not 0.1000000000000000055...
    ]


def nexmark_plan(name: str) -> str:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
    from nexmark.queries import QUERIES

    columns, key, select = QUERIES[name]
    tables = (Path(__file__).resolve().parents[2] / "scripts" / "nexmark" / "tables.sql").read_text()
    job = Job(name)
    job.sql(tables.replace("{dir}", "nx") + f"CREATE TABLE out1 ({columns}, PRIMARY KEY ({key}) NOT ENFORCED) "
            "WITH ('connector' = 'filesystem', 'path' = 'o', 'format' = 'json');\n"
            f"INSERT INTO out1 {select};")
    return explain(session_of(job))


def test_nexmark_q4_and_q6_plan_an_aggregation_over_an_updating_aggregation_and_top_n() -> None:
    q4 = [line.strip() for line in nexmark_plan("q4").splitlines() if "changelog=" in line]
    assert [line.split("(")[0].lstrip("+- ") + " " + line.split("changelog=")[1].split()[0] for line in q4] == [
        "Sink [I,UB,UA,D]", "Calc [I,UB,UA,D]", "GroupAggregate [I,UB,UA,D]", "Calc [I,UB,UA]",
        "GroupAggregate [I,UB,UA]", "Join [I]", "TableSourceScan [I]", "TableSourceScan [I]"]
    q6 = nexmark_plan("q6")
    assert "Rank(partitionBy=[seller], orderBy=[expires DESC, id DESC], rankRange=[1..10], outputRank=[true])  " \
           "changelog=[I,D]" in q6
    assert "GroupAggregate(groupBy=[seller], select=[AVG(final)])  changelog=[I,UB,UA,D]" in q6


@pytest.mark.parametrize("how", ["JOIN", "LEFT JOIN"])
def test_a_regular_join_of_an_updating_input_retracts_what_a_retracted_row_joined(how: str, capsys: Any) -> None:
    chain = SqlTailChain(BIDS + print_table("a BIGINT, m BIGINT, bidder BIGINT") + f"""
        INSERT INTO out1 SELECT a.auction, m, b.bidder FROM (SELECT auction, MAX(price) AS m FROM bids
          GROUP BY auction) a {how} bids b ON a.auction = b.auction;""")
    outer = how == "LEFT JOIN"
    chain.feed(changes(("+I", (1, 10))), 0)
    assert printed(capsys) == (["+I[1, 10, <NULL>]"] if outer else [])
    chain.feed([(1, (1, 7, 5, 1))], 1)  # a bid of auction 1 by bidder 7
    assert printed(capsys) == (["-D[1, 10, <NULL>]"] if outer else []) + ["+I[1, 10, 7]"]
    chain.feed(changes(("-U", (1, 10)), ("+U", (1, 20))), 0)  # the MAX of auction 1 went up
    assert printed(capsys) == ["-D[1, 10, 7]", "+I[1, 20, 7]"]
    chain.feed([(2, (1, 8, 3, 2))], 1)
    assert printed(capsys) == ["+I[1, 20, 8]"]
    chain.feed(changes(("-D", (1, 20)), ("-D", (9, 9))), 0)  # gone; a row never seen retracts nothing
    assert printed(capsys) == ["-D[1, 20, 7]", "-D[1, 20, 8]"]
    chain.feed(changes(("+I", (2, 5)), ("-U", (2, 5)), ("+U", (2, 6))), 0)  # no bids of auction 2
    assert printed(capsys) == (["+I[2, 5, <NULL>]", "-D[2, 5, <NULL>]", "+I[2, 6, <NULL>]"] if outer else [])



@pytest.mark.parametrize("how", ["inner", "left", "right", "full"])
def test_a_join_of_two_changelogs_leaves_the_join_of_what_each_side_leaves(how: str) -> None:
    """Random inserts and retractions on both sides, keys 0-2: applying the join's +I/-D output gives exactly the
    join (SQL semantics, NULL-padded rows of the outer sides) of the rows each side holds at the end."""
    import random
    from collections import Counter

    from runtime.sql.operators import RegularJoinFunction
    from tests.support.co_harness import KeyedCoHarness

    rng = random.Random(how)
    for _ in range(40):
        fn = RegularJoinFunction(how, 2, 2, condition=lambda r: r[1] != r[3],  # ON l.k = r.k AND l.v <> r.v
                                 updating_left=True, updating_right=True)
        harness = KeyedCoHarness(fn, (lambda e: e[1][0], lambda e: e[1][0]))
        held: list[Counter[tuple[int, int]]] = [Counter(), Counter()]
        for _ in range(rng.randint(1, 30)):
            side = rng.randint(0, 1)
            if +held[side] and rng.random() < 0.4:
                row = rng.choice(sorted(held[side].elements()))
                held[side][row] -= 1
                kind = rng.choice(("-U", "-D"))
            else:
                row = (rng.randint(0, 2), rng.randint(0, 2))
                held[side][row] += 1
                kind = rng.choice(("+I", "+U"))
            harness.record(side, (kind, row), 0)
        applied: Counter[tuple[Any, ...]] = Counter()
        for _, (kind, row) in harness.out:
            applied[row] += 1 if kind == "+I" else -1
            assert applied[row] >= 0, f"{kind}{row} retracts a row not emitted"
        left, right = list(held[0].elements()), list(held[1].elements())
        want: Counter[tuple[Any, ...]] = Counter((*a, *b) for a in left for b in right if a[0] == b[0] and a[1] != b[1])
        if how in ("left", "full"):
            want.update((*a, None, None) for a in left if not any(a[0] == b[0] and a[1] != b[1] for b in right))
        if how in ("right", "full"):
            want.update((None, None, *b) for b in right if not any(a[0] == b[0] and a[1] != b[1] for a in left))
        assert +applied == want, (how, held)
