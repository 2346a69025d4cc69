"""Table connectors: the `connector` option of a CREATE TABLE -> a Sluice Source or Sink over rows (tuples).

A table source wraps a DataStream source (runtime/connectors) and turns what it reads into rows in `read_batch`:
physical columns in declared order, converted to the row's form (runtime/sql/types.py), then computed columns.
Positions, restores and rescaling are the wrapped source's, untouched. A table sink turns rows back into what
the format writes (a JSON object per row) and delegates the two-phase commit to the wrapped sink, so file
output stays exactly once.

Changelog rows (an updating query) reach a sink as (kind, row) pairs, kind one of +I -U +U -D: `print` prints
them as Flink does (`+U[a, 3]`), `blackhole` drops them, a filesystem table with a PRIMARY KEY writes them as
upserts (`{"op": "+U", "data": {...}}`, the -U rows dropped: the key says what a row replaces).

Kafka tables plan onto KafkaSource/KafkaSink (runtime/connectors), so they are exactly as exact: `kafka` reads and
appends JSON objects (positions in checkpoints; 'sink.delivery-guarantee' = 'exactly-once' writes in transactions
with the checkpoint); `upsert-kafka` writes a changelog keyed by the PRIMARY KEY: +I/+U the row as the value,
-D a tombstone (null value), -U dropped; read, it is that changelog again (runtime/sql/kafka_tables.py). The
table source hands the KafkaSource's own hooks (submit check, partitions dealt on a rescale, per-partition
watermarks, offsets committed, metrics) through.
"""

from __future__ import annotations

import csv
import hashlib
import re
import sys
from collections.abc import Callable
from typing import Any

from runtime.connectors import kafka_core
from runtime.connectors.files import FileSink, JsonLinesSource, ParquetSource, list_input_files
from runtime.connectors.kafka_core import KafkaRecord
from runtime.connectors.kafka_sink import DELIVERIES, KafkaSink
from runtime.connectors.kafka_source import KafkaSource
from runtime.connectors.sinks import DiscardSink, Sink
from runtime.connectors.source import SideOutputBatch, Source
from runtime.sql import types as T
from runtime.sql.catalog import TableDef
from runtime.sql.errors import SqlError
from runtime.sql.metadata import file_metadata, kafka_metadata, kafka_written, merge, readable, writable

SOURCE_CONNECTORS = ("filesystem", "datagen", "kafka", "upsert-kafka", "postgres-cdc", "jdbc")
SINK_CONNECTORS = ("filesystem", "print", "blackhole", "kafka", "upsert-kafka", "jdbc")
FORMATS = ("json", "csv", "parquet")


class CsvLinesSource(JsonLinesSource):
    """CSV files (no header: Flink's csv format has none), one record per line, split by file like JSON lines."""

    def __init__(self, path: str, delimiter: str = ",") -> None:
        super().__init__(path)
        self.delimiter = delimiter

    def _list_units(self) -> list[Any]:
        return list_input_files(self.path, (".csv",))

    def _records(self, items: list[Any]) -> list[Any]:
        lines = [t for t in items if t.strip()]
        return [tuple(r) for r in csv.reader(lines, delimiter=self.delimiter)]


class _FileRows:
    """A file source whose records come paired with the metadata values of the file they were read from
    (`file_metadata`, set by make_source; computed once per file). _UnitSource calls `_records` right after
    loading a chunk of unit `_items_unit`."""

    file_metadata: Callable[[str], tuple[Any, ...]]
    _units: list[Any]
    _items_unit: int | None

    def _records(self, items: list[Any]) -> list[Any]:
        records = super()._records(items)  # type: ignore[misc]
        unit = self._units[self._items_unit]  # type: ignore[index]
        path = unit[0] if isinstance(unit, tuple) else unit  # a Parquet unit is (file, row group)
        cache = self.__dict__.setdefault("_file_meta", {})
        meta = cache.get(path)
        if meta is None:
            meta = cache[path] = self.file_metadata(path)
        return [(r, meta) for r in records]


class JsonFileRows(_FileRows, JsonLinesSource):
    pass


class CsvFileRows(_FileRows, CsvLinesSource):
    pass


class ParquetFileRows(_FileRows, ParquetSource):
    pass


class DatagenSource(Source):
    """Flink's `datagen`, deterministic: row n of the table is the same at any parallelism and after a restore
    (subtask i of p makes rows i, i+p, ...). Options as Flink's: 'number-of-rows' (unbounded without),
    'rows-per-second', and per column 'fields.<col>.kind' = 'sequence' ('start', 'end') or 'random' ('min',
    'max', 'length' for strings). A TIMESTAMP column is 'fields.<col>.start-ms' + n * 'fields.<col>.step-ms'
    (Sluice's: Flink draws timestamps from the wall clock, which no replay can repeat)."""

    def __init__(self, table: TableDef) -> None:
        opts = table.options
        self.rows = int(opts["number-of-rows"]) if "number-of-rows" in opts else None
        self.bounded = self.rows is not None
        self.rate = float(opts["rows-per-second"]) if "rows-per-second" in opts else None
        self.seed = int(opts.get("seed", "0"))
        self.columns = [(c.name, c.type) for c in table.physical]
        self.options = dict(opts)

    def open(self, subtask_index: int, parallelism: int) -> None:
        super().open(subtask_index, parallelism)
        self._next = 0  # rows of this subtask made so far
        self._makers = [self._maker(name, t) for name, t in self.columns]
        import time

        self._clock = time.monotonic
        self._started = self._clock()

    def _maker(self, name: str, t: Any) -> Callable[[int], Any]:
        o = self.options
        prefix = f"fields.{name}."
        kind = o.get(prefix + "kind", "random")
        if t.timestamp:
            start, step = int(o.get(prefix + "start-ms", "1700000000000")), int(o.get(prefix + "step-ms", "1"))
            return lambda n: start + n * step
        if kind == "sequence":
            start = int(o.get(prefix + "start", "0"))
            return lambda n: start + n if t.integral else str(start + n)
        seed = f"{self.seed}:{name}".encode()

        def draw(n: int) -> int:
            return int.from_bytes(hashlib.blake2b(seed + n.to_bytes(8, "little"), digest_size=8).digest(), "little")

        if t.integral:
            lo, hi = int(o.get(prefix + "min", "0")), int(o.get(prefix + "max", str(2**31 - 1)))
            return lambda n: lo + draw(n) % (hi - lo + 1)
        if t.name in ("DOUBLE", "FLOAT"):
            lo_f, hi_f = float(o.get(prefix + "min", "0")), float(o.get(prefix + "max", "1"))
            return lambda n: lo_f + (draw(n) / 2**64) * (hi_f - lo_f)
        if t.name == "BOOLEAN":
            return lambda n: bool(draw(n) & 1)
        length = int(o.get(prefix + "length", "10"))
        alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
        return lambda n: "".join(alphabet[(draw(n) >> (5 * i)) % 36] for i in range(min(length, 12)))

    def read_batch(self, max_records: int) -> list[Any] | None:
        p, i = self.parallelism, self.subtask_index
        if self.rate is not None:
            allowed = int((self._clock() - self._started) * self.rate / p) - self._next
            if allowed <= 0:
                return []
            max_records = min(max_records, allowed)
        out = []
        makers = self._makers
        for _ in range(max_records):
            n = i + self._next * p
            if self.rows is not None and n >= self.rows:
                break
            out.append(tuple(m(n) for m in makers))
            self._next += 1
        if not out and self.rows is not None:
            return None
        return out

    def position(self) -> Any:
        return self._next

    def restore(self, position: Any) -> None:
        self._next = int(position)


class TableSource(Source):
    """A table over a connector's source: records in, rows (tuples) out (module docstring)."""

    # what the runtime asks a source for when it has it (getattr): the wrapped source's, passed through
    HOOKS = ("check_at_submit", "checkpoint_complete", "watermark_generator", "partition_statistics",
             "redistribute", "redistributes_positions")

    def __init__(self, inner: Source, to_row: Callable[[Any], tuple[Any, ...]], describe: str) -> None:
        self.inner = inner
        self.to_row = to_row
        self.describe = describe
        self.bounded = inner.bounded
        self.rescalable = inner.rescalable
        self.subtask_splits = inner.subtask_splits
        self.extras = inner.extras
        for hook in self.HOOKS:
            if hasattr(inner, hook):
                setattr(self, hook, getattr(inner, hook))

    def open(self, subtask_index: int, parallelism: int) -> None:
        super().open(subtask_index, parallelism)
        self.inner.open(subtask_index, parallelism)

    def read_batch(self, max_records: int) -> list[Any] | None:
        batch = self.inner.read_batch(max_records)
        if not batch or type(batch) is SideOutputBatch:  # records the source set aside are not rows
            return batch
        to_row = self.to_row
        try:
            return [to_row(r) for r in batch]
        except (ValueError, TypeError, KeyError, IndexError) as exc:
            bad = next(r for r in batch if _fails(to_row, r))
            raise ValueError(f"{self.describe}: cannot read record {str(bad)[:200]}: {exc}") from exc

    def idle_wait_s(self) -> float:
        return self.inner.idle_wait_s()

    def position(self) -> Any:
        return self.inner.position()

    def restore(self, position: Any) -> None:
        self.inner.restore(position)

    def close(self) -> None:
        self.inner.close()

    def lanes(self, position: Any, emitted: int, subtask_index: int, parallelism: int) -> list[list[int]]:
        return self.inner.lanes(position, emitted, subtask_index, parallelism)


def _fails(fn: Callable[[Any], Any], record: Any) -> bool:
    try:
        fn(record)
    except Exception:
        return True
    return False


class RowFileSink(FileSink):
    """A FileSink of rows: each is encoded (a JSON object; None drops it) and written as FileSink writes, so
    admission (an earlier run's files), the two-phase commit and the restore are FileSink's own."""

    def __init__(self, path: str, encode: Callable[[Any], Any | None], **kwargs: Any) -> None:
        super().__init__(path, **kwargs)
        self.encode = encode

    def write(self, record: Any) -> None:
        value = self.encode(record)
        if value is not None:
            super().write(value)


class ChangelogPrintSink(Sink):
    """Flink's `print`: `+I[a, b]` per row (a plain row of an insert-only query is +I), prefixed `N> ` when
    parallel, and with 'print-identifier' before that."""

    def __init__(self, identifier: str, changelog: bool, fields: list[Callable[[Any], Any] | None]) -> None:
        super().__init__()
        self.identifier = identifier
        self.changelog = changelog
        self.fields = fields

    def write(self, record: Any) -> None:
        kind, row = record if self.changelog else ("+I", record)
        values = ", ".join(_print_value(w(v) if w else v) for w, v in zip(self.fields, row, strict=True))
        tag = f"{self.subtask_index + 1}> " if self.parallelism > 1 else ""
        ident = f"{self.identifier}:" if self.identifier else ""
        sys.stdout.write(f"{ident}{tag}{kind}[{values}]\n")

    def finish(self) -> None:
        sys.stdout.flush()


def _print_value(v: Any) -> str:
    if v is None:
        return "<NULL>"
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


# -- building them from a table's options ---------------------------------------------------------------------


def make_source(table: TableDef, computed: Callable[[tuple[Any, ...]], tuple[Any, ...]] | None) -> Source:
    """The source of `table` (filesystem json/csv/parquet, datagen, kafka, jdbc; postgres-cdc: a changelog of
    (kind, row) pairs, runtime/sql/postgres_tables.py), its rows carrying the computed columns."""
    connector = table.connector
    if connector == "postgres-cdc":
        from runtime.sql.postgres_tables import CdcTableSource
        return CdcTableSource(table, computed)
    physical = table.physical
    readers = [T.reader(c.type) for c in physical]  # type: ignore[arg-type]
    names = [c.name for c in physical]
    metadata = readable(table)
    if connector == "datagen":
        inner: Source = DatagenSource(table)
        base: Callable[[Any], tuple[Any, ...]] = tuple
    elif connector == "filesystem":
        path = _required(table, "path")
        fmt = _format(table)
        if fmt == "json":
            inner = (JsonFileRows if metadata else JsonLinesSource)(path)
            base = _json_object(names, readers)
        elif fmt == "csv":
            inner = (CsvFileRows if metadata else CsvLinesSource)(path, table.options.get("csv.field-delimiter", ","))
            base = _positional(readers, table.name)
        else:
            inner = (ParquetFileRows if metadata else ParquetSource)(path, columns=names)
            base = _positional(readers, table.name)
        if metadata:  # records come as (record, the file's metadata values): FileRows
            inner.file_metadata = file_metadata(metadata)  # type: ignore[union-attr]
            base = _with_metadata(base, merge(table.stored, metadata))
    elif connector == "jdbc":  # a bounded read of the table (runtime/sql/jdbc_scan.py): its rows, converted
        from runtime.sql.jdbc_scan import JdbcScanSource
        inner = JdbcScanSource(table)
        base = tuple
    elif connector == "kafka":  # (an upsert-kafka table's source is runtime/sql/kafka_tables.py's)
        if metadata:  # each record's value with the metadata values of its envelope
            inner = kafka_source(table, deserializer=value_with_metadata(kafka_metadata(metadata)))
            base = _with_metadata(_json_object(names, readers), merge(table.stored, metadata))
        else:
            inner = kafka_source(table)
            base = _json_object(names, readers)
    else:
        raise SqlError(f"table {table.name}: connector '{connector}' cannot be read (sources: "
                       f"{', '.join(SOURCE_CONNECTORS)})")
    if computed is None:
        to_row = base
    else:
        def to_row(record: Any) -> tuple[Any, ...]:
            return computed(base(record))
    return TableSource(inner, to_row, f"table {table.name}")


def value_with_metadata(metadata_of: Callable[[KafkaRecord], tuple[Any, ...]]
                        ) -> Callable[[KafkaRecord], tuple[Any, tuple[Any, ...]]]:
    """A Kafka deserializer: (the record's JSON value, the values of the table's metadata columns)."""
    def decode(record: KafkaRecord) -> tuple[Any, tuple[Any, ...]]:
        return kafka_core.json_value(record), metadata_of(record)
    return decode


def _with_metadata(base: Callable[[Any], tuple[Any, ...]],
                   merged: Callable[[tuple[Any, ...], tuple[Any, ...]], tuple[Any, ...]]
                   ) -> Callable[[Any], tuple[Any, ...]]:
    """(record, metadata values) -> the row of the table's stored columns."""
    def row(pair: Any) -> tuple[Any, ...]:
        record, meta = pair
        return merged(base(record), meta)
    return row


def _json_object(names: list[str], readers: list[Callable[[Any], Any]]) -> Callable[[Any], tuple[Any, ...]]:
    """A JSON object -> the row of its columns (a missing one is NULL).

    Generated as one tuple display, `(r0(get('k')), r1(get('seq')), ...)`: a generator over (name, reader) pairs
    cost about three times as much per row (a frame and a resumption per column), which showed in the SQL
    interval join's profile (docs/BENCHMARKS.md)."""
    if len(names) != len(readers):
        raise ValueError(f"{len(names)} column names and {len(readers)} readers")
    namespace = {f"r{i}": read for i, read in enumerate(readers)}
    columns = "".join(f"r{i}(get({name!r})), " for i, name in enumerate(names))
    source = f"def base(record):\n    get = record.get\n    return ({columns})\n"
    exec(compile(source, "<json row>", "exec"), namespace)  # noqa: S102 - our own codegen: names are repr()ed
    base: Callable[[Any], tuple[Any, ...]] = namespace["base"]
    return base


def _positional(readers: list[Callable[[Any], Any]], name: str) -> Callable[[Any], tuple[Any, ...]]:
    width = len(readers)

    def convert(record: Any) -> tuple[Any, ...]:
        if len(record) != width:
            raise ValueError(f"{len(record)} fields where table {name} has {width} columns")
        return tuple(read(v) for read, v in zip(readers, record, strict=True))
    return convert


def make_sink(table: TableDef, *, changelog: bool) -> Sink:
    """The sink of `table`; `changelog`: it receives (kind, row) pairs of an updating query."""
    connector = table.connector
    physical = table.physical
    writers = [T.writer(c.type) for c in physical]  # type: ignore[arg-type]
    names = [c.name for c in physical]
    if connector == "print":
        return ChangelogPrintSink(table.options.get("print-identifier", ""), changelog, writers)
    if connector == "blackhole":
        return DiscardSink()
    if connector in ("kafka", "upsert-kafka"):
        return kafka_sink(table, changelog=changelog)
    if connector == "jdbc":
        from runtime.sql.postgres_tables import jdbc_sink
        return jdbc_sink(table, changelog=changelog)
    if connector != "filesystem":
        raise SqlError(f"table {table.name}: connector '{connector}' cannot be written (sinks: "
                       f"{', '.join(SINK_CONNECTORS)})")
    path = _required(table, "path")
    fmt = _format(table)
    if fmt == "csv":
        raise SqlError(f"table {table.name}: the csv format is read-only in Sluice SQL for now; write json or "
                       "parquet")
    settings = {"format": "parquet" if fmt == "parquet" else "jsonl",
                "if_exists": table.options.get("sink.if-exists", "fail")}
    pairs = list(zip(names, writers, strict=True))

    def as_object(row: Any) -> dict[str, Any]:
        return {name: (w(v) if w else v) for (name, w), v in zip(pairs, row, strict=True)}

    if not changelog:
        return RowFileSink(path, as_object, **settings)

    def upsert(record: Any) -> Any:
        kind, row = record
        if kind == "-U":
            return None  # the +U that follows replaces it by key
        return {"op": kind, "data": as_object(row)}
    return RowFileSink(path, upsert, **settings)


def _required(table: TableDef, key: str) -> str:
    value = table.options.get(key)
    if not value:
        raise SqlError(f"table {table.name}: the '{table.connector}' connector needs the option '{key}'")
    return value


def _format(table: TableDef) -> str:
    fmt = table.options.get("format", "")
    if fmt not in FORMATS:
        raise SqlError(f"table {table.name}: 'format' must be one of {', '.join(FORMATS)}, got '{fmt}'")
    return fmt



# -- Kafka tables (Flink's 'kafka' and 'upsert-kafka' options) --------------------------------------------------

STARTUP_MODES = ("earliest-offset", "latest-offset", "group-offsets", "timestamp", "specific-offsets")
# the 'properties.*' Sluice passes on (the rest are Java client settings with no aiokafka counterpart here)
KAFKA_PROPERTIES = ("bootstrap.servers", "group.id", "isolation.level", "auto.offset.reset",
                    "transaction.timeout.ms")


def _skip_malformed(record: Any, error: BaseException) -> None:
    """'json.ignore-parse-errors' = 'true': a record that is not JSON is skipped (still counted as read)."""
    return None


def _kafka_common(table: TableDef) -> str:
    """The bootstrap servers, after refusing what this connector does not take."""
    opts = table.options
    for key in opts:
        if key.startswith("properties.") and key[len("properties."):] not in KAFKA_PROPERTIES:
            raise SqlError(f"table {table.name}: option '{key}' is not supported (properties: "
                           f"{', '.join(KAFKA_PROPERTIES)})")
    for key in ("format", "value.format", "key.format"):
        if key in opts and opts[key] != "json":
            raise SqlError(f"table {table.name}: '{key}' must be 'json' (the one format of Kafka tables for now), "
                           f"got '{opts[key]}'")
    return _required(table, "properties.bootstrap.servers")


def _sink_topic(table: TableDef) -> str:
    if "topic-pattern" in table.options:
        raise SqlError(f"table {table.name}: 'topic-pattern' is for reading; a sink writes to one 'topic'")
    topic = _required(table, "topic")
    if ";" in topic:
        raise SqlError(f"table {table.name}: a sink writes to one topic, got '{topic}'")
    return topic


def _source_topics(table: TableDef) -> tuple[list[str], str | None]:
    """Flink's 'topic' ('a;b': a list) or 'topic-pattern' (a regular expression over topic names, matched again
    every 'scan.topic-partition-discovery.interval' while the job runs): exactly one of them."""
    opts = table.options
    if ("topic" in opts) == ("topic-pattern" in opts):
        raise SqlError(f"table {table.name}: name the topics with exactly one of 'topic' and 'topic-pattern'")
    if "topic-pattern" in opts:
        pattern = opts["topic-pattern"]
        try:
            re.compile(pattern)
        except re.error as exc:
            raise SqlError(f"table {table.name}: 'topic-pattern' is not a regular expression: {exc}") from None
        return [], pattern
    topics = [t.strip() for t in _required(table, "topic").split(";") if t.strip()]
    return topics, None


def _discovery_interval_s(table: TableDef) -> float | None:
    """'scan.topic-partition-discovery.interval': how often new partitions and topics are looked for (Flink's
    default, 5 min; '0' turns discovery off)."""
    from runtime.sql.postgres_tables import duration_ms

    text = table.options.get("scan.topic-partition-discovery.interval", "5 min")
    try:
        ms = duration_ms(text)
    except ValueError:
        raise SqlError(f"table {table.name}: 'scan.topic-partition-discovery.interval' must be a duration ('30 s', "
                       f"'5 min'), got '{text}'") from None
    return ms / 1000 if ms else None


def kafka_start(table: TableDef, topics: list[str]) -> kafka_core.Start:
    """'scan.startup.mode' (Flink's names) -> where partitions start; the default is Flink's, group-offsets,
    when the table names a group, else earliest-offset. group-offsets without a committed offset falls back to
    'properties.auto.offset.reset' (earliest, or latest)."""
    opts = table.options
    group = opts.get("properties.group.id")
    mode = opts.get("scan.startup.mode", "group-offsets" if group else "earliest-offset")
    if mode not in STARTUP_MODES:
        raise SqlError(f"table {table.name}: 'scan.startup.mode' must be one of {', '.join(STARTUP_MODES)}, "
                       f"got '{mode}'")
    if mode == "earliest-offset":
        return kafka_core.Start(kafka_core.EARLIEST)
    if mode == "latest-offset":
        return kafka_core.Start(kafka_core.LATEST)
    if mode == "group-offsets":
        if not group:
            raise SqlError(f"table {table.name}: 'scan.startup.mode' = 'group-offsets' needs "
                           "'properties.group.id'")
        fallback = opts.get("properties.auto.offset.reset", "earliest")
        if fallback not in (kafka_core.EARLIEST, kafka_core.LATEST):
            raise SqlError(f"table {table.name}: 'properties.auto.offset.reset' must be earliest or latest, "
                           f"got '{fallback}'")
        return kafka_core.Start(kafka_core.COMMITTED, fallback=fallback)
    if mode == "timestamp":
        millis = _required(table, "scan.startup.timestamp-millis")
        if not millis.isdigit():
            raise SqlError(f"table {table.name}: 'scan.startup.timestamp-millis' must be milliseconds since the "
                           f"epoch, got '{millis}'")
        return kafka_core.Start("timestamp", timestamp_ms=int(millis))
    spec = _required(table, "scan.startup.specific-offsets")
    if len(topics) != 1:
        raise SqlError(f"table {table.name}: 'scan.startup.specific-offsets' needs the table to read one 'topic'")
    topic = topics[0]
    offsets = []
    for item in spec.split(";"):
        fields = dict(f.strip().split(":", 1) for f in item.split(",") if ":" in f)
        if set(fields) != {"partition", "offset"} or not (fields["partition"].isdigit()
                                                          and fields["offset"].isdigit()):
            raise SqlError(f"table {table.name}: 'scan.startup.specific-offsets' is "
                           f"'partition:0,offset:42;partition:1,offset:300', got '{spec}'")
        offsets.append((topic, int(fields["partition"]), int(fields["offset"])))
    return kafka_core.Start("offsets", offsets=tuple(sorted(offsets)))


def kafka_source(table: TableDef, deserializer: str | Callable[[Any], Any] = "json") -> KafkaSource:
    """The KafkaSource of a 'kafka' table (its values JSON objects, one per row) or, with the deserializer of
    runtime/sql/kafka_tables.py, of an 'upsert-kafka' one."""
    opts = table.options
    servers = _kafka_common(table)
    topics, pattern = _source_topics(table)
    bounded = opts.get("scan.bounded.mode", "unbounded")
    if bounded not in ("unbounded", "latest-offset"):
        raise SqlError(f"table {table.name}: 'scan.bounded.mode' must be unbounded or latest-offset, got "
                       f"'{bounded}'")
    ignore = opts.get("json.ignore-parse-errors", "false").lower()
    if ignore not in ("true", "false"):
        raise SqlError(f"table {table.name}: 'json.ignore-parse-errors' must be true or false, got '{ignore}'")
    return KafkaSource(servers, topics, topic_pattern=pattern, group_id=opts.get("properties.group.id"),
                       start=kafka_start(table, topics), bounded=bounded == "latest-offset", deserializer=deserializer,
                       on_malformed=_skip_malformed if ignore == "true" else "fail",
                       isolation_level=opts.get("properties.isolation.level", "read_committed"),
                       discovery_interval_s=_discovery_interval_s(table))


class UpsertKafkaSink(KafkaSink):
    """upsert-kafka: a changelog keyed by the primary key; a -U row is dropped (the +U after it replaces it by
    key), a -D row is a tombstone (the serializer's None value)."""

    def write(self, record: Any) -> None:
        if record[0] != "-U":
            super().write(record)


def kafka_sink(table: TableDef, *, changelog: bool) -> KafkaSink:
    """The KafkaSink of a 'kafka' (append) or 'upsert-kafka' (a changelog keyed by the primary key) table: JSON
    objects as values (and keys: 'key.fields' of a kafka table, the primary key of an upsert-kafka one)."""
    opts = table.options
    servers, topic = _kafka_common(table), _sink_topic(table)
    delivery = opts.get("sink.delivery-guarantee", "at-least-once")
    if delivery not in DELIVERIES:
        raise SqlError(f"table {table.name}: 'sink.delivery-guarantee' must be one of {', '.join(DELIVERIES)}, "
                       f"got '{delivery}'")
    prefix = opts.get("sink.transactional-id-prefix")
    if delivery == "exactly-once" and not prefix:
        raise SqlError(f"table {table.name}: 'sink.delivery-guarantee' = 'exactly-once' needs "
                       "'sink.transactional-id-prefix' (unique to this table's sink)")
    timeout = opts.get("properties.transaction.timeout.ms", "60000")
    if not timeout.isdigit():
        raise SqlError(f"table {table.name}: 'properties.transaction.timeout.ms' must be milliseconds, got "
                       f"'{timeout}'")
    persisted = table.persisted  # a row's columns: physical and persisted metadata (headers, timestamp)
    names = [c.name for c in persisted]
    writers = [T.writer(c.type) for c in persisted]  # type: ignore[arg-type]
    physical_names = {c.name for c in table.physical}
    upsert = table.connector == "upsert-kafka"
    if upsert:
        if not table.primary_key:
            raise SqlError(f"table {table.name}: an 'upsert-kafka' table needs a PRIMARY KEY (...) NOT ENFORCED")
        for key in ("key.format", "value.format"):
            _required(table, key)
        key_fields = list(table.primary_key)
    else:
        key_fields = [f for f in opts.get("key.fields", "").split(";") if f]
        unknown = [f for f in key_fields if f not in physical_names]
        if unknown:
            raise SqlError(f"table {table.name}: 'key.fields' names {', '.join(unknown)}, not columns of the table")
        if key_fields and "key.format" not in opts:
            raise SqlError(f"table {table.name}: 'key.fields' needs 'key.format' = 'json'")
    include = opts.get("value.fields-include", "ALL").upper()
    if include not in ("ALL", "EXCEPT_KEY"):
        raise SqlError(f"table {table.name}: 'value.fields-include' must be ALL or EXCEPT_KEY, got '{include}'")
    value_fields = [(i, n, w) for i, (n, w) in enumerate(zip(names, writers, strict=True))
                    if n in physical_names and (include == "ALL" or n not in key_fields)]
    key_at = [(names.index(f), f, writers[names.index(f)]) for f in key_fields]
    encode, key_of = kafka_row_codec(value_fields, key_at, changelog=changelog)
    headers, timestamp = kafka_written(writable(table), persisted)
    if changelog:  # the row of a (kind, row) pair
        headers = None if headers is None else (lambda h: lambda record: h(record[1]))(headers)
        timestamp = None if timestamp is None else (lambda t: lambda record: t(record[1]))(timestamp)
    kind = UpsertKafkaSink if upsert and changelog else KafkaSink
    if not upsert and changelog:  # the planner refuses this (changelog.sink_accepts): a guard, not a path
        raise SqlError(f"table {table.name}: a 'kafka' table appends; write an updating query to 'upsert-kafka'")
    return kind(servers, topic, delivery=delivery, transactional_id_prefix=prefix, key=key_of, serializer=encode,
                headers=headers, timestamp=timestamp, transaction_timeout_ms=int(timeout))


Field = tuple[int, str, Callable[[Any], Any] | None]


def kafka_row_codec(value_fields: list[Field], key_fields: list[Field], *, changelog: bool
                    ) -> tuple[Callable[[Any], bytes | None], Callable[[Any], bytes | None] | None]:
    """(value serializer, key function) of a row, or of a (kind, row) pair when `changelog`: JSON objects of
    the fields (position, name, writer); a -D row's value is None (a tombstone)."""

    def obj(fields: list[Field], row: tuple[Any, ...]) -> bytes:
        return kafka_core.encode_json({n: (w(row[i]) if w else row[i]) for i, n, w in fields})

    if changelog:
        def encode(record: Any) -> bytes | None:
            kind, row = record
            return None if kind == "-D" else obj(value_fields, row)

        def key_of(record: Any) -> bytes | None:
            return obj(key_fields, record[1])
    else:
        def encode(record: Any) -> bytes | None:
            return obj(value_fields, record)

        def key_of(record: Any) -> bytes | None:
            return obj(key_fields, record)
    return encode, key_of if key_fields else None
