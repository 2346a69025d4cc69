"""Iceberg tables for the tests: a SQL catalog on SQLite in a temporary directory (pyiceberg's own), a table of
(key string, n long) in it, its rows and its snapshots' summaries read back."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def sqlite_catalog(directory: Path) -> dict[str, str]:
    """The catalog properties an IcebergSink takes (and `make_counts_table` uses)."""
    directory.mkdir(parents=True, exist_ok=True)
    return {"name": "tests", "type": "sql", "uri": f"sqlite:///{directory / 'catalog.db'}",
            "warehouse": f"file://{directory / 'warehouse'}"}


def make_counts_table(catalog: dict[str, str], name: str = "db.counts") -> None:
    import pyarrow as pa

    from runtime.connectors.iceberg import load_catalog

    cat = load_catalog(catalog)
    cat.create_namespace_if_not_exists(name.split(".")[0])
    cat.create_table(name, schema=pa.schema([("key", pa.string()), ("n", pa.int64())]))


def iceberg_rows(catalog: dict[str, str], name: str = "db.counts") -> list[tuple[Any, ...]]:
    from runtime.connectors.iceberg import load_catalog

    data = load_catalog(catalog).load_table(name).scan().to_arrow()
    return list(zip(*(data.column(c).to_pylist() for c in data.column_names), strict=True))


def iceberg_summaries(catalog: dict[str, str], name: str = "db.counts") -> list[dict[str, str]]:
    from runtime.connectors.iceberg import load_catalog

    table = load_catalog(catalog).load_table(name)
    return [dict(s.summary.additional_properties) for s in table.snapshots() if s.summary is not None]
