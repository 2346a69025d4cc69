"""The event-time temporal join (runtime/sql/temporal_join.py): `JOIN rates FOR SYSTEM_TIME AS OF o.t` against a
versioned table, planned from SQL and run through a real chain: each order joins the rate valid at its time
once the watermark passes it, versions arriving late or out of order, LEFT misses, the state left behind."""

from __future__ import annotations

from bisect import bisect_right
from typing import Any

import pytest

pytest.importorskip("sqlglot")

from runtime.api import Job  # noqa: E402
from runtime.sql.errors import SqlError  # noqa: E402
from tests.support.sql_chain import SqlTailChain  # noqa: E402

TABLES = """
CREATE TABLE orders (id BIGINT, currency STRING, amount BIGINT, t TIMESTAMP(3),
  WATERMARK FOR t AS t - INTERVAL '1' SECOND) WITH ('connector' = 'datagen');
CREATE TABLE rates (currency STRING, rate BIGINT, t TIMESTAMP(3), PRIMARY KEY (currency) NOT ENFORCED,
  WATERMARK FOR t AS t - INTERVAL '1' SECOND) WITH ('connector' = 'datagen');
CREATE TABLE out1 (id BIGINT, currency STRING, rate BIGINT, total BIGINT) WITH ('connector' = 'print');
"""


def join_sql(how: str, rates: str = "rates") -> str:
    return f"""INSERT INTO out1 SELECT o.id, o.currency, r.rate, o.amount * r.rate
        FROM orders AS o {how} JOIN {rates} FOR SYSTEM_TIME AS OF o.t AS r ON o.currency = r.currency;"""


def expected(orders: list[tuple[Any, ...]], versions: list[tuple[Any, ...]], *, left: bool) -> list[str]:
    """The join computed directly: each order with the rate of its currency's latest version at or before its
    time among `versions` (those still there when the order is emitted)."""
    out = []
    for oid, cur, amount, t in orders:
        mine = sorted((vt, rate) for c, rate, vt in versions if c == cur)
        i = bisect_right([vt for vt, _ in mine], t) - 1
        if i >= 0:
            rate = mine[i][1]
            out.append(f"+I[{oid}, {cur}, {rate}, {amount * rate}]")
        elif left:
            out.append(f"+I[{oid}, {cur}, <NULL>, <NULL>]")
    return out


def state_sizes(chain: SqlTailChain) -> tuple[int, int]:
    """(orders waiting, versions kept) over every key of the join's keyed state."""
    (state,) = [s for s in chain.chain.keyed_state.values() if "temporal:versions" in s]
    return (sum(len(m) for m in state.get("temporal:left", {}).values()),
            sum(len(m) for m in state["temporal:versions"].values()))


@pytest.mark.parametrize("how", ["", "LEFT"])
def test_each_order_joins_the_version_valid_at_its_time_once_the_watermark_passes(how: str, capsys: Any) -> None:
    left = how == "LEFT"
    chain = SqlTailChain(TABLES + join_sql(how))
    versions = [("EUR", 10, 1000), ("EUR", 20, 5000), ("USD", 7, 3000)]
    chain.feed([(v[2], v) for v in versions], 1)
    orders = [(1, "EUR", 2, 500), (2, "EUR", 3, 1000), (3, "EUR", 5, 4999), (4, "EUR", 7, 5000),
              (5, "USD", 11, 2000), (6, "GBP", 13, 3000), (7, "USD", 17, 3000)]
    chain.feed([(o[3], o) for o in orders], 0)
    chain.watermark(4000)
    first = sorted(capsys.readouterr().out.splitlines())
    due = [o for o in orders if o[3] <= 4000]
    assert first == sorted(expected(due, versions, left=left))
    # a version after the order at 4.999 s arrived but before the watermark passed it: the order takes it
    versions.append(("EUR", 15, 4500))
    chain.feed([(4500, ("EUR", 15, 4500))], 1)
    chain.watermark(6000)
    second = capsys.readouterr().out.splitlines()
    rest = [o for o in orders if o[3] > 4000]
    assert second == expected(rest, versions, left=left)  # one key's orders in rowtime order
    assert "+I[3, EUR, 15, 75]" in second and "+I[4, EUR, 20, 140]" in second
    # the watermark at 6 s: no order waits; per key only the version valid at 6 s is kept (EUR 20, USD 7)
    assert state_sizes(chain) == (0, 2)


def test_late_versions_and_late_orders_join_what_the_watermark_left(capsys: Any) -> None:
    chain = SqlTailChain(TABLES + join_sql("LEFT"))
    chain.feed([(1000, ("EUR", 10, 1000)), (5000, ("EUR", 20, 5000))], 1)
    chain.watermark(6000)  # EUR at 1 s is dropped: the 5 s one is valid at the watermark
    assert state_sizes(chain) == (0, 1)
    # a version out of order (3 s, after 5 s) and an order behind the watermark (2 s): Flink's answers, the
    # 3 s version valid for the late order; the 1 s one is gone, so an order at 1.5 s misses
    chain.feed([(3000, ("EUR", 30, 3000))], 1)
    chain.feed([(2000, (1, "EUR", 2, 2000)), (3500, (2, "EUR", 3, 3500)), (1500, (3, "EUR", 5, 1500)),
                (7000, (4, "EUR", 7, 7000))], 0)
    chain.watermark(8000)
    assert capsys.readouterr().out.splitlines() == ["+I[3, EUR, <NULL>, <NULL>]", "+I[1, EUR, <NULL>, <NULL>]",
                                                    "+I[2, EUR, 30, 90]", "+I[4, EUR, 20, 140]"]
    assert state_sizes(chain) == (0, 1)
    # a late version the watermark passes before any order wants it is dropped at once (5 s is valid at 9 s): a
    # late order after it misses, as in Flink, whose cleanup is also up to the watermark
    chain.feed([(4000, ("EUR", 44, 4000))], 1)
    chain.watermark(9000)
    chain.feed([(4500, (5, "EUR", 1, 4500))], 0)
    chain.watermark(10_000)
    assert capsys.readouterr().out.splitlines() == ["+I[5, EUR, <NULL>, <NULL>]"]


def test_state_stays_bounded_as_versions_and_orders_stream_by(capsys: Any) -> None:
    chain = SqlTailChain(TABLES + join_sql(""))
    sizes = []
    for second in range(1, 200):
        t = second * 1000
        chain.feed([(t, ("EUR", second, t)), (t + 1, ("USD", second, t + 1))], 1)
        chain.feed([(t + 500, (second, "EUR", 1, t + 500))], 0)
        chain.watermark(t - 1000)
        sizes.append(state_sizes(chain))
    out = capsys.readouterr().out.splitlines()
    assert out == [f"+I[{s}, EUR, {s}, {s}]" for s in range(1, 198)]
    # at the watermark (s-1) s: the orders at (s-1).5 s and s.5 s wait; EUR keeps its versions at s-1 (valid
    # at the watermark) and s; USD (at s'+1 ms) its versions at s-2 (valid), s-1 and s
    assert sizes[2:] == [(2, 5)] * (len(sizes) - 2)


def test_a_deduplicating_view_is_a_versioned_table(capsys: Any) -> None:
    view = """CREATE VIEW latest_rates AS SELECT currency, rate, t FROM (SELECT *, ROW_NUMBER() OVER
        (PARTITION BY currency ORDER BY t DESC) AS rn FROM rates) WHERE rn = 1;"""
    chain = SqlTailChain(TABLES + view + join_sql("LEFT", "latest_rates"))
    # the deduplication's changelog: a newer row per key retracts the one before (-D), which is no deletion here
    chain.feed([(1000, ("+I", ("EUR", 10, 1000))), (3000, ("-D", ("EUR", 10, 1000))),
                (3000, ("+I", ("EUR", 20, 3000)))], 1)
    chain.feed([(2000, (1, "EUR", 2, 2000)), (4000, (2, "EUR", 3, 4000)), (500, (3, "EUR", 5, 500))], 0)
    chain.watermark(5000)
    assert capsys.readouterr().out.splitlines() == ["+I[3, EUR, <NULL>, <NULL>]", "+I[1, EUR, 10, 20]",
                                                    "+I[2, EUR, 20, 60]"]


@pytest.mark.parametrize(("query", "message"), [
    ("SELECT o.id, o.currency, r.rate, o.amount FROM orders AS o JOIN plain FOR SYSTEM_TIME AS OF o.t AS r "
     "ON o.currency = r.currency", "plain is not a versioned table: an event-time temporal join needs a PRIMARY KEY"),
    ("SELECT o.id, o.currency, r.rate, o.amount FROM orders AS o JOIN rates FOR SYSTEM_TIME AS OF o.t AS r "
     "ON o.amount = r.rate", "primary key [currency] must be in the join's equalities"),
    ("SELECT o.id, o.currency, r.rate, o.amount FROM orders AS o FULL JOIN rates FOR SYSTEM_TIME AS OF o.t AS r "
     "ON o.currency = r.currency", "a temporal join is INNER or LEFT, not FULL"),
])
def test_temporal_joins_that_cannot_be_planned_say_why(query: str, message: str) -> None:
    plain = """CREATE TABLE plain (currency STRING, rate BIGINT, t TIMESTAMP(3),
        WATERMARK FOR t AS t - INTERVAL '1' SECOND) WITH ('connector' = 'datagen');"""
    with pytest.raises(SqlError, match=message.replace("[", r"\[").replace("]", r"\]")):
        Job("refused").sql(TABLES + plain + f"INSERT INTO out1 {query};")


def test_a_restore_from_the_keyed_state_continues_as_if_uninterrupted(capsys: Any) -> None:
    import copy

    def first_half(chain: SqlTailChain) -> None:
        chain.feed([(1000, ("EUR", 10, 1000)), (4000, ("EUR", 40, 4000))], 1)
        chain.feed([(2000, (1, "EUR", 2, 2000)), (4500, (2, "EUR", 3, 4500))], 0)
        chain.watermark(3000)

    def second_half(chain: SqlTailChain) -> None:
        chain.feed([(4200, ("EUR", 42, 4200))], 1)  # after the order at 4.5 s, before the watermark passes it
        chain.watermark(9000)

    whole = SqlTailChain(TABLES + join_sql("LEFT"))
    first_half(whole)
    second_half(whole)
    uninterrupted = capsys.readouterr().out.splitlines()
    assert uninterrupted == ["+I[1, EUR, 10, 20]", "+I[2, EUR, 42, 126]"]

    before = SqlTailChain(TABLES + join_sql("LEFT"))
    first_half(before)
    snapshot = copy.deepcopy(before.chain.keyed_state)  # what a checkpoint takes: the join's tables and timers
    emitted = capsys.readouterr().out.splitlines()
    after = SqlTailChain(TABLES + join_sql("LEFT"))
    after.chain.restore_state(snapshot, None)
    second_half(after)
    assert emitted + capsys.readouterr().out.splitlines() == uninterrupted



def test_a_rescale_moves_each_keys_orders_versions_and_timers_with_it(capsys: Any) -> None:
    import copy

    from runtime.graph.partitioning import key_group, subtask_for_key_group

    versions = [("EUR", 10, 1000), ("USD", 5, 1000), ("JPY", 1, 1000), ("EUR", 40, 4000), ("USD", 50, 4200)]
    orders = [(1, "EUR", 2, 2000), (2, "USD", 3, 4500), (3, "JPY", 5, 4600), (4, "EUR", 7, 4100)]
    later_versions = [("USD", 45, 4400), ("JPY", 2, 4550)]  # between the orders and the watermark passing them
    before = SqlTailChain(TABLES + join_sql("LEFT"))
    before.feed([(v[2], v) for v in versions], 1)
    before.feed([(o[3], o) for o in orders], 0)
    before.watermark(3000)
    emitted = capsys.readouterr().out.splitlines()
    assert emitted == ["+I[1, EUR, 10, 20]"]
    snapshot = copy.deepcopy(before.chain.keyed_state)
    # the snapshot restored at parallelism 2: each subtask takes the keys of its key groups, as a restore does
    owner = {c: subtask_for_key_group(key_group(c, before.job.max_parallelism), before.job.max_parallelism, 2)
             for c in ("EUR", "USD", "JPY")}
    assert len(set(owner.values())) == 2, "the keys spread over both subtasks"
    for subtask in (0, 1):
        after = SqlTailChain(TABLES + join_sql("LEFT"), subtask_index=subtask, parallelism=2)
        after.chain.restore_state({node: {name: {k: v for k, v in table.items() if owner[k] == subtask}
                                          for name, table in tables.items()}
                                   for node, tables in snapshot.items()}, None)
        after.feed([(v[2], v) for v in later_versions if owner[v[0]] == subtask], 1)
        after.watermark(9000)
        # the print table prefixes a subtask's lines with its number at parallelism 2 ("1> +I[...]")
        emitted += [line.split("> ", 1)[-1] for line in capsys.readouterr().out.splitlines()]
    assert sorted(emitted) == sorted(expected(orders, versions + later_versions, left=True))
