"""PostgreSQL tables in SQL (runtime/sql/postgres_tables.py): jdbc tables planned onto PostgresSink (upsert with a
key, append without; a changelog's -D a delete by key), postgres-cdc tables onto PostgresCdcSource as a changelog,
the lookup join's plan, its PARTIAL cache and its rows, and every refusal in one line."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pytest

pytest.importorskip("sqlglot")

from runtime.api import Job  # noqa: E402
from runtime.api.async_io import AsyncMap  # noqa: E402
from runtime.connectors.postgres_sink import Deleted, net_changes  # noqa: E402
from runtime.sql.errors import SqlError  # noqa: E402
from runtime.sql.explain import explain  # noqa: E402
from runtime.sql.postgres_tables import (  # noqa: E402
    CdcTableSource,
    FullCache,
    JdbcSink,
    LookupCache,
    LookupFunction,
    LookupSettings,
    changelog_rows,
    duration_ms,
    join_rows,
)
from runtime.sql.session import session_of  # noqa: E402
from runtime.sql.types import STRING, reader  # noqa: E402

URL = "jdbc:postgresql://db.local:6543/shop"
ORDERS = """
CREATE TABLE orders (id BIGINT, customer BIGINT, amount BIGINT, proc_time AS PROCTIME())
  WITH ('connector' = 'datagen', 'number-of-rows' = '10');
"""
CUSTOMERS = """
CREATE TABLE customers (id BIGINT, region STRING, PRIMARY KEY (id) NOT ENFORCED)
  WITH ('connector' = 'jdbc', 'url' = '{url}', 'table-name' = 'customers', 'username' = 'app',
        'password' = 'pw'{extra});
"""
TOTALS = """
CREATE TABLE totals (region STRING, total BIGINT{key})
  WITH ('connector' = 'jdbc', 'url' = '{url}', 'table-name' = 'crm.totals', 'username' = 'app'{extra});
"""
LOOKUP = """
INSERT INTO totals SELECT c.region, o.amount FROM orders AS o
  {join} customers FOR SYSTEM_TIME AS OF o.proc_time AS c ON o.customer = c.id{rest};
"""


def plan(text: str) -> Job:
    job = Job("q")
    job.sql(text)
    return job


def refusal(info: Any) -> str:
    """The one line of a refusal, without the statement's position before it."""
    text = str(info.value)
    assert "\n" not in text
    return re.sub(r"^line \d+, column \d+: ", "", text)


def sink_of(job: Job) -> Any:
    return next(n.payload for n in job.nodes if n.kind == "sink")


def test_an_updating_query_into_a_jdbc_table_with_a_key_is_the_exactly_once_upsert_sink() -> None:
    job = plan(ORDERS + TOTALS.format(key=", PRIMARY KEY (region) NOT ENFORCED", url=URL, extra="")
               + "INSERT INTO totals SELECT CAST(customer AS STRING), SUM(amount) FROM orders "
                 "GROUP BY CAST(customer AS STRING);")
    sink = sink_of(job)
    assert isinstance(sink, JdbcSink) and sink.changelog
    assert (sink.dsn, sink.table, sink.key, sink.mode, sink.delivery, sink.columns) == (
        "host=db.local port=6543 dbname=shop user=app", "crm.totals", ("region",), "upsert", "exactly-once",
        ("region", "total"))


def test_an_append_query_into_a_jdbc_table_without_a_key_appends_and_an_updating_one_is_refused() -> None:
    sink = sink_of(plan(ORDERS + TOTALS.format(key="", url=URL, extra="")
                        + "INSERT INTO totals SELECT CAST(customer AS STRING), amount FROM orders;"))
    assert isinstance(sink, JdbcSink) and (sink.mode, sink.key, sink.changelog) == ("append", (), False)
    with pytest.raises(SqlError) as info:
        plan(ORDERS + TOTALS.format(key="", url=URL, extra="")
             + "INSERT INTO totals SELECT CAST(customer AS STRING), SUM(amount) FROM orders "
               "GROUP BY CAST(customer AS STRING);")
    assert refusal(info).startswith("Table sink 'default_catalog.default_database.totals' doesn't support consuming "
                                    "update changes which is produced by node GroupAggregate")


def test_a_changelog_becomes_upserts_and_deletes_by_key_the_last_change_of_a_key_winning() -> None:
    sink = JdbcSink("dbname=x", "t", key=["k"], columns=["k", "v"], changelog=True)
    sink._rows, sink._key_positions = [], [0]
    for record in [("+I", ("a", 1)), ("+I", ("b", 1)), ("-U", ("a", 1)), ("+U", ("a", 2)), ("-D", ("b", 1)),
                   ("+I", ("c", 1)), ("-D", ("c", 1)), ("+I", ("c", 3)), ("-D", ("d", 9))]:
        sink.write(record)
    assert sink._rows == [("a", 1), ("b", 1), ("a", 2), Deleted(("b",)), ("c", 1), Deleted(("c",)), ("c", 3),
                          Deleted(("d",))]
    assert net_changes(sink._rows, [0]) == ([("a", 2), ("c", 3)], [("b",), ("d",)])


@pytest.mark.parametrize(("extra", "message"), [
    (", 'url' = 'jdbc:mysql://h:3306/db'", "table totals: 'url' must be jdbc:postgresql://host:port/database (PostgreSQL is the one JDBC database of Sluice SQL), got 'jdbc:mysql://h:3306/db'"),  # noqa: E501
    (", 'url' = 'jdbc:postgresql://h:5432'", "table totals: 'url' must be jdbc:postgresql://host:port/database, got 'jdbc:postgresql://h:5432'"),  # noqa: E501
    (", 'sink.buffer-flush.interval' = '1s'", "table totals: option 'sink.buffer-flush.interval' is not supported by the 'jdbc' connector"),  # noqa: E501
    (", 'sink.delivery-guarantee' = 'none'", "table totals: 'sink.delivery-guarantee' must be exactly-once or at-least-once, got 'none'"),  # noqa: E501
])
def test_bad_jdbc_options_are_one_line_naming_table_and_option(extra: str, message: str) -> None:
    text = TOTALS.format(key="", url=URL, extra="").replace(f"'url' = '{URL}', ", "") if "'url'" in extra else \
        TOTALS.format(key="", url=URL, extra="")
    text = text.replace(")\n  WITH (", ")\n  WITH (").replace("'username' = 'app')", f"'username' = 'app'{extra})")
    with pytest.raises(SqlError) as info:
        plan(ORDERS + text + "INSERT INTO totals SELECT CAST(customer AS STRING), amount FROM orders;")
    assert refusal(info).startswith(message)


def test_the_lookup_join_plans_onto_async_io_with_flinks_cache_and_retry_options() -> None:
    extra = (", 'lookup.cache' = 'PARTIAL', 'lookup.partial-cache.max-rows' = '500', "
             "'lookup.partial-cache.expire-after-write' = '10 s', 'lookup.max-retries' = '5'")
    job = plan(ORDERS + CUSTOMERS.format(url=URL, extra=extra) + TOTALS.format(key="", url=URL, extra="")
               + LOOKUP.format(join="LEFT JOIN", rest=""))
    assert [n.kind for n in job.nodes] == ["source", "async_map", "flat_map", "map", "sink"]
    async_map = next(n.payload for n in job.nodes if n.kind == "async_map")
    assert isinstance(async_map, AsyncMap) and isinstance(async_map.fn, LookupFunction)
    lookup = async_map.fn
    assert (async_map.capacity, async_map.ordered, async_map.retry.max_attempts) == (10, True, 6)
    assert lookup.settings == LookupSettings(cache_rows=500, expire_after_write_ms=10_000, max_retries=5)
    assert (lookup.dsn, lookup.table_name, lookup.columns, lookup.key_columns, lookup.left) == (
        "host=db.local port=6543 dbname=shop user=app password=pw", "customers", ["id", "region"], ["id"], True)
    assert lookup.key_fn((7, 42, 3, 0)) == (42,)
    text = explain(session_of(job))
    assert ("LookupJoin(table=[default_catalog.default_database.customers], joinType=[LeftOuterJoin], "
            "lookup=[id=o.customer])  changelog=[I]") in text
    assert "keys id, state the lookups in flight, cache: 500 rows" in text


def test_a_lookup_joins_function_names_its_extra_and_is_checked_at_submit() -> None:
    from runtime.graph.admission import needed_extras

    job = plan(ORDERS + CUSTOMERS.format(url=URL, extra="") + TOTALS.format(key="", url=URL, extra="")
               + LOOKUP.format(join="JOIN", rest=""))
    assert needed_extras(job) == {"postgres"}
    assert callable(next(n.payload for n in job.nodes if n.kind == "async_map").fn.check_at_submit)


def test_an_inner_lookup_join_keeps_the_rest_of_on_as_a_filter_of_the_joined_rows() -> None:
    job = plan(ORDERS + CUSTOMERS.format(url=URL, extra="") + TOTALS.format(key="", url=URL, extra="")
               + LOOKUP.format(join="JOIN", rest=" AND c.region <> 'north'"))
    lookup = next(n.payload for n in job.nodes if n.kind == "async_map").fn
    assert lookup.left is False and lookup.settings == LookupSettings()
    assert lookup.filter_fn is not None
    assert lookup.filter_fn((1, 2, 3, 0, 2, "south")) and not lookup.filter_fn((1, 2, 3, 0, 2, "north"))


@pytest.mark.parametrize(("query", "extra", "message"), [
    (LOOKUP.format(join="JOIN", rest="").replace("o.proc_time", "o.amount"), "",
     "JOIN customers FOR SYSTEM_TIME AS OF o.amount: neither the left side's rowtime (a temporal join on event "
     "time) nor a processing-time attribute"),
    (LOOKUP.format(join="FULL JOIN", rest=""), "",
     "JOIN customers FOR SYSTEM_TIME AS OF: a lookup join is INNER or LEFT, not FULL"),
    (LOOKUP.format(join="JOIN", rest="").replace("o.customer = c.id", "o.customer > c.id"), "",
     "JOIN customers FOR SYSTEM_TIME AS OF: the ON condition needs an equality between a column of customers and "
     "the left side (the lookup key)"),
    (LOOKUP.format(join="JOIN", rest=""), ", 'lookup.cache' = 'ALL'",
     "table customers: 'lookup.cache' must be NONE, PARTIAL or FULL, got 'ALL'"),
    (LOOKUP.format(join="JOIN", rest=""), ", 'lookup.cache' = 'FULL'",
     "table customers: 'lookup.cache' = 'FULL' needs 'lookup.full-cache.periodic-reload.interval' ('10 min')"),
    (LOOKUP.format(join="JOIN", rest=""), ", 'lookup.cache' = 'FULL', 'lookup.full-cache.reload-strategy' = 'TIMED'",
     "table customers: 'lookup.full-cache.reload-strategy' must be PERIODIC (TIMED is not supported yet)"),
    (LOOKUP.format(join="JOIN", rest=""), ", 'lookup.cache' = 'FULL', "
     "'lookup.full-cache.periodic-reload.interval' = 'soon'",
     "table customers: 'lookup.full-cache.periodic-reload.interval' must be a positive duration"),
    (LOOKUP.format(join="JOIN", rest=""), ", 'lookup.cache' = 'FULL', "
     "'lookup.full-cache.periodic-reload.interval' = '1 min', "
     "'lookup.full-cache.periodic-reload.schedule-mode' = 'CRON'",
     "table customers: 'lookup.full-cache.periodic-reload.schedule-mode' must be FIXED_DELAY or FIXED_RATE"),
    (LOOKUP.format(join="JOIN", rest=""), ", 'lookup.cache' = 'PARTIAL'",
     "table customers: 'lookup.cache' = 'PARTIAL' needs 'lookup.partial-cache.max-rows' above 0"),
    (LOOKUP.format(join="JOIN", rest=""), ", 'lookup.max-retries' = 'many'",
     "table customers: 'lookup.max-retries' must be a whole number, got 'many'"),
    (LOOKUP.format(join="JOIN", rest=""), ", 'lookup.partial-cache.expire-after-write' = 'soon'",
     "table customers: 'lookup.partial-cache.expire-after-write' must be a duration ('10 s', '1 min'), got 'soon'"),
])
def test_lookup_joins_that_cannot_run_are_refused_in_one_line(query: str, extra: str, message: str) -> None:
    with pytest.raises(SqlError) as info:
        plan(ORDERS + CUSTOMERS.format(url=URL, extra=extra) + TOTALS.format(key="", url=URL, extra="") + query)
    assert refusal(info).startswith(message)


def test_a_lookup_join_against_a_table_that_is_not_jdbc_is_refused() -> None:
    with pytest.raises(SqlError) as info:
        plan(ORDERS + "CREATE TABLE customers (id BIGINT, region STRING) WITH ('connector' = 'datagen');"
             + TOTALS.format(key="", url=URL, extra="") + LOOKUP.format(join="JOIN", rest=""))
    assert refusal(info) == ("JOIN customers FOR SYSTEM_TIME AS OF: table customers is a 'datagen' table; a lookup "
                             "join needs a 'jdbc' table")


def test_the_partial_cache_evicts_the_least_recently_used_and_expires_after_write() -> None:
    cache = LookupCache(2, 1000)
    cache.put(("a",), [(1,)], now_ms=0)
    cache.put(("b",), [], now_ms=10)
    assert cache.get(("a",), 20) == (True, [(1,)])  # a is now the most recently used
    cache.put(("c",), [(3,)], now_ms=30)  # b goes
    assert [cache.get(k, 40)[0] for k in [("a",), ("b",), ("c",)]] == [True, False, True]
    assert cache.get(("a",), 1000) == (False, None) and len(cache) == 1  # written at 0: expired at 1000
    assert cache.get(("c",), 1029) == (True, [(3,)])


def test_the_full_cache_indexes_the_whole_table_and_is_due_again_after_its_interval() -> None:
    delay = FullCache(1000, fixed_rate=False)
    assert delay.due(0)
    delay.load([(1, "n"), (2, "s"), (1, "again")], [0], started_ms=0, finished_ms=300)
    assert (delay.get((1,)), delay.get((2,)), delay.get((9,))) == ([(1, "n"), (1, "again")], [(2, "s")], [])
    assert [delay.due(t) for t in (999, 1299, 1300)] == [False, False, True]  # fixed delay: from the load's end
    rate = FullCache(1000, fixed_rate=True)
    rate.load([], [0], started_ms=0, finished_ms=300)
    assert [rate.due(t) for t in (999, 1000)] == [False, True]  # fixed rate: from the load's start
    job = plan(ORDERS + CUSTOMERS.format(url=URL, extra=", 'lookup.cache' = 'FULL', "
                                         "'lookup.full-cache.periodic-reload.interval' = '10 min', "
                                         "'lookup.full-cache.periodic-reload.schedule-mode' = 'FIXED_RATE'")
               + TOTALS.format(key="", url=URL, extra="") + LOOKUP.format(join="LEFT JOIN", rest=""))
    lookup = next(n.payload for n in job.nodes if n.kind == "async_map").fn
    assert lookup.settings == LookupSettings(full_reload_ms=600_000, full_fixed_rate=True)
    assert "state the lookups in flight, the whole table, reloaded every 600000 ms" in explain(session_of(job))


def test_join_rows_pad_a_left_joins_miss_and_drop_an_inner_ones() -> None:
    assert join_rows((1, 2), [(2, "x"), (2, "y")], left=False, width=2) == [(1, 2, 2, "x"), (1, 2, 2, "y")]
    assert join_rows((1, 9), [], left=True, width=2) == [(1, 9, None, None)]
    assert join_rows((1, 9), [], left=False, width=2) == []
    assert [duration_ms(t) for t in ["10 s", "10s", "1 min", "250", "2h"]] == [10_000, 10_000, 60_000, 250,
                                                                              7_200_000]


def test_a_lookup_with_a_null_key_matches_nothing_without_asking_the_server() -> None:
    job = plan(ORDERS + CUSTOMERS.format(url=URL, extra="") + TOTALS.format(key="", url=URL, extra="")
               + LOOKUP.format(join="LEFT JOIN", rest=""))
    lookup = next(n.payload for n in job.nodes if n.kind == "async_map").fn
    assert asyncio.run(lookup((1, None, 5, 0))) == [(1, None, 5, 0, None, None)] and lookup.lookups == 0


def test_a_lookup_join_over_an_updating_input_looks_up_every_change_and_keeps_its_kind() -> None:
    # the largest order per customer (an updating GROUP BY) enriched with the customer's region, upserted by region
    job = plan(ORDERS + CUSTOMERS.format(url=URL, extra="") + TOTALS.format(key=", PRIMARY KEY (region) NOT "
                                                                            "ENFORCED", url=URL, extra="")
               + """INSERT INTO totals SELECT c.region, m.biggest FROM (SELECT customer, MAX(amount) AS biggest,
                    MAX(proc_time) AS proc_time FROM orders GROUP BY customer) AS m
                    LEFT JOIN customers FOR SYSTEM_TIME AS OF m.proc_time AS c ON m.customer = c.id;""")
    lookup = next(n.payload for n in job.nodes if n.kind == "async_map").fn
    assert lookup.updating
    assert asyncio.run(lookup(("-U", (None, 5, 0)))) == [("-U", (None, 5, 0, None, None))] and lookup.lookups == 0
    assert "LookupJoin(table=[default_catalog.default_database.customers], joinType=[LeftOuterJoin], " \
           "lookup=[id=m.customer])  changelog=[I,UB,UA]" in explain(session_of(job))


def test_a_postgres_cdc_table_is_a_changelog_of_the_cdc_sources_changes() -> None:
    job = plan("""
CREATE TABLE customer_changes (id BIGINT, region STRING, PRIMARY KEY (id) NOT ENFORCED)
  WITH ('connector' = 'postgres-cdc', 'hostname' = 'db.local', 'port' = '6543', 'username' = 'app',
        'password' = 'pw', 'database-name' = 'shop', 'schema-name' = 'crm', 'table-name' = 'customers',
        'slot.name' = 'flink');
CREATE TABLE per_region (region STRING, n BIGINT, PRIMARY KEY (region) NOT ENFORCED)
  WITH ('connector' = 'jdbc', 'url' = 'jdbc:postgresql://db.local:6543/shop', 'table-name' = 'per_region');
INSERT INTO per_region SELECT region, COUNT(*) FROM customer_changes GROUP BY region;
""")
    source = next(n.payload for n in job.nodes if n.kind == "source")
    assert isinstance(source, CdcTableSource)
    assert (source.dsn, source.tables, source.publication) == (
        "host=db.local port=6543 dbname=shop user=app password=pw", ("crm.customers",), "dbz_publication")
    assert "changelog=[I,UB,UA,D]" in explain(session_of(job)).split("TableSourceScan")[1].splitlines()[0]
    assert isinstance(sink_of(job), JdbcSink)


def test_cdc_changes_become_flinks_row_kinds() -> None:
    names, readers = ["id", "region"], [reader(STRING), reader(STRING)]

    def rows(change: dict[str, Any]) -> list[tuple[str, Any]]:
        return changelog_rows(change, names, readers, None)

    assert rows({"op": "r", "after": {"id": "1", "region": "n"}}) == [("+I", ("1", "n"))]
    assert rows({"op": "c", "after": {"id": "2", "region": "s"}}) == [("+I", ("2", "s"))]
    assert rows({"op": "u", "before": {"id": "1", "region": "n"}, "after": {"id": "1", "region": "e"}}) == [
        ("-U", ("1", "n")), ("+U", ("1", "e"))]
    # without REPLICA IDENTITY FULL the before image holds the key alone: an upsert, as Flink CDC gives then
    assert rows({"op": "u", "before": {"id": "1"}, "after": {"id": "1", "region": "w"}}) == [("+U", ("1", "w"))]
    assert rows({"op": "d", "before": {"id": "2", "region": "s"}}) == [("-D", ("2", "s"))]
    with pytest.raises(ValueError, match="truncate"):
        rows({"op": "t"})


@pytest.mark.parametrize(("extra", "message"), [
    ("'slot.name' = 's'", "table c: the 'postgres-cdc' connector needs the option 'hostname'"),
    ("'hostname' = 'h', 'slot.name' = 's', 'port' = 'x'", "table c: 'port' must be a number, got 'x'"),
    ("'hostname' = 'h', 'slot.name' = 's', 'decoding.plugin.name' = 'decoderbufs'",
     "table c: 'decoding.plugin.name' must be 'pgoutput', got 'decoderbufs'"),
    ("'hostname' = 'h', 'slot.name' = 's', 'scan.startup.mode' = 'latest-offset'",
     "table c: option 'scan.startup.mode' is not supported by the 'postgres-cdc' connector"),
    ("'hostname' = 'h'", "table c: the 'postgres-cdc' connector needs the option 'slot.name'"),
])
def test_bad_postgres_cdc_options_are_one_line(extra: str, message: str) -> None:
    with pytest.raises(SqlError) as info:
        plan(f"""
CREATE TABLE c (id BIGINT) WITH ('connector' = 'postgres-cdc', 'username' = 'u', 'database-name' = 'd',
  'table-name' = 't', {extra});
CREATE TABLE out (id BIGINT, n BIGINT) WITH ('connector' = 'print');
INSERT INTO out SELECT id, COUNT(*) FROM c GROUP BY id;
""")
    assert refusal(info).startswith(message)


CDC_RATES = """
CREATE TABLE rates (currency STRING, rate BIGINT, updated TIMESTAMP(3), PRIMARY KEY (currency) NOT ENFORCED,
  WATERMARK FOR updated AS updated - INTERVAL '2' SECOND)
  WITH ('connector' = 'postgres-cdc', 'hostname' = 'db.local', 'username' = 'app', 'database-name' = 'shop',
        'table-name' = 'rates', 'slot.name' = 'flink');
CREATE TABLE orders (id BIGINT, currency STRING, t TIMESTAMP(3), WATERMARK FOR t AS t)
  WITH ('connector' = 'datagen');
CREATE TABLE priced (id BIGINT, rate BIGINT) WITH ('connector' = 'print');
INSERT INTO priced SELECT o.id, r.rate FROM orders AS o
  JOIN rates FOR SYSTEM_TIME AS OF o.t AS r ON o.currency = r.currency;
"""


def test_a_watermark_on_a_postgres_cdc_table_reads_event_time_from_each_changes_row() -> None:
    """Event time over a CDC changelog, as Flink allows: the rates table is a versioned table of an event-time
    temporal join; each change's time is its row's rowtime, a delete's from its before image."""
    job = plan(CDC_RATES)
    node = next(n for n in job.nodes if n.kind == "source" and isinstance(n.payload, CdcTableSource))
    strategy = node.watermarks
    assert strategy is not None and strategy.max_delay_ms == 1999  # Flink's max - delay, as emitted max - d - 1
    assert [strategy.timestamp(c) for c in [("+I", ("EUR", 10, 1000)), ("-U", ("EUR", 10, 1000)),
                                            ("+U", ("EUR", 11, 4000)), ("-D", ("EUR", 11, 4000))]] == [
        1000, 1000, 4000, 4000]
    # a delete without its whole row (no REPLICA IDENTITY FULL) has no rowtime: the source fails saying why
    with pytest.raises(ValueError, match="table rates: the rowtime of a row is NULL .*REPLICA IDENTITY FULL"):
        strategy.timestamp(("-D", ("EUR", None, None)))
    assert "TemporalJoin" in explain(session_of(job))


JDBC_SCAN = """
CREATE TABLE customers (id BIGINT, region STRING, since TIMESTAMP(3), PRIMARY KEY (id) NOT ENFORCED,
  WATERMARK FOR since AS since)
  WITH ('connector' = 'jdbc', 'url' = 'jdbc:postgresql://db.local:6543/shop', 'table-name' = 'crm.customers',
        'username' = 'app'{extra});
CREATE TABLE out_t (id BIGINT, region STRING) WITH ('connector' = 'print');
INSERT INTO out_t SELECT id, region FROM customers;
"""


def test_a_jdbc_table_read_by_a_query_is_a_bounded_scan_split_as_flink_splits_it() -> None:
    from runtime.sql.jdbc_scan import JdbcScanSource, partition_ranges, splits_of

    job = plan(JDBC_SCAN.format(extra=""))
    source = next(n.payload for n in job.nodes if n.kind == "source")
    scan = source.inner
    assert isinstance(scan, JdbcScanSource) and source.bounded and source.check_at_submit == scan.check_at_submit
    assert (scan.dsn, scan.table_name, scan.columns, scan.order, scan.splits) == (
        "host=db.local port=6543 dbname=shop user=app", "crm.customers", ["id", "region", "since"], ["id"], [None])
    assert splits_of(scan.splits, 0, 2) == [None] and splits_of(scan.splits, 1, 2) == []
    split = plan(JDBC_SCAN.format(extra=", 'scan.partition.column' = 'id', 'scan.partition.num' = '4', "
                                        "'scan.partition.lower-bound' = '1', 'scan.partition.upper-bound' = '10', "
                                        "'scan.fetch-size' = '50'")).nodes[0].payload.inner
    assert (split.partition_column, split.splits, split.fetch_size) == ("id", [(1, 3), (4, 6), (7, 8), (9, 10)], 50)
    assert splits_of(split.splits, 1, 3) == [(4, 6)] and splits_of(split.splits, 0, 3) == [(1, 3), (9, 10)]
    # Flink's JdbcNumericBetweenParametersProvider.ofBatchNum: the first ranges one longer, no more than values
    assert partition_ranges(0, 9, 3) == [(0, 3), (4, 6), (7, 9)]
    assert partition_ranges(5, 6, 4) == [(5, 5), (6, 6)]
    assert partition_ranges(-3, 3, 1) == [(-3, 3)]


@pytest.mark.parametrize(("extra", "message"), [
    (", 'scan.partition.column' = 'id'", "table customers: the 'scan.partition.*' options go together; "
                                         "'scan.partition.num' is missing"),
    (", 'scan.partition.column' = 'region', 'scan.partition.num' = '2', 'scan.partition.lower-bound' = '0', "
     "'scan.partition.upper-bound' = '9'", "table customers: 'scan.partition.column' must name a numeric"),
    (", 'scan.partition.column' = 'id', 'scan.partition.num' = '0', 'scan.partition.lower-bound' = '0', "
     "'scan.partition.upper-bound' = '9'", "table customers: 'scan.partition.num' must be at least 1"),
    (", 'scan.fetch-size' = 'many'", "table customers: 'scan.fetch-size' must be a whole number, got 'many'"),
])
def test_bad_jdbc_scan_options_are_one_line(extra: str, message: str) -> None:
    with pytest.raises(SqlError) as info:
        plan(JDBC_SCAN.format(extra=extra))
    assert refusal(info).startswith(message)
