"""Metadata columns (runtime/sql/metadata.py): `col TYPE METADATA [FROM 'key'] [VIRTUAL]` parsed, checked against
what each connector offers at planning, Kafka records' and files' metadata mapped into rows in declared order,
and a Kafka sink's headers and timestamp written from the persisted metadata columns."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("sqlglot")

from runtime.api import Job  # noqa: E402
from runtime.connectors.kafka_core import KafkaRecord  # noqa: E402
from runtime.connectors.kafka_sink import KafkaSink  # noqa: E402
from runtime.sql import types as T  # noqa: E402
from runtime.sql.catalog import Catalog, Column  # noqa: E402
from runtime.sql.connectors import TableSource  # noqa: E402
from runtime.sql.errors import SqlError  # noqa: E402
from runtime.sql.parse import parse_script  # noqa: E402

KAFKA = "'connector' = '{c}', 'topic' = 'orders', 'properties.bootstrap.servers' = 'broker:9092', 'format' = 'json'"
ORDERS = f"""
CREATE TABLE orders (
  `offset` BIGINT METADATA VIRTUAL,
  sku STRING,
  ts TIMESTAMP_LTZ(3) METADATA FROM 'timestamp',
  qty BIGINT,
  part INT METADATA FROM 'partition' VIRTUAL,
  hdrs MAP<STRING, BYTES> METADATA FROM 'headers',
  kind STRING METADATA FROM 'timestamp-type' VIRTUAL,
  doubled AS qty * 2,
  WATERMARK FOR ts AS ts - INTERVAL '1' SECOND
) WITH ({KAFKA.format(c='kafka')});
"""
OUT = "CREATE TABLE out_t (sku STRING, qty BIGINT, `offset` BIGINT, part INT, kind STRING, doubled BIGINT, " \
      "ts TIMESTAMP(3)) WITH ('connector' = 'print');"
SELECT = "INSERT INTO out_t SELECT sku, qty, `offset`, part, kind, doubled, ts FROM orders;"


def plan(text: str) -> Job:
    job = Job("q")
    job.sql(text)
    return job


def test_metadata_columns_parse_with_their_key_and_virtual_flag() -> None:
    catalog = Catalog()
    for statement in parse_script(ORDERS):
        catalog.apply(statement.node)
    table = catalog.table("orders")
    assert [(c.name, c.metadata, c.virtual) for c in table.columns if c.computed is None] == [
        ("offset", "offset", True), ("sku", None, False), ("ts", "timestamp", False), ("qty", None, False),
        ("part", "partition", True), ("hdrs", "headers", False), ("kind", "timestamp-type", True)]
    assert [c.name for c in table.physical] == ["sku", "qty"]
    assert [c.name for c in table.persisted] == ["sku", "ts", "qty", "hdrs"]
    assert table.columns[5] == Column("hdrs", T.SqlType("MAP"), metadata="headers")


def test_a_kafka_record_becomes_a_row_with_its_metadata_in_declared_order() -> None:
    job = plan(ORDERS + OUT + SELECT)
    source = job.nodes[0].payload
    assert isinstance(source, TableSource)
    record = KafkaRecord("orders", 3, 41, 1_700_000_000_123, None, json.dumps({"sku": "a", "qty": 5}).encode(),
                         (("trace", b"x1"), ("trace", b"x2"), ("who", b"me")), timestamp_type=1)
    decoded = source.inner.deserializer(record)  # the deserializer the table gave its KafkaSource
    # declared order: offset, sku, ts, qty, part, hdrs, kind, then the computed doubled
    assert source.to_row(decoded) == (41, "a", 1_700_000_000_123, 5, 3, {"trace": b"x2", "who": b"me"},
                                      "LogAppendTime", 10)
    no_type = KafkaRecord("orders", 0, 0, 7, None, b'{"sku": "b"}', (), timestamp_type=-1)
    assert source.to_row(source.inner.deserializer(no_type)) == (0, "b", 7, None, 0, {}, "NoTimestampType", None)


def test_an_upsert_kafka_table_reads_metadata_beside_its_changelog() -> None:
    text = f"""
    CREATE TABLE totals (sku STRING, n BIGINT, `offset` BIGINT METADATA VIRTUAL, PRIMARY KEY (sku) NOT ENFORCED)
    WITH ({KAFKA.format(c='upsert-kafka')}, 'key.format' = 'json', 'value.format' = 'json');
    CREATE TABLE out_t (sku STRING, n BIGINT, o BIGINT) WITH ('connector' = 'print');
    INSERT INTO out_t SELECT sku, n, `offset` FROM totals;
    """
    source = plan(text).nodes[0].payload
    upsert = KafkaRecord("orders", 0, 9, 1, b'{"sku": "a"}', b'{"n": 4}', ())
    tombstone = KafkaRecord("orders", 0, 10, 2, b'{"sku": "a"}', None, ())
    assert source.to_row(source.inner.deserializer(upsert)) == ("+U", ("a", 4, 9))
    assert source.to_row(source.inner.deserializer(tombstone)) == ("-D", ("a", None, 10))


def test_filesystem_rows_carry_the_metadata_of_the_file_they_were_read_from(tmp_path: Path) -> None:
    data = tmp_path / "in"
    data.mkdir()
    (data / "a.json").write_text('{"v": 1}\n{"v": 2}\n')
    (data / "b.json").write_text('{"v": 3}\n')
    os.utime(data / "b.json", ns=(1_700_000_000_500_000_000, 1_700_000_000_500_000_000))
    text = f"""
    CREATE TABLE files (name STRING METADATA FROM 'file.name' VIRTUAL, v BIGINT,
      size BIGINT METADATA FROM 'file.size' VIRTUAL, path STRING METADATA FROM 'file.path' VIRTUAL,
      mtime TIMESTAMP_LTZ(3) METADATA FROM 'file.modification-time' VIRTUAL)
    WITH ('connector' = 'filesystem', 'path' = '{data}', 'format' = 'json');
    CREATE TABLE out_t (name STRING, v BIGINT) WITH ('connector' = 'print');
    INSERT INTO out_t SELECT name, v FROM files;
    """
    source = plan(text).nodes[0].payload
    source.open(0, 1)
    rows = []
    while (batch := source.read_batch(10)) is not None:
        rows += batch
    source.close()
    b_mtime = 1_700_000_000_500
    a_mtime = (data / "a.json").stat().st_mtime_ns // 10**6
    assert sorted(rows) == [("a.json", 1, 18, str(data / "a.json"), a_mtime),
                            ("a.json", 2, 18, str(data / "a.json"), a_mtime),
                            ("b.json", 3, 9, str(data / "b.json"), b_mtime)]


@pytest.mark.parametrize("ddl, query, message", [
    ("CREATE TABLE t (v BIGINT, p INT METADATA FROM 'leader' VIRTUAL) WITH ({kafka});", "SELECT v FROM t",
     "Invalid metadata key 'leader' in column 'p' of table 'default_catalog.default_database.t'. The 'kafka' "
     "connector supports the following metadata keys for reading: topic, partition, headers, offset, timestamp, "
     "timestamp-type"),
    ("CREATE TABLE t (v BIGINT, n STRING METADATA FROM 'file.name') WITH ('connector' = 'datagen');",
     "SELECT v FROM t", "The 'datagen' connector supports the following metadata keys for reading: none"),
    ("CREATE TABLE t (v BIGINT, o STRING METADATA FROM 'offset' VIRTUAL) WITH ({kafka});", "SELECT v FROM t",
     "The column cannot be declared as 'STRING' because the type must be castable from metadata type "
     "'BIGINT NOT NULL'"),
    # a persisted read-only key, written by INSERT: declare it VIRTUAL
    ("CREATE TABLE t (v BIGINT, `offset` BIGINT METADATA) WITH ({kafka});", "INSERT INTO t SELECT v, v FROM src",
     "Invalid metadata key 'offset' in column 'offset' of table 'default_catalog.default_database.t'. The "
     "'kafka' connector supports the following metadata keys for writing: headers, timestamp"),
    ("CREATE TABLE t (v BIGINT, n STRING METADATA FROM 'file.name') WITH ('connector' = 'filesystem', "
     "'path' = 'x', 'format' = 'json');", "INSERT INTO t SELECT v, 'a' FROM src",
     "declares persistable metadata columns, but the 'filesystem' connector cannot write metadata. If the column "
     "should not be persisted, it can be declared with the VIRTUAL keyword."),
    # a VIRTUAL column is not written: the INSERT has the physical columns only
    ("CREATE TABLE t (v BIGINT, `offset` BIGINT METADATA VIRTUAL) WITH ({kafka});",
     "INSERT INTO t SELECT v, v FROM src",
     "the query has 2 columns (v, v), the sink 1 (v)"),
    ("CREATE TABLE t (v BIGINT, p INT METADATA FROM 'partition', PRIMARY KEY (p) NOT ENFORCED) WITH ({kafka});",
     "SELECT v FROM t", "could not create a PRIMARY KEY: column 'p' is not a physical column"),
])
def test_metadata_a_connector_does_not_offer_is_refused_at_planning(ddl: str, query: str, message: str) -> None:
    tables = "CREATE TABLE p_out (v BIGINT) WITH ('connector' = 'print');\n" \
        "CREATE TABLE src (v BIGINT) WITH ('connector' = 'datagen');\n"
    insert = query if query.startswith("INSERT") else f"INSERT INTO p_out {query}"
    text = ddl.format(kafka=KAFKA.format(c="kafka")) + "\n" + tables + insert + ";"
    with pytest.raises(SqlError) as info:
        plan(text)
    assert message in str(info.value)


def test_a_kafka_sink_writes_headers_and_timestamp_from_persisted_metadata_columns() -> None:
    text = ORDERS + f"""
    CREATE TABLE echo (sku STRING, ts TIMESTAMP_LTZ(3) METADATA FROM 'timestamp', qty BIGINT,
      hdrs MAP<STRING, BYTES> METADATA FROM 'headers', `offset` BIGINT METADATA VIRTUAL)
    WITH ({KAFKA.format(c='kafka').replace("'orders'", "'echo'")});
    INSERT INTO echo SELECT sku, ts, qty, hdrs FROM orders;
    """
    sink = next(n.payload for n in plan(text).nodes if n.kind == "sink")
    assert isinstance(sink, KafkaSink)
    row: Any = ("a", 1_700_000_000_123, 5, {"trace": b"x", "who": "me"})
    assert json.loads(sink.serializer(row)) == {"sku": "a", "qty": 5}  # metadata is not in the value
    assert sink.headers(row) == [("trace", b"x"), ("who", b"me")]
    assert sink.timestamp(row) == 1_700_000_000_123
    assert sink.headers(("a", None, 5, None)) == [] and sink.timestamp(("a", None, 5, None)) is None
