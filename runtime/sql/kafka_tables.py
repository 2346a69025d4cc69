"""Reading an `upsert-kafka` table: the topic as a changelog, Flink's way.

A record with a value is the key's new row (an upsert), a record with no value (a tombstone) deletes the key.
The source turns each record into (kind, row): +U with the row (its key columns from the record's key, the
others from its value), -D with the key columns (the others NULL). Those are not yet a changelog a GROUP BY
can retract from: the planner keys them by the PRIMARY KEY and `ChangelogNormalizeFunction` (Flink's
ChangelogNormalize) keeps each key's last row, so what flows on is +I for a new key, -U old / +U new for an
update (nothing when the row did not change), -D with the row deleted. The rest of reading (positions,
rescaling, read_committed) is the KafkaSource's (runtime/sql/connectors.kafka_source).

`normalized` is the rule without state or I/O (tests/unit/test_sql_kafka_tables.py, exact lists).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from runtime.api.functions import KeyedProcessFunction
from runtime.connectors.kafka_core import KafkaRecord
from runtime.sql import types as T
from runtime.sql.catalog import TableDef
from runtime.sql.changelog import DELETE, INSERT, UPDATE_AFTER, UPDATE_BEFORE
from runtime.sql.connectors import TableSource, kafka_source
from runtime.sql.errors import SqlError
from runtime.sql.metadata import kafka_metadata, merge, readable

Row = tuple[Any, ...]


def upsert_record(record: KafkaRecord) -> tuple[str, dict[str, Any], dict[str, Any] | None]:
    """A record of an upsert-kafka topic -> (+U or -D, its key object, its value object or None). A record
    without a key is malformed (the source fails naming where it is, or skips it with
    'json.ignore-parse-errors')."""
    if record.key is None:
        raise ValueError("an upsert-kafka record needs a key (the PRIMARY KEY's columns as a JSON object)")
    key = json.loads(record.key)
    value = None if record.value is None else json.loads(record.value)
    if not isinstance(key, dict) or not (value is None or isinstance(value, dict)):
        raise ValueError("an upsert-kafka record's key and value are JSON objects")
    return (UPDATE_AFTER if value is not None else DELETE), key, value


def upsert_kafka_source(table: TableDef, computed: Callable[[Row], Row] | None) -> TableSource:
    """The source of an upsert-kafka table: (kind, row) pairs as the module docstring says."""
    if not table.primary_key:
        raise SqlError(f"table {table.name}: an 'upsert-kafka' table needs a PRIMARY KEY (...) NOT ENFORCED")
    metadata = readable(table)
    pairs = [(c.name, T.reader(c.type)) for c in table.physical]  # type: ignore[arg-type]
    key_columns = set(table.primary_key)

    def physical_row(kind: str, key: dict[str, Any], value: dict[str, Any] | None) -> Row:
        fields = {**(value or {}), **key} if value is not None else key
        return tuple(read(fields.get(name)) if value is not None or name in key_columns else None
                     for name, read in pairs)

    if metadata:  # the metadata values of each record's envelope beside what upsert_record read
        metadata_of = kafka_metadata(metadata)
        merged = merge(table.stored, metadata)
        inner = kafka_source(table, deserializer=lambda r: (upsert_record(r), metadata_of(r)))

        def stored_row(record: Any) -> tuple[str, Row]:
            (kind, key, value), meta = record
            return kind, merged(physical_row(kind, key, value), meta)
    else:
        inner = kafka_source(table, deserializer=upsert_record)

        def stored_row(record: Any) -> tuple[str, Row]:
            kind, key, value = record
            return kind, physical_row(kind, key, value)

    def to_row(record: Any) -> tuple[str, Row]:
        kind, row = stored_row(record)
        return kind, computed(row) if computed is not None else row

    return TableSource(inner, to_row, f"table {table.name}")


def primary_key_of(table: TableDef) -> Callable[[tuple[str, Row]], Any]:
    """The key a (kind, row) pair of the table is normalized under: its PRIMARY KEY's values."""
    declared = [c.name for c in table.columns]
    at = [declared.index(k) for k in table.primary_key]
    if len(at) == 1:
        (i,) = at
        return lambda pair: pair[1][i]
    return lambda pair: tuple(pair[1][i] for i in at)


def normalized(previous: Row | None, kind: str, row: Row) -> tuple[Row | None, list[tuple[str, Row]]]:
    """(the key's row after this record, the changes to emit): an upsert of a new key is +I, of a known key -U
    the old row and +U the new one (nothing when equal, as Flink drops an unchanged row); a delete of a known
    key is -D with the row it had, of an unknown key nothing."""
    if kind == DELETE:
        return None, ([] if previous is None else [(DELETE, previous)])
    if previous is None:
        return row, [(INSERT, row)]
    if previous == row:
        return row, []
    return row, [(UPDATE_BEFORE, previous), (UPDATE_AFTER, row)]


class ChangelogNormalizeFunction(KeyedProcessFunction):
    """Keyed by the PRIMARY KEY: the key's last row in state, the upserts and deletes read turned into a
    changelog (`normalized`)."""

    def open(self, ctx: Any) -> None:
        self.last = ctx.value_state("upsert:last", None)

    def process(self, record: Any, ctx: Any) -> None:
        kind, row = record
        stored = self.last.value()
        after, changes = normalized(None if stored is None else tuple(stored), kind, tuple(row))
        if after is None:
            self.last.clear()
        elif after != stored:
            self.last.update(after)
        for change in changes:
            ctx.emit(change)
