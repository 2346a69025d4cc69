"""Reading a `jdbc` table as a scan (Flink's JDBC source: a bounded read of a PostgreSQL table).

Without partition options subtask 0 reads the whole table. With Flink's 'scan.partition.column' (a numeric
column), 'scan.partition.num', 'scan.partition.lower-bound' and 'scan.partition.upper-bound' the range is cut as
Flink's JdbcNumericBetweenParametersProvider cuts it (`partition_ranges`, pure) and split k is read by subtask
k mod parallelism with `WHERE column BETWEEN lo AND hi`, so, as in Flink, rows outside the bounds are not read.

Each split is read through a server-side cursor ('scan.fetch-size' rows a round trip) in a fixed order (the
table's PRIMARY KEY, else every column), so a position is (split, rows emitted of it) and a restore reads the
split again, skipping what was emitted: exactly once over a table that does not change while it is read (what
Flink's bounded JDBC source assumes too).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from runtime.connectors import postgres as pgc
from runtime.connectors.source import Source
from runtime.sql import types as T
from runtime.sql.catalog import TableDef
from runtime.sql.errors import SqlError
from runtime.sql.postgres_tables import check_table, jdbc_dsn

PARTITION_OPTIONS = ("scan.partition.column", "scan.partition.num", "scan.partition.lower-bound",
                     "scan.partition.upper-bound")
Split = tuple[int, int] | None  # a BETWEEN range of the partition column, None: the whole table


def partition_ranges(lower: int, upper: int, num: int) -> list[tuple[int, int]]:
    """[lower, upper] cut into `num` ranges as Flink cuts it (JdbcNumericBetweenParametersProvider.ofBatchNum):
    the first ones one longer when the count does not divide evenly, never more ranges than values."""
    count = upper - lower + 1
    num = min(num, count)
    size = -(-count // num)  # ceil
    big = count - (size - 1) * num  # how many ranges have `size` values; the rest size - 1
    out = []
    start = lower
    for i in range(num):
        end = start + size - 1 - (1 if i >= big else 0)
        out.append((start, end))
        start = end + 1
    return out


def scan_splits(table: TableDef) -> tuple[str | None, list[Split]]:
    """(the partition column or None, the splits) from the table's scan.partition.* options; all four or none."""
    opts = table.options
    given = [k for k in PARTITION_OPTIONS if k in opts]
    if not given:
        return None, [None]
    if len(given) != len(PARTITION_OPTIONS):
        missing = [k for k in PARTITION_OPTIONS if k not in opts]
        raise SqlError(f"table {table.name}: the 'scan.partition.*' options go together; '{missing[0]}' is "
                       "missing")
    column = opts["scan.partition.column"]
    declared = next((c for c in table.physical if c.name == column), None)
    if declared is None or declared.type is None or not declared.type.integral:
        raise SqlError(f"table {table.name}: 'scan.partition.column' must name a numeric (integral) column of the "
                       f"table, got '{column}'")
    try:
        lower, upper = int(opts["scan.partition.lower-bound"]), int(opts["scan.partition.upper-bound"])
        num = int(opts["scan.partition.num"])
    except ValueError:
        raise SqlError(f"table {table.name}: 'scan.partition.num', 'scan.partition.lower-bound' and "
                       "'scan.partition.upper-bound' must be whole numbers") from None
    if num < 1 or lower > upper:
        raise SqlError(f"table {table.name}: 'scan.partition.num' must be at least 1 and 'scan.partition."
                       f"lower-bound' at most 'scan.partition.upper-bound', got {num}, {lower}, {upper}")
    return column, list(partition_ranges(lower, upper, num))


class JdbcScanSource(Source):
    """The bounded read of a jdbc table, its rows in the table's column order (module docstring)."""

    bounded = True
    extras = ("postgres",)

    def __init__(self, table: TableDef) -> None:
        self.dsn = jdbc_dsn(table)
        self.table_name = table.options["table-name"]
        self.columns = [c.name for c in table.physical]
        self.readers = [T.reader(c.type) for c in table.physical]  # type: ignore[arg-type]
        self.partition_column, self.splits = scan_splits(table)
        self.order = list(table.primary_key) or self.columns
        fetch = table.options.get("scan.fetch-size", "0")
        if not fetch.isdigit():
            raise SqlError(f"table {table.name}: 'scan.fetch-size' must be a whole number, got '{fetch}'")
        self.fetch_size = int(fetch) or 2000  # Flink's 0: the driver's choice; psycopg2's is 2000

    def check_at_submit(self, context: Any) -> None:
        """The coordinator's submit check: the table, its columns and the SELECT privilege, or one line."""
        check_table(self.dsn, self.table_name, self.columns, f"jdbc table {self.table_name}")

    def open(self, subtask_index: int, parallelism: int) -> None:
        super().open(subtask_index, parallelism)
        self._mine = splits_of(self.splits, subtask_index, parallelism)
        self._split = 0  # index into _mine
        self._emitted = 0  # rows of the current split emitted
        self._conn: Any = None
        self._cursor: Any = None

    def _statement(self, split: Split) -> Any:
        sql = pgc.psycopg2().sql
        schema, name = pgc.split_table(self.table_name)
        query = sql.SQL("SELECT {} FROM {}.{}").format(sql.SQL(", ").join(map(sql.Identifier, self.columns)),
                                                       sql.Identifier(schema), sql.Identifier(name))
        if split is not None:
            query += sql.SQL(" WHERE {} BETWEEN %s AND %s").format(sql.Identifier(str(self.partition_column)))
        return query + sql.SQL(" ORDER BY {}").format(sql.SQL(", ").join(map(sql.Identifier, self.order)))

    def read_batch(self, max_records: int) -> list[Any] | None:
        while self._split < len(self._mine):
            if self._cursor is None:
                if self._conn is None:
                    self._conn = pgc.connect(self.dsn)
                    self._conn.set_session(readonly=True)
                split = self._mine[self._split]
                self._cursor = self._conn.cursor(name=f"sluice_scan_{self.subtask_index}")
                self._cursor.itersize = self.fetch_size
                self._cursor.execute(self._statement(split), split)
                if self._emitted:
                    self._cursor.scroll(self._emitted)  # a restore: what was emitted before it
            rows = self._cursor.fetchmany(max_records)
            if rows:
                self._emitted += len(rows)
                readers = self.readers
                return [tuple(read(v) for read, v in zip(readers, r, strict=True)) for r in rows]
            self._cursor.close()
            self._conn.commit()  # the cursor's transaction
            self._cursor = None
            self._split += 1
            self._emitted = 0
        return None

    def position(self) -> Any:
        return [self._split, self._emitted]

    def restore(self, position: Any) -> None:
        self._close_cursor()
        self._split, self._emitted = int(position[0]), int(position[1])

    def _close_cursor(self) -> None:
        if self._cursor is not None:
            try:
                self._cursor.close()
                self._conn.rollback()
            except Exception:  # a broken connection: nothing of a read-only cursor to lose
                pass
            self._cursor = None

    def close(self) -> None:
        self._close_cursor()
        if self._conn is not None:
            try:
                self._conn.close()
            except Exception:  # a broken connection: nothing more to lose
                pass
            self._conn = None


def splits_of(splits: Sequence[Split], subtask_index: int, parallelism: int) -> list[Split]:
    """The splits subtask `subtask_index` of `parallelism` reads: split k goes to subtask k mod parallelism."""
    return list(splits[subtask_index::parallelism])
