"""Kafka tables in SQL (runtime/sql/connectors.py, kafka_tables.py): Flink's 'kafka' and 'upsert-kafka' options
planned onto KafkaSource/KafkaSink, the source's hooks passed through, the row codecs, an upsert-kafka table
read back as a changelog, and every refusal in one line."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("sqlglot")

from runtime.api import Job  # noqa: E402
from runtime.connectors import kafka_core as core  # noqa: E402
from runtime.connectors.kafka_core import KafkaRecord  # noqa: E402
from runtime.connectors.kafka_sink import KafkaSink  # noqa: E402
from runtime.connectors.kafka_source import KafkaSource  # noqa: E402
from runtime.sql.connectors import TableSource, UpsertKafkaSink  # noqa: E402
from runtime.sql.errors import SqlError  # noqa: E402
from runtime.sql.kafka_tables import normalized, upsert_record  # noqa: E402
from tests.support.sql_chain import SqlTailChain  # noqa: E402

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


def source_of(extra: str = "", topic: str = "'topic' = 'orders'") -> KafkaSource:
    orders = ORDERS.format(extra=extra).replace("'topic' = 'orders'", topic)
    job = plan(orders + TOTALS.format(key="", connector="kafka", extra="") + APPEND)
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


def test_a_kafka_table_reads_a_topic_list_or_a_topic_pattern_discovered_as_flink_does() -> None:
    listed = source_of(topic="'topic' = 'orders-eu;orders-us'")
    assert (listed.topics, listed.topic_pattern, listed.discovery_interval_s) == (["orders-eu", "orders-us"], None,
                                                                                  300.0)
    pattern = source_of(", 'scan.topic-partition-discovery.interval' = '30 s'", topic="'topic-pattern' = 'orders-.*'")
    assert (pattern.topics, pattern.topic_pattern, pattern.discovery_interval_s) == ([], "orders-.*", 30.0)
    assert source_of(", 'scan.topic-partition-discovery.interval' = '0'").discovery_interval_s is None  # off


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
    (", 'topic-pattern' = 'o.*'", TOTALS.format(key="", connector="kafka", extra="") + APPEND,
     "exactly one of 'topic' and 'topic-pattern'"),
    (", 'scan.topic-partition-discovery.interval' = 'soon'", TOTALS.format(key="", connector="kafka", extra="")
     + APPEND, "'scan.topic-partition-discovery.interval' must be a duration"),
    ("", TOTALS.format(key="", connector="kafka", extra=", 'topic-pattern' = 't.*'") + APPEND,
     "'topic-pattern' is for reading; a sink writes to one 'topic'"),
    ("", TOTALS.format(key="", connector="kafka", extra="").replace("'totals'", "'a;b'") + APPEND,
     "a sink writes to one topic, got 'a;b'"),
])
def test_bad_kafka_table_options_are_one_line(orders_extra: str, totals: str, message: str) -> None:
    with pytest.raises(SqlError) as info:
        plan(ORDERS.format(extra=orders_extra) + totals)
    assert message in str(info.value) and "\n" not in str(info.value)
    # the orders table without its bootstrap servers
    with pytest.raises(SqlError, match="needs the option 'properties.bootstrap.servers'"):
        plan(ORDERS.format(extra="").replace("'properties.bootstrap.servers' = 'broker:9092',", "")
             + TOTALS.format(key="", connector="kafka", extra="") + APPEND)


UPSERT_TOTALS = TOTALS.format(key=", PRIMARY KEY (sku) NOT ENFORCED", connector="upsert-kafka",
                              extra=", 'key.format' = 'json', 'value.format' = 'json'")
PRINT_TOTALS = ("CREATE TABLE p (sku STRING, n BIGINT) WITH ('connector' = 'print');\n"
                "INSERT INTO p SELECT sku, n FROM totals;")


def record(key: bytes | None, value: bytes | None, offset: int = 0) -> KafkaRecord:
    return KafkaRecord("totals", 0, offset, 0, key, value, ())


def test_normalized_turns_upserts_and_deletes_into_a_changelog_as_flinks_changelog_normalize() -> None:
    a1, a2 = ("a", 1), ("a", 2)
    assert normalized(None, "+U", a1) == (a1, [("+I", a1)])
    assert normalized(a1, "+U", a2) == (a2, [("-U", a1), ("+U", a2)])
    assert normalized(a2, "+U", a2) == (a2, [])  # unchanged: nothing
    assert normalized(a2, "-D", ("a", None)) == (None, [("-D", a2)])  # the row it had
    assert normalized(None, "-D", ("a", None)) == (None, [])  # an unknown key


def test_an_upsert_kafka_table_is_read_as_a_changelog_normalized_by_its_primary_key(capsys: Any) -> None:
    job = plan(UPSERT_TOTALS + PRINT_TOTALS)
    table_source = job.nodes[0].payload
    assert isinstance(table_source, TableSource) and table_source.inner.deserializer is upsert_record
    read = [table_source.to_row(upsert_record(r)) for r in (
        record(b'{"sku":"a"}', b'{"sku":"a","n":1}'), record(b'{"sku":"b"}', b'{"n":4}'),
        record(b'{"sku":"a"}', None))]
    assert read == [("+U", ("a", 1)), ("+U", ("b", 4)), ("-D", ("a", None))]  # key columns from the key
    with pytest.raises(ValueError, match="an upsert-kafka record needs a key"):
        upsert_record(record(None, b'{"sku":"a","n":1}'))
    chain = SqlTailChain(UPSERT_TOTALS + PRINT_TOTALS)
    assert chain.names[0] == "ChangelogNormalize: totals"
    # no watermark: the records are the (kind, row) pairs themselves
    chain.chain.input_batch(0)([("+U", ("a", 1)), ("+U", ("b", 1)), ("+U", ("a", 2)), ("+U", ("a", 2)),
                                ("-D", ("b", None)), ("-D", ("c", None)), ("+U", ("b", 7))])
    assert capsys.readouterr().out.splitlines() == ["+I[a, 1]", "+I[b, 1]", "-U[a, 1]", "+U[a, 2]", "-D[b, 1]",
                                                    "+I[b, 7]"]


def test_reading_an_upsert_kafka_table_needs_its_primary_key() -> None:
    keyless = TOTALS.format(key="", connector="upsert-kafka", extra=", 'key.format' = 'json', 'value.format' = "
                            "'json'")
    with pytest.raises(SqlError, match="an 'upsert-kafka' table needs a PRIMARY KEY"):
        plan(keyless + PRINT_TOTALS)
