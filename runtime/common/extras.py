"""The optional parts of the install (pyproject's extras), and the one line that says how to add one.

A plain `pip install sluice-dataflow` runs jobs with the generator and JSON-lines sources, the JSON-lines
file sink and the memory state backend. Everything else needs an extra: Parquet (pyarrow, most of the
install's size), the RocksDB and remote state backends, s3:// checkpoints, the NATS and PostgreSQL
connectors, and PySpark for `sluice data`. Each connector imports its library lazily; the coordinator asks
`missing_for` at submit, so a job that needs an absent extra is refused then, with the install line, instead
of failing on the workers and restarting until its attempts run out.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable

DISTRIBUTION = "sluice-dataflow"  # the name on PyPI; the command is still `sluice`, the packages runtime & co.

# extra -> the modules it installs that sluice imports (what makes the extra usable)
EXTRAS: dict[str, tuple[str, ...]] = {
    "parquet": ("pyarrow.parquet",),
    "rocksdb": ("rocksdict",),
    "remote": ("valkey",),
    "s3": ("obstore",),
    "nats": ("nats.js",),
    "delta": ("deltalake",),
    "iceberg": ("pyiceberg.catalog.sql",),
    "postgres": ("psycopg2.extras",),
    "kafka": ("aiokafka",),
    "spark": ("pyspark", "pyarrow.parquet"),
    "sql": ("sqlglot",),
    "otel": ("opentelemetry.sdk.trace", "opentelemetry.exporter.otlp.proto.http.trace_exporter"),
}

# why a job needs the extra, for the message
USES = {"parquet": "Parquet files", "rocksdb": "the rocksdb state backend", "remote": "the remote state backend",
        "s3": "s3:// paths", "nats": "the NATS connector", "spark": "sluice data",
        "delta": "the Delta Lake sink", "iceberg": "the Iceberg sink",
        "spark-connect": "sluice data against a running Spark (--master sc://...)",
        "postgres": "the PostgreSQL connectors",
        "kafka": "the Kafka connector",
        "sql": "SQL jobs",
        "otel": "the OTLP export (--otlp-endpoint)"}


class MissingExtra(RuntimeError):
    """Something the job or command uses needs an extra that is not installed here."""

    def __init__(self, extras: Iterable[str]) -> None:
        self.extras = tuple(sorted(set(extras)))
        super().__init__(describe_missing(self.extras))


def install_line(*extras: str) -> str:
    return f"pip install '{DISTRIBUTION}[{','.join(sorted(set(extras)))}]'"


def describe_missing(extras: Iterable[str]) -> str:
    """One line: which extras are missing, what they are for, and the pip command that adds them all."""
    names = sorted(set(extras))
    what = " and ".join(f"`{e}`" for e in names)
    uses = "; ".join(USES.get(e, e) for e in names)
    verb = "extra is" if len(names) == 1 else "extras are"
    return f"the {what} {verb} not installed ({uses}): {install_line(*names)}"


def _importable(module: str) -> bool:
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True


def missing(extras: Iterable[str], *, importable: Callable[[str], bool] = _importable) -> list[str]:
    """The extras of `extras` whose modules do not import here, sorted."""
    return sorted(e for e in set(extras) if not all(importable(m) for m in EXTRAS[e]))


def require(*extras: str) -> None:
    """Raise MissingExtra naming every extra of `extras` that is not installed."""
    absent = missing(extras)
    if absent:
        raise MissingExtra(absent)
