"""Metadata columns (`col TYPE METADATA [FROM 'key'] [VIRTUAL]`): what each connector offers, checked at planning,
and the pure mapping from what a source read to the metadata values of a row.

A metadata column is read from the record's envelope rather than its value: for `kafka` and `upsert-kafka` the
record's topic, partition, offset, timestamp (TIMESTAMP_LTZ(3)), timestamp-type and headers; for `filesystem` the
file a row came from (file.path, file.name, file.size, file.modification-time). Flink's lists, less Kafka's
`leader-epoch` (aiokafka does not hand it to a consumer). A key a connector does not offer is refused when a query
reads the table, in Flink's words; so is a persisted (not VIRTUAL) metadata column on INSERT unless the connector
can write that key (Kafka: headers, timestamp).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from runtime.connectors.kafka_core import KafkaRecord
from runtime.sql import types as T
from runtime.sql.catalog import Column, TableDef
from runtime.sql.errors import SqlError

MAP = T.SqlType("MAP", nullable=False)
TIMESTAMP_LTZ = T.SqlType("TIMESTAMP_LTZ", nullable=False, precision=3)

KAFKA_READABLE: dict[str, T.SqlType] = {
    "topic": T.STRING.not_null(), "partition": T.INT.not_null(), "headers": MAP, "offset": T.BIGINT.not_null(),
    "timestamp": TIMESTAMP_LTZ, "timestamp-type": T.STRING.not_null(),
}
KAFKA_WRITABLE: dict[str, T.SqlType] = {"headers": MAP, "timestamp": TIMESTAMP_LTZ}
FILE_READABLE: dict[str, T.SqlType] = {
    "file.path": T.STRING.not_null(), "file.name": T.STRING.not_null(), "file.size": T.BIGINT.not_null(),
    "file.modification-time": TIMESTAMP_LTZ,
}
READABLE: dict[str, dict[str, T.SqlType]] = {"kafka": KAFKA_READABLE, "upsert-kafka": KAFKA_READABLE,
                                             "filesystem": FILE_READABLE}
WRITABLE: dict[str, dict[str, T.SqlType]] = {"kafka": KAFKA_WRITABLE, "upsert-kafka": KAFKA_WRITABLE}

# Kafka's timestamp types as the record's attribute holds them (0, 1; -1 for a record without a timestamp)
TIMESTAMP_TYPES = {-1: "NoTimestampType", 0: "CreateTime", 1: "LogAppendTime"}


@dataclass(frozen=True)
class MetadataColumn:
    column: Column
    key: str
    type: T.SqlType  # the connector's type of the key


def _castable(offered: T.SqlType, declared: T.SqlType) -> bool:
    """Whether the key's value may stand in a column of `declared` type (Flink: castable from the metadata type);
    numbers among numbers, timestamps among timestamps, and a type to itself."""
    return (offered.name == declared.name or (offered.numeric and declared.numeric)
            or (offered.timestamp and declared.timestamp))


def readable(table: TableDef) -> list[MetadataColumn]:
    """The table's metadata columns (declared order) for reading; SqlError for a key its connector does not offer
    or a type the key's value cannot take."""
    columns = [c for c in table.columns if c.metadata is not None]
    if not columns:
        return []
    offered = READABLE.get(table.connector, {})
    return _checked(table, columns, offered, "reading", ", ".join(offered) or "none", "from")


def writable(table: TableDef) -> list[MetadataColumn]:
    """The table's persisted (not VIRTUAL) metadata columns for writing; SqlError when its connector cannot write
    one of them (Flink's message: declare the column VIRTUAL if it should not be written)."""
    columns = [c for c in table.columns if c.metadata is not None and not c.virtual]
    if not columns:
        return []
    offered = WRITABLE.get(table.connector)
    if offered is None:
        raise SqlError(f"Table '{table.qualified()}' declares persistable metadata columns, but the "
                       f"'{table.connector}' connector cannot write metadata. If the column should not be persisted, "
                       "it can be declared with the VIRTUAL keyword.")
    return _checked(table, columns, offered, "writing", f"{', '.join(offered)}; declare a read-only one VIRTUAL", "to")


def _checked(table: TableDef, columns: list[Column], offered: dict[str, T.SqlType], direction: str, keys: str,
             cast: str) -> list[MetadataColumn]:
    """Each column's key among those the connector offers for `direction` (`keys` lists them in the error) and its
    declared type castable `cast` ("from" / "to") the key's type."""
    out = []
    for column in columns:
        key = column.metadata
        assert key is not None and column.type is not None
        if key not in offered:
            raise SqlError(f"Invalid metadata key '{key}' in column '{column.name}' of table '{table.qualified()}'. "
                           f"The '{table.connector}' connector supports the following metadata keys for {direction}: "
                           f"{keys}")
        if not _castable(offered[key], column.type):
            raise SqlError(f"Invalid data type for metadata column '{column.name}' of table '{table.qualified()}'. "
                           f"The column cannot be declared as '{column.type}' because the type must be castable "
                           f"{cast} metadata type '{offered[key]}'.")
        out.append(MetadataColumn(column, key, offered[key]))
    return out


# -- reading: the values of a row's metadata columns ---------------------------------------------------------


def _as(declared: T.SqlType, offered: T.SqlType) -> Callable[[Any], Any]:
    """The key's value in the declared column's form (an INT partition in a BIGINT column is the same int; a
    BIGINT offset declared DOUBLE becomes a float)."""
    if declared.name in ("FLOAT", "DOUBLE") and offered.name != declared.name:
        return float
    return lambda v: v


def kafka_metadata(columns: Sequence[MetadataColumn]) -> Callable[[KafkaRecord], tuple[Any, ...]]:
    """A Kafka record -> the values of `columns`, in order: timestamps as epoch milliseconds, headers as a dict
    (a repeated header's last value, as Flink's map)."""
    getters: dict[str, Callable[[KafkaRecord], Any]] = {
        "topic": lambda r: r.topic,
        "partition": lambda r: r.partition,
        "offset": lambda r: r.offset,
        "timestamp": lambda r: r.timestamp_ms,
        "timestamp-type": lambda r: TIMESTAMP_TYPES.get(r.timestamp_type, "NoTimestampType"),
        "headers": lambda r: dict(r.headers),
    }
    pairs = [(getters[m.key], _as(m.column.type, m.type)) for m in columns]  # type: ignore[arg-type]
    return lambda record: tuple(convert(get(record)) for get, convert in pairs)


def file_metadata(columns: Sequence[MetadataColumn]) -> Callable[[str], tuple[Any, ...]]:
    """A file's path -> the values of `columns` for the rows read from it (size and modification time as the
    file is when its rows are read)."""
    def values(path: str) -> tuple[Any, ...]:
        absolute = os.path.abspath(path)
        stat = os.stat(absolute)
        found = {"file.path": absolute, "file.name": os.path.basename(absolute), "file.size": stat.st_size,
                 "file.modification-time": stat.st_mtime_ns // 1_000_000}
        return tuple(_as(m.column.type, m.type)(found[m.key]) for m in columns)  # type: ignore[arg-type]
    return values


def merge(stored: Sequence[Column], metadata: Sequence[MetadataColumn]
          ) -> Callable[[tuple[Any, ...], tuple[Any, ...]], tuple[Any, ...]]:
    """(the physical values, the metadata values) -> the row of the table's stored columns in declared order
    (physical and metadata columns interleaved as the DDL has them)."""
    meta_names = [m.column.name for m in metadata]
    picks: list[tuple[bool, int]] = []
    physical_at = 0
    for column in stored:
        if column.metadata is None:
            picks.append((False, physical_at))
            physical_at += 1
        else:
            picks.append((True, meta_names.index(column.name)))
    if picks == [(False, i) for i in range(physical_at)] + [(True, i) for i in range(len(metadata))]:
        return lambda values, meta: values + meta  # physical columns first, metadata after in order
    return lambda values, meta: tuple(meta[i] if is_meta else values[i] for is_meta, i in picks)


# -- writing: Kafka's headers and timestamp from a row --------------------------------------------------------


def kafka_written(columns: Sequence[MetadataColumn], persisted: Sequence[Column]
                  ) -> tuple[Callable[[tuple[Any, ...]], list[tuple[str, bytes]]] | None,
                             Callable[[tuple[Any, ...]], int | None] | None]:
    """(headers of a row, timestamp of a row) for a Kafka sink, each None when no column writes it; a row is in
    the order of the table's persisted columns. Header values are bytes (a str is UTF-8 encoded)."""
    names = [c.name for c in persisted]
    headers_at = next((names.index(m.column.name) for m in columns if m.key == "headers"), None)
    timestamp_at = next((names.index(m.column.name) for m in columns if m.key == "timestamp"), None)

    def headers(row: tuple[Any, ...]) -> list[tuple[str, bytes]]:
        value = row[headers_at]  # type: ignore[index]
        if not value:
            return []
        return [(str(k), v.encode() if isinstance(v, str) else bytes(v)) for k, v in value.items()]

    def timestamp(row: tuple[Any, ...]) -> int | None:
        value = row[timestamp_at]  # type: ignore[index]
        return None if value is None else int(value)

    return (headers if headers_at is not None else None), (timestamp if timestamp_at is not None else None)
