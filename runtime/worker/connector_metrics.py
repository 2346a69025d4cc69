"""Connectors' figures as metric samples: one table of every connector metric family (docs/METRICS.md:
Connectors, Tables and files, Kafka) and one reader of a task's live connector objects.

Both the Prometheus collector (runtime/worker/metrics.py) and the task's heartbeat report (the job's REST page
and UI show them per subtask) read `task_figures`, so a figure is named, labelled and computed in one place.
Connectors report through what they already have: `statistics()` (a dict: the PostgreSQL connectors; a
TableSinkStatistics: the table sinks), a FileSource's file counts, a Kafka source's `partition_statistics()`
and a Kafka sink's `open_transaction_age_s()` and `transactions`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from runtime.connectors.file_source import FileSource
from runtime.connectors.splits import SplitReader
from runtime.connectors.table_sink import TableSink, TableSinkStatistics

GAUGE, COUNTER = "gauge", "counter"


@dataclass(frozen=True, slots=True)
class Family:
    name: str  # as declared; a counter's samples are exported as name + "_total"
    kind: str
    help: str
    labels: tuple[str, ...] = ()  # beyond the task's own (job_id, task, subtask)

    @property
    def sample_name(self) -> str:
        return self.name + "_total" if self.kind == COUNTER else self.name


PARTITION = ("topic", "partition")
FAMILIES: dict[str, Family] = {
    # PostgreSQL (statistics() dicts)
    "replication_lag_bytes": Family("sluice_postgres_replication_lag_bytes", GAUGE,
                                    "WAL bytes the server has beyond the last change the CDC source handed on"),
    "replication_lag_seconds": Family("sluice_postgres_replication_lag_seconds", GAUGE,
                                      "Age of the last change the CDC source handed on while more are waiting (0 "
                                      "when caught up)"),
    "confirmed_lsn": Family("sluice_postgres_confirmed_lsn", GAUGE,
                            "The replication slot's confirmed LSN as the source last sent it (a completed "
                            "checkpoint's position)"),
    "open_prepared_transactions": Family("sluice_postgres_open_prepared_transactions", GAUGE,
                                         "Checkpoints the PostgreSQL sink prepared (or deferred) and has not "
                                         "committed"),
    "rows_written": Family("sluice_postgres_rows_written", COUNTER, "Rows the PostgreSQL sink wrote in transactions"),
    # table sinks and the file source
    "table_files_pending": Family("sluice_table_sink_files_pending", GAUGE,
                                  "Data files a table sink subtask wrote and has not seen committed"),
    "table_commits": Family("sluice_table_sink_commits", COUNTER,
                            "Table commits (Delta commits, Iceberg snapshots) the subtask made"),
    "table_files_already_committed": Family("sluice_table_sink_files_already_committed", COUNTER,
                                            "Files listed again (after a restore) that the table already had: "
                                            "not added twice"),
    "table_last_commit_s": Family("sluice_table_sink_last_commit_seconds", GAUGE,
                                  "Duration of the subtask's last table commit"),
    "table_rows_written": Family("sluice_table_sink_rows_written", COUNTER, "Rows written to data files"),
    "files_pending": Family("sluice_file_source_files_pending", GAUGE,
                            "Files a FileSource subtask discovered and has not finished"),
    "files_read": Family("sluice_file_source_files_read", COUNTER, "Files a FileSource subtask read to their end"),
    # Kafka
    "kafka_records_read": Family("sluice_kafka_source_records_read", COUNTER,
                                 "Records a Kafka source subtask handed to the job, per partition (rate(): "
                                 "records/s)", PARTITION),
    "kafka_lag": Family("sluice_kafka_source_lag_records", GAUGE,
                        "Records of a partition after the next one the source reads, from the end the broker last "
                        "reported (its last stable offset under read_committed)", PARTITION),
    "kafka_current_offset": Family("sluice_kafka_source_current_offset", GAUGE,
                                   "The next offset of a partition the source hands to the job (Flink's "
                                   "currentOffset; with the lag, the partition's end as the source last saw it)",
                                   PARTITION),
    "kafka_transaction_age_s": Family("sluice_kafka_sink_open_transaction_age_seconds", GAUGE,
                                      "How long the Kafka sink's transaction in progress has been open (0: none)"),
    "kafka_transactions": Family("sluice_kafka_sink_transactions", COUNTER,
                                 "Transactions an exactly-once Kafka sink committed (one per checkpoint with "
                                 "records, and replays after a recovery)"),
}
POSTGRES = ("replication_lag_bytes", "replication_lag_seconds", "confirmed_lsn", "open_prepared_transactions",
            "rows_written")


@dataclass(frozen=True, slots=True)
class Figure:
    family: str  # a key of FAMILIES
    labels: tuple[str, ...]  # the values of the family's own labels
    value: float

    def document(self) -> dict[str, Any]:
        """As the heartbeat carries it (and the REST API shows it): the exported sample's name and labels."""
        family = FAMILIES[self.family]
        return {"name": family.sample_name, "labels": dict(zip(family.labels, self.labels, strict=True)),
                "value": self.value}


def task_figures(source: Any, sinks: Sequence[Any]) -> list[Figure]:
    """The figures of a task's source (each split's, for a split reader) and sinks; figures of the same family
    and labels are summed (a split reader's files)."""
    readers = source.sources() if isinstance(source, SplitReader) else [source]
    summed: dict[tuple[str, tuple[str, ...]], float] = {}
    for part in [*readers, *sinks]:
        if part is None:
            continue
        for figure in connector_figures(part):
            key = (figure.family, figure.labels)
            summed[key] = summed.get(key, 0) + figure.value
    return [Figure(family, labels, value) for (family, labels), value in summed.items()]


def connector_figures(part: Any) -> list[Figure]:
    """One source's or sink's figures, from whichever of the connectors' reports it has."""
    out: list[Figure] = []
    statistics = getattr(part, "statistics", None)
    unopened = isinstance(part, TableSink) and not hasattr(part, "stats")
    figures = statistics() if statistics is not None and not unopened else None
    if isinstance(figures, dict):  # a user's connector may have statistics of its own: only ours are read
        out += [Figure(k, (), v) for k, v in figures.items() if k in POSTGRES]
    elif isinstance(figures, TableSinkStatistics):
        out += [Figure("table_files_pending", (), figures.files_pending),
                Figure("table_commits", (), figures.commits),
                Figure("table_files_already_committed", (), figures.files_already_committed),
                Figure("table_last_commit_s", (), figures.last_commit_s),
                Figure("table_rows_written", (), figures.rows_written)]
    if isinstance(part, FileSource) and hasattr(part, "discovery"):
        out += [Figure("files_pending", (), part.files_pending()), Figure("files_read", (), part.files_read)]
    partitions = getattr(part, "partition_statistics", None)
    if partitions is not None:
        for (topic, partition), (read, lag, offset) in sorted(partitions().items()):
            labels = (topic, str(partition))
            out += [Figure("kafka_records_read", labels, read), Figure("kafka_lag", labels, lag),
                    Figure("kafka_current_offset", labels, offset)]
    age = getattr(part, "open_transaction_age_s", None)
    if age is not None and hasattr(part, "transactions"):  # opened
        out += [Figure("kafka_transaction_age_s", (), age()), Figure("kafka_transactions", (), part.transactions)]
    return out
