"""IcebergSink: an Iceberg table written exactly once, one snapshot per checkpoint.

Each subtask writes Parquet data files under the table's `data/` directory while a checkpoint runs, with the
table's own Arrow schema (so the files match its columns and types); at the barrier its files are finished and
listed in its state and its staging manifest. When the checkpoint completes, the committer (subtask 0 while it
runs; table_sink.py) adds every subtask's files in one append snapshot (`add_files`) whose summary carries
`sluice.checkpoint` (the checkpoint id), `sluice.app` (sluice-<job>-<sink uid>) and `sluice.versions` (per
app, the highest checkpoint whose files it holds). Before committing it reads the summaries of the table's
snapshots: a checkpoint already there (a commit replayed after a restore) is skipped
(runtime/connectors/lake_commits.py has the protocol).

The catalog is given as pyiceberg's catalog properties (`{"type": "sql", "uri": "sqlite:///...",
"warehouse": "file:///..."}`, or a REST or Glue catalog's), the table as "namespace.table"; the table must
exist (create it with pyiceberg or Spark): a missing catalog or table is refused at submit in one line. A
table in `s3://` is written through the same environment as s3:// checkpoints (AWS_ENDPOINT_URL, credentials;
runtime/common/objectstore.py), which also becomes the catalog's `s3.*` FileIO properties unless it has its own
(`with_object_store_endpoint`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from runtime.common import extras, objectstore
from runtime.connectors.lake_commits import CommitPlan
from runtime.connectors.table_sink import TableConfigError, TableSink, ensure_writable, local_path

if TYPE_CHECKING:
    from runtime.connectors.submit import SubmitContext

SUMMARY_CHECKPOINT = "sluice.checkpoint"
SUMMARY_APP = "sluice.app"
SUMMARY_VERSIONS = "sluice.versions"


def load_catalog(properties: Mapping[str, str]) -> Any:
    try:
        from pyiceberg.catalog import load_catalog as load
    except ImportError as exc:
        raise extras.MissingExtra(["iceberg"]) from exc
    props = with_object_store_endpoint(properties)
    return load(props.pop("name", "sluice"), **props)


def with_object_store_endpoint(properties: Mapping[str, str],
                               env: dict[str, str] | os._Environ[str] = os.environ) -> dict[str, str]:
    """The catalog's properties, plus pyiceberg's `s3.*` FileIO properties for the S3-compatible server sluice's
    object store is pointed at (AWS_ENDPOINT_URL and its credentials), unless the catalog names an endpoint of
    its own. The sink writes the data files through the object store and pyiceberg reads them back (add_files)
    and writes the metadata through its FileIO, so both must reach the same store; pyiceberg reads no
    endpoint from the environment. Without a custom endpoint (AWS itself) nothing is added. Pure."""
    props = dict(properties)
    settings = objectstore.s3_settings(env)
    if "endpoint" not in settings or "s3.endpoint" in props:
        return props
    found = {"s3.endpoint": settings["endpoint"],
             "s3.region": env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or "us-east-1",
             "s3.access-key-id": env.get("AWS_ACCESS_KEY_ID"), "s3.secret-access-key": env.get("AWS_SECRET_ACCESS_KEY"),
             "s3.session-token": env.get("AWS_SESSION_TOKEN")}
    return {**{k: v for k, v in found.items() if v}, **props}


def versions_in_summaries(summaries: list[Mapping[str, str]], apps: list[str]) -> dict[str, int | None]:
    """Per app, the highest checkpoint the table's snapshot summaries record for it (None: none). Pure."""
    found: dict[str, int | None] = dict.fromkeys(apps)
    for summary in summaries:
        raw = summary.get(SUMMARY_VERSIONS)
        if not raw:
            continue
        for app, version in json.loads(raw).items():
            if app in found:
                found[app] = max(int(version), found[app] or 0)
    return found


class IcebergSink(TableSink):
    """Writes records to the existing Iceberg table `table` ("namespace.name") of `catalog` (pyiceberg catalog
    properties) exactly once (module docstring). Records: dicts, or tuples with `columns=[...]`."""

    extras = ("iceberg", "parquet")

    def __init__(self, catalog: Mapping[str, str], table: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.catalog = dict(catalog)
        self.table = table

    def _load(self) -> Any:
        try:
            catalog = load_catalog(self.catalog)
        except extras.MissingExtra:
            raise
        except Exception as exc:
            raise TableConfigError(f"IcebergSink: cannot open the catalog {self._describe()}: "
                                   f"{_first_line(exc)}") from None
        try:
            return catalog.load_table(self.table)
        except Exception as exc:
            raise TableConfigError(f"IcebergSink: no table {self.table!r} in the catalog {self._describe()} "
                                   f"({_first_line(exc)}): create it first") from None

    def _describe(self) -> str:
        return self.catalog.get("uri") or self.catalog.get("name") or str(self.catalog.get("type", "?"))

    def check_at_submit(self, context: SubmitContext) -> None:
        """The coordinator's submit check (runtime/graph/admission.py)."""
        self.check_config()

    def check_config(self) -> None:
        table = self._load()
        ensure_writable(local_path(table.location()), f"IcebergSink {self.table}")

    def prepare(self) -> None:
        super().prepare()
        self._table = self._load()
        self._root = local_path(self._table.location()).rstrip("/")
        schema = self._table.schema().as_arrow()
        # the table's columns and types, without the field ids (add_files maps the files' columns by name)
        self._arrow_schema = self._pa.schema([self._pa.field(f.name, f.type, f.nullable) for f in schema])

    def table_root(self) -> str:
        return self._root

    def _arrow(self, rows: list[Any]) -> Any:
        pa = self._pa
        if isinstance(rows[0], dict):
            return pa.Table.from_pylist(rows, schema=self._arrow_schema)
        names = self.columns or self._arrow_schema.names
        return pa.Table.from_pydict({name: [r[i] for r in rows] for i, name in enumerate(names)},
                                    schema=self._arrow_schema)

    def write_data_files(self, table: Any) -> list[dict[str, Any]]:
        import pyarrow.parquet as pq

        relative = f"data/{self.data_file_name()}"
        sink = self._pa.BufferOutputStream()
        pq.write_table(table, sink)
        body = sink.getvalue().to_pybytes()
        objectstore.write(objectstore.join(self._root, relative), body)
        return [{"path": relative, "size": len(body), "rows": table.num_rows}]

    def committed_versions(self, apps: list[str]) -> dict[str, int | None]:
        self._table = self._table.refresh()
        return versions_in_summaries([s.summary for s in self._table.snapshots() if s.summary is not None], apps)

    def commit_files(self, plan: CommitPlan, checkpoint_id: int) -> None:
        location = self._table.location().rstrip("/")
        self._table.add_files([f"{location}/{f['path']}" for f in plan.files], snapshot_properties={
            SUMMARY_CHECKPOINT: str(checkpoint_id), SUMMARY_APP: self.app_id,
            SUMMARY_VERSIONS: json.dumps(dict(plan.versions), separators=(",", ":"))},
            check_duplicate_files=False)  # the versions above already say which files the table has


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
