"""Delta and Iceberg tables as `sluice data verify` output: read through Arrow into Spark.

Spark here has no Delta or Iceberg jars, so a table is read with its Python library (deltalake's or pyiceberg's
`to_arrow`, which resolve the table's log or snapshot: only committed files) and handed to Spark as an Arrow
table (`spark.createDataFrame`). Its first column is the key, the next ones the values, in the order the
job's sink wrote them (`columns=[...]`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from runtime.data.spark import DataError

OUTPUT_FORMATS = ("files", "delta", "iceberg")


@dataclass(frozen=True, slots=True)
class OutputTable:
    """A verify output that is a table: `location` is the Delta table's path (or s3:// URL), or the Iceberg
    table's "namespace.table" in the catalog `catalog` (pyiceberg catalog properties)."""

    format: str
    location: str
    catalog: dict[str, str] | None = None

    @classmethod
    def parse(cls, output_format: str, location: str, catalog: str | None) -> OutputTable | None:
        """None for part files (the default); DataError for a format or catalog that does not fit."""
        if output_format not in OUTPUT_FORMATS:
            raise DataError(f"unknown --output-format {output_format!r}; known: {', '.join(OUTPUT_FORMATS)}")
        if output_format == "files":
            if catalog:
                raise DataError("--catalog is for --output-format iceberg")
            return None
        props = None
        if output_format == "iceberg":
            if not catalog:
                raise DataError("--output-format iceberg needs --catalog '{\"type\": \"sql\", \"uri\": ...}' "
                                "(pyiceberg catalog properties as JSON)")
            try:
                props = json.loads(catalog)
            except ValueError as exc:
                raise DataError(f"--catalog is not JSON: {exc}") from None
            if not isinstance(props, dict):
                raise DataError("--catalog must be a JSON object of pyiceberg catalog properties")
        elif catalog:
            raise DataError("--catalog is for --output-format iceberg")
        return cls(output_format, location, props)

    def to_arrow(self) -> Any:
        """The table's committed rows; DataError when there is no such table."""
        if self.format == "delta":
            try:
                from deltalake import DeltaTable
                from deltalake.exceptions import TableNotFoundError
            except ImportError:
                raise DataError("reading a Delta table needs the `delta` extra") from None
            from runtime.connectors.delta import storage_options

            try:
                return DeltaTable(self.location, storage_options=storage_options(self.location)).to_pyarrow_table()
            except TableNotFoundError:
                raise DataError(f"no Delta table at {self.location}") from None
        from runtime.common.extras import MissingExtra
        from runtime.connectors.iceberg import load_catalog

        try:
            return load_catalog(self.catalog or {}).load_table(self.location).scan().to_arrow()
        except MissingExtra as exc:
            raise DataError(str(exc)) from None
        except Exception as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise DataError(f"cannot read the Iceberg table {self.location}: {first}") from None

    def data_files(self) -> int:
        if self.format == "delta":
            from deltalake import DeltaTable

            from runtime.connectors.delta import storage_options

            return len(DeltaTable(self.location, storage_options=storage_options(self.location)).file_uris())
        from runtime.connectors.iceberg import load_catalog

        return sum(1 for _ in load_catalog(self.catalog or {}).load_table(self.location).scan().plan_files())


def table_frame(spark: Any, table: OutputTable, width: int) -> Any:
    """(key, v0, ..., v{width-1}, line) per row of the table, like verify's read of part files."""
    from pyspark.sql import functions as F

    data = table.to_arrow()
    names = [f"v{i}" for i in range(width)]
    if data.num_columns < width + 1:
        raise DataError(f"the {table.format} table {table.location} has {data.num_columns} columns, the query's "
                        f"rows {width + 1}")
    frame = spark.createDataFrame(data.select(list(range(width + 1))).rename_columns(["key", *names]))
    cols = [F.col("key"), *(F.col(n) for n in names)]
    return frame.select(F.col("key").cast("string").alias("key"),
                        *(F.col(n).try_cast("long").alias(n) for n in names),
                        F.to_json(F.array(*(c.cast("string") for c in cols))).alias("line"))
