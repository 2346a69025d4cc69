"""INTERSECT and EXCEPT [ALL] in SQL (runtime/sql/set_operations.py): planned from SQL, run through a real chain,
the changelog applied and compared with the multiset arithmetic of each operation; and with -U/-D arriving from
an updating side."""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import pytest

pytest.importorskip("sqlglot")

from runtime.sql.set_operations import multiplicity  # noqa: E402
from tests.support.sql_chain import SqlTailChain  # noqa: E402

TABLES = """
CREATE TABLE a (k BIGINT, v STRING) WITH ('connector' = 'datagen');
CREATE TABLE b (k BIGINT, v STRING) WITH ('connector' = 'datagen');
CREATE TABLE out1 (k BIGINT, v STRING) WITH ('connector' = 'print');
"""


def applied(lines: list[str]) -> Counter[str]:
    """The rows a changelog of +I and -D lines leaves."""
    rows: Counter[str] = Counter()
    for line in lines:
        kind, row = line[:2], line[2:]
        assert kind in ("+I", "-D"), line
        rows[row] += 1 if kind == "+I" else -1
        assert rows[row] >= 0, f"{line} retracts a row not emitted"
    return +rows


@pytest.mark.parametrize(("operation", "combine"), [
    ("INTERSECT", lambda a, b: Counter(dict.fromkeys(set(a) & set(b), 1))),
    ("INTERSECT ALL", lambda a, b: a & b),
    ("EXCEPT", lambda a, b: Counter(dict.fromkeys(set(a) - set(b), 1))),
    ("EXCEPT ALL", lambda a, b: a - b),
])
def test_set_operations_leave_the_multiset_arithmetic_of_their_inputs(operation: str, combine: Any,
                                                                       capsys: Any) -> None:
    chain = SqlTailChain(TABLES + f"INSERT INTO out1 SELECT k, v FROM a {operation} SELECT k, v FROM b;")
    rng = random.Random(3)
    left = [(rng.randint(0, 5), rng.choice("xy")) for _ in range(60)]
    right = [(rng.randint(0, 5), rng.choice("xy")) for _ in range(40)]
    arrivals = [(True, r) for r in left] + [(False, r) for r in right]
    rng.shuffle(arrivals)
    for from_left, row in arrivals:
        chain.feed([(from_left, 1, row)])
    result = applied(capsys.readouterr().out.splitlines())
    want = combine(Counter(f"[{k}, {v}]" for k, v in left), Counter(f"[{k}, {v}]" for k, v in right))
    assert result == want


def test_a_retraction_on_either_side_changes_the_result_back(capsys: Any) -> None:
    chain = SqlTailChain(TABLES + "INSERT INTO out1 SELECT k, v FROM a EXCEPT SELECT k, v FROM b;")
    chain.feed([(True, 1, (1, "x")), (True, 1, (1, "x")), (False, 1, (1, "x")),
                (False, -1, (1, "x")), (True, -1, (1, "x")), (True, -1, (1, "x"))])
    assert capsys.readouterr().out.splitlines() == ["+I[1, x]", "-D[1, x]", "+I[1, x]", "-D[1, x]"]


def test_multiplicity_is_each_operations_rule() -> None:
    table = {(lc, rc): [multiplicity(k, e, lc, rc) for k, e in [("INTERSECT", False), ("INTERSECT", True),
                                                              ("EXCEPT", False), ("EXCEPT", True)]]
             for lc in range(3) for rc in range(3)}
    assert table[(0, 2)] == [0, 0, 0, 0]
    assert table[(2, 0)] == [0, 0, 1, 2]
    assert table[(2, 1)] == [1, 1, 0, 1]
    assert table[(1, 2)] == [1, 1, 0, 0]
    assert table[(2, 2)] == [1, 2, 0, 0]


def test_order_by_limit_keeps_the_first_n_rows_of_the_whole_stream(capsys: Any) -> None:
    chain = SqlTailChain(TABLES + "INSERT INTO out1 SELECT k, v FROM a ORDER BY k DESC, v LIMIT 3;")
    rng = random.Random(4)
    rows = [(rng.randint(0, 50), rng.choice("xyz")) for _ in range(80)]
    log: list[str] = []
    for i, row in enumerate(rows):  # after each row, the changelog so far leaves that prefix's top 3
        chain.feed([row])
        log += capsys.readouterr().out.splitlines()
        want = sorted(rows[:i + 1], key=lambda r: (-r[0], r[1]))[:3]
        assert applied(log) == Counter(f"[{k}, {v}]" for k, v in want)


def test_order_by_the_rowtime_emits_rows_in_time_order_as_the_watermark_passes_them(capsys: Any) -> None:
    chain = SqlTailChain("""CREATE TABLE e (id BIGINT, t TIMESTAMP(3), WATERMARK FOR t AS t - INTERVAL '1' SECOND)
        WITH ('connector' = 'datagen');
        CREATE TABLE out1 (id BIGINT, t TIMESTAMP(3)) WITH ('connector' = 'print');
        INSERT INTO out1 SELECT id, t FROM e ORDER BY t, id DESC;""")
    chain.feed([(3000, (1, 3000)), (1000, (2, 1000)), (3000, (3, 3000)), (2000, (4, 2000))])
    chain.watermark(2000)
    chain.feed([(1500, (5, 1500)), (2500, (6, 2500))])  # 1.5 s is behind the watermark: late, dropped
    chain.watermark(5000)
    ids = [line.split(",")[0] for line in capsys.readouterr().out.splitlines()]
    assert ids == ["+I[2", "+I[4", "+I[6", "+I[3", "+I[1"]


def test_order_by_anything_but_the_rowtime_first_needs_a_limit() -> None:
    from runtime.api import Job
    from runtime.sql.errors import SqlError

    with pytest.raises(SqlError, match="must start with the rowtime attribute ascending"):
        Job("refused").sql(TABLES + "INSERT INTO out1 SELECT k, v FROM a ORDER BY k;")


def test_limit_without_order_by_keeps_the_first_n_rows_to_arrive(capsys: Any) -> None:
    chain = SqlTailChain(TABLES + "INSERT INTO out1 SELECT k, v FROM a LIMIT 3;")
    assert "Limit(offset=[0], fetch=[3])" in " ".join(chain.names), chain.names
    for row in [(5, "x"), (2, "y"), (5, "x"), (9, "z"), (1, "late")]:
        chain.feed([row])
    # insert-only in, insert-only out: the first three rows, in arrival order (a repeated row too), nothing more
    assert capsys.readouterr().out.splitlines() == ["+I[5, x]", "+I[2, y]", "+I[5, x]"]


def test_limit_over_an_updating_query_keeps_n_current_rows(capsys: Any) -> None:
    from runtime.sql.changelog import INSERT, UPDATE_AFTER, UPDATE_BEFORE

    chain = SqlTailChain(TABLES.replace("out1 (k BIGINT, v STRING)", "out1 (k BIGINT, c BIGINT)")
                         + "INSERT INTO out1 SELECT k, COUNT(*) FROM a GROUP BY k LIMIT 2;")
    rng = random.Random(9)
    counts: Counter[int] = Counter()
    log: list[str] = []
    for _ in range(60):  # the aggregation's changelog, as its task sends it
        k = rng.randint(1, 4)
        if counts[k]:
            chain.feed([(UPDATE_BEFORE, (k, counts[k]))])
            counts[k] += 1
            chain.feed([(UPDATE_AFTER, (k, counts[k]))])
        else:
            counts[k] = 1
            chain.feed([(INSERT, (k, 1))])
        log += capsys.readouterr().out.splitlines()
        shown = applied(log)
        # two rows (or as many keys as there are), each a key's current count
        assert sum(shown.values()) == min(2, len(counts)), shown
        keys = [int(row[1:].split(",")[0]) for row in shown]
        assert all(f"[{k}, {counts[k]}]" in shown for k in keys), (shown, counts)


def test_limit_with_offset_skips_the_first_m_rows_to_arrive(capsys: Any) -> None:
    """Flink's streaming Limit with an offset (rank range m+1..m+n, no order): rows m+1..m+n in arrival order."""
    chain = SqlTailChain(TABLES + "INSERT INTO out1 SELECT k, v FROM a LIMIT 2 OFFSET 3;")
    assert "Limit(offset=[3], fetch=[2])" in " ".join(chain.names), chain.names
    for row in [(1, "a"), (2, "b"), (3, "c"), (4, "d"), (5, "e"), (6, "f")]:
        chain.feed([row])
    assert capsys.readouterr().out.splitlines() == ["+I[4, d]", "+I[5, e]"]


def test_order_by_limit_offset_keeps_ranks_m_plus_1_to_m_plus_n_as_rows_come_and_go(capsys: Any) -> None:
    """ORDER BY v LIMIT 2 OFFSET 1 (and the FETCH spelling): the rows ranked 2 and 3 at every moment; a row
    entering above them pushes one in from above and one out below, as Flink's Top-N with a rank range does."""
    from runtime.sql.changelog import DELETE, INSERT

    for tail in ("LIMIT 2 OFFSET 1", "OFFSET 1 ROWS FETCH FIRST 2 ROWS ONLY"):
        chain = SqlTailChain(TABLES + f"INSERT INTO out1 SELECT k, v FROM a ORDER BY k DESC, v {tail};")
        assert "rankRange=[2..3]" in " ".join(chain.names), chain.names
        rng = random.Random(4)
        rows: list[tuple[int, str]] = []
        log: list[str] = []
        for i in range(40):
            row = (rng.randint(1, 9), f"r{i}")
            rows.append(row)
            chain.feed([row])
            log += capsys.readouterr().out.splitlines()
            ranked = sorted(rows, key=lambda r: (-r[0], r[1]))
            assert applied(log) == Counter(f"[{k}, {v}]" for k, v in ranked[1:3]), (i, ranked[:4])

    # over an updating input: a retracted row lets the ones below it move up into ranks 2..3
    chain = SqlTailChain(TABLES.replace("out1 (k BIGINT, v STRING)", "out1 (k BIGINT, c BIGINT)")
                         + "INSERT INTO out1 SELECT k, COUNT(*) AS c FROM a GROUP BY k ORDER BY k LIMIT 2 OFFSET 1;")
    for change in [(INSERT, (1, 1)), (INSERT, (2, 1)), (INSERT, (3, 1)), (INSERT, (4, 1)), (DELETE, (1, 1))]:
        chain.feed([change])
    assert capsys.readouterr().out.splitlines() == ["+I[2, 1]", "+I[3, 1]", "-D[2, 1]", "+I[4, 1]"]


def test_limit_refuses_offset_alone_and_what_is_not_a_literal() -> None:
    from runtime.api import Job
    from runtime.sql.errors import SqlError

    with pytest.raises(SqlError, match="OFFSET without LIMIT .* is not supported yet"):
        Job("refused").sql(TABLES + "INSERT INTO out1 SELECT k, v FROM a OFFSET 1;")
    with pytest.raises(SqlError, match="LIMIT 0: a positive integer literal is supported"):
        Job("refused").sql(TABLES + "INSERT INTO out1 SELECT k, v FROM a LIMIT 0;")
    with pytest.raises(SqlError, match="OFFSET k: a non-negative integer literal is supported"):
        Job("refused").sql(TABLES + "INSERT INTO out1 SELECT k, v FROM a ORDER BY k LIMIT 1 OFFSET k;")
