"""IcebergSink against a real Iceberg table (pyiceberg's SQL catalog on SQLite in a temporary directory): one
snapshot per checkpoint carrying the checkpoint and the app's version in its summary, a replayed commit
skipped, a missing table or catalog refused in one line, and the catalog pointed at the object store's S3
endpoint."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from runtime.common import objectstore

pytest.importorskip("pyiceberg", reason="pyiceberg is not installed (the `iceberg` extra)")

from runtime.connectors.iceberg import IcebergSink, versions_in_summaries, with_object_store_endpoint  # noqa: E402
from runtime.connectors.table_sink import TableConfigError  # noqa: E402
from tests.support.iceberg_tables import (  # noqa: E402
    iceberg_rows,
    iceberg_summaries,
    make_counts_table,
    sqlite_catalog,
)

APP = "sluice-job-1-sink-x"


def sinks(catalog: dict[str, str], n: int = 2, attempt: int = 0) -> list[IcebergSink]:
    out = []
    for i in range(n):
        sink = IcebergSink(catalog, "db.counts", columns=["key", "n"])
        sink.bind("job-1", "sink-x")
        sink.open(i, n, attempt)
        out.append(sink)
    return out


def checkpoint(subtasks: list[IcebergSink], checkpoint_id: int) -> list[Any]:
    states = [s.snapshot_state(checkpoint_id) for s in subtasks]
    for s in subtasks:
        s.commit(checkpoint_id)
    for s in subtasks:
        s.drain()  # the commit runs on the committer's thread
    return states


def test_versions_come_from_the_summaries() -> None:
    summaries = [{"sluice.versions": '{"a":3}'}, {"other": "x"}, {"sluice.versions": '{"a":5,"b":1}'}]
    assert versions_in_summaries(summaries, ["a", "b", "c"]) == {"a": 5, "b": 1, "c": None}


def test_one_snapshot_per_checkpoint_and_a_replayed_commit_is_skipped(tmp_path: Path) -> None:
    """Checkpoint 1 is committed and the committer dies before its note; the restore from checkpoint 1 lists
    its files again, checkpoint 2 is aborted (its files wait) and checkpoint 3 commits: every row once, one
    snapshot per committed checkpoint. (A warehouse in S3: tests/integration/test_lake.py.)"""
    catalog = sqlite_catalog(tmp_path)
    make_counts_table(catalog)
    subtasks = sinks(catalog)
    for s in subtasks:
        s.write(("a", s.subtask_index))
    states = checkpoint(subtasks, 1)
    objectstore.delete(objectstore.join(subtasks[0].staging, "committed.json"))  # died right after the snapshot
    restored = sinks(catalog, attempt=1)  # restored from checkpoint 1, whose commit happened
    for s, state in zip(restored, states, strict=True):
        s.restore_state(state)
        s.write(("b", s.subtask_index))
    for s in restored:
        s.snapshot_state(2)  # checkpoint 2 never completes
        s.write(("c", s.subtask_index))
    checkpoint(restored, 3)
    assert sorted(iceberg_rows(catalog)) == [(k, i) for k in "abc" for i in range(2)]
    summaries = iceberg_summaries(catalog)
    assert [(s["sluice.checkpoint"], s["sluice.versions"], s["added-records"]) for s in summaries] == [
        ("1", f'{{"{APP}":1}}', "2"), ("3", f'{{"{APP}":3}}', "4")]
    assert restored[0].statistics().files_already_committed == 2  # both subtasks' files of checkpoint 1
    for s in subtasks + restored:
        s.close()


def test_the_catalog_reaches_the_object_store_endpoint_unless_it_names_its_own() -> None:
    env = {"AWS_ENDPOINT_URL": "http://127.0.0.1:9000", "AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s"}
    catalog = {"type": "sql", "uri": "sqlite:///c.db"}
    assert with_object_store_endpoint(catalog, env) == {
        **catalog, "s3.endpoint": "http://127.0.0.1:9000", "s3.region": "us-east-1", "s3.access-key-id": "k",
        "s3.secret-access-key": "s"}
    own = {**catalog, "s3.endpoint": "http://elsewhere", "s3.region": "eu-west-1"}
    assert with_object_store_endpoint(own, env) == own
    assert with_object_store_endpoint(catalog, {"AWS_ACCESS_KEY_ID": "k"}) == catalog  # AWS itself: pyarrow's own


def test_missing_table_or_catalog_is_one_line(tmp_path: Path) -> None:
    catalog = sqlite_catalog(tmp_path)
    with pytest.raises(TableConfigError, match=r"no table 'db.counts' in the catalog .*create it first") as info:
        IcebergSink(catalog, "db.counts").check_config()
    assert "\n" not in str(info.value)
    with pytest.raises(TableConfigError, match="cannot open the catalog"):
        IcebergSink({"type": "nonsense"}, "db.counts").check_config()
