"""DeltaSink: a Delta Lake table written exactly once, one Delta commit per checkpoint.

Each subtask writes Parquet data files into the table's directory (under `col=value/` directories for
partition columns) while a checkpoint runs; at the barrier its files are finished and listed in its state and
its staging manifest. When the checkpoint completes, the committer (subtask 0 while it runs; table_sink.py)
makes the checkpoint's one Delta commit: add actions for every subtask's files, and an application transaction
`txn(appId = sluice-<job>-<sink uid>, version = checkpoint id)` in the same commit. A commit replayed after a
restore finds its version in the table's `txn` and is skipped (runtime/connectors/lake_commits.py has the
protocol, table_sink.py the shared sink). The table is created by the first commit, with the schema of the
records (pyarrow's inference) and `partition_by`; an existing table is appended to.

Paths: a local directory, or `s3://bucket/prefix` with the same environment as s3:// checkpoints
(AWS_ENDPOINT_URL, credentials; runtime/common/objectstore.py). deltalake (delta-rs) does the log.
"""

from __future__ import annotations

import json
import os
import time
import urllib.parse
from typing import TYPE_CHECKING, Any

from runtime.common import extras, objectstore
from runtime.connectors.lake_commits import CommitPlan
from runtime.connectors.table_sink import TableConfigError, TableSink, ensure_writable, local_path

if TYPE_CHECKING:
    from runtime.connectors.submit import SubmitContext

NULL_PARTITION = "__HIVE_DEFAULT_PARTITION__"  # Hive's (and Spark's) directory name for a null partition value


def deltalake_module() -> Any:
    try:
        import deltalake
    except ImportError as exc:
        raise extras.MissingExtra(["delta"]) from exc
    return deltalake


def storage_options(uri: str, env: dict[str, str] | os._Environ[str] = os.environ) -> dict[str, str] | None:
    """delta-rs's options for an s3:// table from the environment sluice's object store reads (a custom endpoint,
    plain http to it, path-style requests); None for a local table."""
    if not objectstore.is_url(uri):
        return None
    options: dict[str, str] = {}
    settings = objectstore.s3_settings(env)
    if "endpoint" in settings:
        options["AWS_ENDPOINT_URL"] = settings["endpoint"]
        options["AWS_VIRTUAL_HOSTED_STYLE_REQUEST"] = "false"
    if settings["client_options"]["allow_http"]:
        options["AWS_ALLOW_HTTP"] = "true"
    options["AWS_REGION"] = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or "us-east-1"
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        if env.get(name):
            options[name] = env[name]
    return options


def partition_value(value: Any) -> str | None:
    """Delta's string form of a partition value (the log's partitionValues)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def partition_dir(columns: list[str], values: list[str | None]) -> str:
    return "/".join(f"{c}={urllib.parse.quote(v, safe='') if v is not None else NULL_PARTITION}"
                    for c, v in zip(columns, values, strict=True))


class DeltaSink(TableSink):
    """Writes records to the Delta table at `uri` exactly once (module docstring).

    `partition_by` names partition columns (their values go into the directory names, not the files).
    Records: dicts, or tuples with `columns=[...]`. Bad configuration (a path that cannot be written, an
    existing table partitioned otherwise) is refused at submit in one line.
    """

    extras = ("delta", "parquet")

    def __init__(self, uri: str, *, partition_by: list[str] | tuple[str, ...] = (), **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.uri = local_path(uri).rstrip("/")
        self.partition_by = list(partition_by)

    def table_root(self) -> str:
        return self.uri

    def _options(self) -> dict[str, str] | None:
        return storage_options(self.uri)

    def _table(self) -> Any:
        """The table as the log has it now, or None when there is no table yet. The committer keeps its table
        object and reads only the log entries added since (a full log replay per commit grows with the log)."""
        deltalake = deltalake_module()
        cached = getattr(self, "_cached_table", None)
        if cached is not None:
            cached.update_incremental()
            return cached
        try:
            table = deltalake.DeltaTable(self.uri, storage_options=self._options())
        except deltalake.exceptions.TableNotFoundError:
            return None
        self._cached_table = table
        return table

    def check_at_submit(self, context: SubmitContext) -> None:
        """The coordinator's submit check (runtime/graph/admission.py)."""
        self.check_config()

    def check_config(self) -> None:
        """At submit: the path can be written, and an existing table has the same partition columns."""
        deltalake_module()
        ensure_writable(self.uri, f"DeltaSink {self.uri}")
        try:
            table = self._table()
        except Exception as exc:
            raise TableConfigError(f"DeltaSink {self.uri}: cannot read the table: {_first_line(exc)}") from None
        if table is not None:
            existing = list(table.metadata().partition_columns)
            if existing != self.partition_by:
                raise TableConfigError(f"DeltaSink {self.uri}: the table is partitioned by {existing}, the sink "
                                       f"by {self.partition_by}: give the sink partition_by={existing}")

    def prepare(self) -> None:
        super().prepare()
        self._deltalake = deltalake_module()
        objectstore.make_dir(self.uri)

    def write_data_files(self, table: Any) -> list[dict[str, Any]]:
        import pyarrow.parquet as pq

        missing = [c for c in self.partition_by if c not in table.column_names]
        if missing:
            raise TableConfigError(f"DeltaSink {self.uri}: the records have no column {missing[0]!r} to "
                                   f"partition by (their columns: {table.column_names})")
        schema_json = self._deltalake.Schema.from_arrow(table.schema).to_json()
        if self.partition_by:
            keys = list(zip(*(table.column(c).to_pylist() for c in self.partition_by), strict=True))
            groups: dict[tuple[Any, ...], list[int]] = {}
            for i, key in enumerate(keys):
                groups.setdefault(key, []).append(i)
            parts: list[tuple[list[Any], Any]] = [(list(key), table.take(rows).drop_columns(self.partition_by))
                                                  for key, rows in groups.items()]
        else:
            parts = [([], table)]
        files = []
        for key_values, data in parts:
            values = [partition_value(v) for v in key_values]
            directory = partition_dir(self.partition_by, values)
            relative = f"{directory}/{self.data_file_name()}" if directory else self.data_file_name()
            sink = self._pa.BufferOutputStream()
            pq.write_table(data, sink)
            body = sink.getvalue().to_pybytes()
            objectstore.write(objectstore.join(self.uri, relative), body)
            files.append({"path": relative, "size": len(body), "rows": data.num_rows,
                          "partition": dict(zip(self.partition_by, values, strict=True)),
                          "time_ms": int(time.time() * 1000), "schema": schema_json})
        return files

    def committed_versions(self, apps: list[str]) -> dict[str, int | None]:
        table = self._table()
        if table is None:
            return dict.fromkeys(apps)
        return {app: table.transaction_version(app) for app in apps}

    def commit_files(self, plan: CommitPlan, checkpoint_id: int) -> None:
        dl = self._deltalake
        from deltalake.transaction import AddAction, CommitProperties, Transaction

        actions = [AddAction(urllib.parse.quote(f["path"], safe="/="), int(f["size"]), f["partition"],
                             int(f["time_ms"]), True, json.dumps({"numRecords": int(f["rows"])}))
                   for f in plan.files]
        properties = CommitProperties(
            app_transactions=[Transaction(app, version) for app, version in plan.versions],
            custom_metadata={"sluice.checkpoint": str(checkpoint_id), "sluice.app": self.app_id})
        table = self._table()
        if table is None:
            schema = dl.Schema.from_json(plan.files[0]["schema"])
            dl.transaction.create_table_with_add_actions(
                self.uri, schema, actions, mode="append", partition_by=self.partition_by or None,
                storage_options=self._options(), commit_properties=properties)
            self._cached_table = None
            return
        table.create_write_transaction(actions, "append", table.schema(),
                                       partition_by=self.partition_by or None, commit_properties=properties)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
