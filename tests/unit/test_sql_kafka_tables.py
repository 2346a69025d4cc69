"""Kafka tables in SQL (runtime/sql/connectors.py): Flink's 'kafka' and 'upsert-kafka' options planned onto
KafkaSource/KafkaSink, the source's hooks passed through, the row codecs, and every refusal in one line."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("sqlglot")

from runtime.api import Job  # noqa: E402
from runtime.connectors import kafka_core as core  # noqa: E402
from runtime.connectors.kafka_sink import KafkaSink  # noqa: E402
from runtime.connectors.kafka_source import KafkaSource  # noqa: E402
from runtime.sql.connectors import TableSource, UpsertKafkaSink  # noqa: E402
from runtime.sql.errors import SqlError  # noqa: E402

ORDERS = """
CREATE TABLE orders (sku STRING, qty BIGINT, ts TIMESTAMP(3), WATERMARK FOR ts AS ts - INTERVAL '1' SECOND)
WITH ('connector' = 'kafka', 'topic' = 'orders', 'properties.bootstrap.servers' = 'broker:9092',
      'format' = 'json'{extra});
"""
TOTALS = """
CREATE TABLE totals (sku STRING, n BIGINT{key}) WITH ('connector' = '{connector}', 'topic' = 'totals',
  'properties.bootstrap.servers' = 'broker:9092'{extra});
"""
COUNT = "INSERT INTO totals SELECT sku, COUNT(*) FROM orders GROUP BY sku;"
APPEND = "INSERT INTO totals SELECT sku, qty FROM orders WHERE qty > 0;"


def plan(text: str) -> Job:
    job = Job("q")
    job.sql(text)
    return job


def source_of(extra: str = "") -> KafkaSource:
    job = plan(ORDERS.format(extra=extra) + TOTALS.format(key="", connector="kafka", extra="") + APPEND)
    table_source = job.nodes[0].payload
    assert isinstance(table_source, TableSource) and isinstance(table_source.inner, KafkaSource)
    return table_source.inner


def sink_of(text: str) -> Any:
    return next(n.payload for n in plan(text).nodes if n.kind == "sink")


def test_a_kafka_table_reads_through_a_kafka_source_whose_hooks_the_table_source_passes_on() -> None:
    job = plan(ORDERS.format(extra=", 'properties.group.id' = 'g1', 'scan.bounded.mode' = 'latest-offset'")
               + TOTALS.format(key="", connector="kafka", extra="") + APPEND)
    table_source = job.nodes[0].payload
    inner = table_source.inner
    assert (inner.bootstrap_servers, inner.topics, inner.group_id, inner.bounded, inner.isolation_level,
            inner.on_malformed) == ("broker:9092", ["orders"], "g1", True, "read_committed", "fail")
    assert inner.start == core.Start(core.COMMITTED)  # Flink's default with a group: group-offsets
    # what the runtime asks a source for: partitions dealt on a rescale, per-partition watermarks, the submit
    # check, offsets committed, metrics
    assert table_source.redistributes_positions is True and table_source.rescalable is True
    assert table_source.redistribute is core.redistribute
    for hook in ("check_at_submit", "checkpoint_complete", "watermark_generator", "partition_statistics"):
        assert getattr(table_source, hook).__self__ is inner, hook
    assert job.nodes[0].watermarks is not None
    # the record's JSON object -> the row, the missing column NULL
    assert table_source.to_row({"sku": "a", "qty": 3}) == ("a", 3, None)


def test_startup_modes_are_flinks() -> None:
    assert source_of().start == core.Start(core.EARLIEST)  # no group: earliest-offset
    assert source_of(", 'scan.startup.mode' = 'latest-offset'").start == core.Start(core.LATEST)
    assert source_of(", 'properties.group.id' = 'g', 'properties.auto.offset.reset' = 'latest'").start == \
        core.Start(core.COMMITTED, fallback=core.LATEST)
    assert source_of(", 'scan.startup.mode' = 'timestamp', 'scan.startup.timestamp-millis' = '1700000000000'"
                     ).start == core.Start("timestamp", timestamp_ms=1700000000000)
    assert source_of(", 'scan.startup.mode' = 'specific-offsets', "
                     "'scan.startup.specific-offsets' = 'partition:1,offset:300;partition:0,offset:42'").start == \
        core.Start("offsets", offsets=(("orders", 0, 42), ("orders", 1, 300)))
    skipping = source_of(", 'json.ignore-parse-errors' = 'true'")
    assert callable(skipping.on_malformed) and skipping.bounded is False


def test_an_append_query_writes_json_objects_to_a_kafka_table_exactly_once_when_asked() -> None:
    sink = sink_of(ORDERS.format(extra="") + TOTALS.format(
        key="", connector="kafka", extra=", 'format' = 'json', 'sink.delivery-guarantee' = 'exactly-once', "
        "'sink.transactional-id-prefix' = 'totals-job', 'key.format' = 'json', 'key.fields' = 'sku'") + APPEND)
    assert type(sink) is KafkaSink
    assert (sink.topic, sink.delivery, sink.transactional_id_prefix) == ("totals", "exactly-once", "totals-job")
    assert sink.serializer(("a", 3)) == b'{"sku":"a","n":3}' and sink.key(("a", 3)) == b'{"sku":"a"}'
    default = sink_of(ORDERS.format(extra="") + TOTALS.format(key="", connector="kafka", extra="") + APPEND)
    assert (default.delivery, default.key) == ("at-least-once", None)  # Flink's default guarantee


def test_an_updating_query_goes_to_upsert_kafka_keyed_by_the_primary_key_with_tombstones_for_deletes() -> None:
    sink = sink_of(ORDERS.format(extra="") + TOTALS.format(
        key=", PRIMARY KEY (sku) NOT ENFORCED", connector="upsert-kafka",
        extra=", 'key.format' = 'json', 'value.format' = 'json', 'value.fields-include' = 'EXCEPT_KEY'") + COUNT)
    assert type(sink) is UpsertKafkaSink
    assert sink.key(("+U", ("a", 2))) == b'{"sku":"a"}'
    assert sink.serializer(("+I", ("a", 1))) == b'{"n":1}' and sink.serializer(("+U", ("a", 2))) == b'{"n":2}'
    assert sink.serializer(("-D", ("a", 2))) is None  # a tombstone
    appended = sink_of(ORDERS.format(extra="") + TOTALS.format(
        key=", PRIMARY KEY (sku) NOT ENFORCED", connector="upsert-kafka",
        extra=", 'key.format' = 'json', 'value.format' = 'json'") + APPEND)
    assert type(appended) is KafkaSink and appended.serializer(("a", 1)) == b'{"sku":"a","n":1}'


@pytest.mark.parametrize(("orders_extra", "totals", "message"), [
    ("", TOTALS.format(key="", connector="kafka", extra="") + COUNT,
     "Table sink 'default_catalog.default_database.totals' doesn't support consuming update changes"),
    (", 'scan.startup.mode' = 'newest'", TOTALS.format(key="", connector="kafka", extra="") + APPEND,
     "'scan.startup.mode' must be one of earliest-offset, latest-offset, group-offsets"),
    (", 'scan.startup.mode' = 'group-offsets'", TOTALS.format(key="", connector="kafka", extra="") + APPEND,
     "'group-offsets' needs 'properties.group.id'"),
    (", 'scan.startup.mode' = 'specific-offsets', 'scan.startup.specific-offsets' = '0:42'",
     TOTALS.format(key="", connector="kafka", extra="") + APPEND, "'partition:0,offset:42;partition:1,offset:300'"),
    (", 'format' = 'csv'", TOTALS.format(key="", connector="kafka", extra="") + APPEND, "'format' must be 'json'"),
    (", 'properties.max.poll.records' = '5'", TOTALS.format(key="", connector="kafka", extra="") + APPEND,
     "option 'properties.max.poll.records' is not supported"),
    ("", TOTALS.format(key="", connector="kafka", extra=", 'sink.delivery-guarantee' = 'exactly-once'") + APPEND,
     "'exactly-once' needs 'sink.transactional-id-prefix'"),
    ("", TOTALS.format(key="", connector="upsert-kafka", extra=", 'key.format' = 'json', 'value.format' = 'json'")
     + COUNT, "an 'upsert-kafka' table needs a PRIMARY KEY"),
    ("", TOTALS.format(key="", connector="kafka", extra=", 'key.fields' = 'nope', 'key.format' = 'json'")
     + APPEND, "'key.fields' names nope, not columns"),
])
def test_bad_kafka_table_options_are_one_line(orders_extra: str, totals: str, message: str) -> None:
    with pytest.raises(SqlError) as info:
        plan(ORDERS.format(extra=orders_extra) + totals)
    assert message in str(info.value) and "\n" not in str(info.value)
    # the orders table without its bootstrap servers
    with pytest.raises(SqlError, match="needs the option 'properties.bootstrap.servers'"):
        plan(ORDERS.format(extra="").replace("'properties.bootstrap.servers' = 'broker:9092',", "")
             + TOTALS.format(key="", connector="kafka", extra="") + APPEND)


def test_an_upsert_kafka_table_is_not_read_yet() -> None:
    upsert = TOTALS.format(key=", PRIMARY KEY (sku) NOT ENFORCED", connector="upsert-kafka",
                           extra=", 'key.format' = 'json', 'value.format' = 'json'")
    with pytest.raises(SqlError, match="an 'upsert-kafka' table cannot be read in Sluice SQL yet"):
        plan(upsert + "CREATE TABLE p (sku STRING, n BIGINT) WITH ('connector' = 'print');\n"
             "INSERT INTO p SELECT sku, n FROM totals;")
