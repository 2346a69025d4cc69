"""IcebergSink against a real Iceberg table (pyiceberg's SQL catalog on SQLite in a temporary directory): one
snapshot per checkpoint carrying the checkpoint and the app's version in its summary, a replayed commit
skipped, and a missing table or catalog refused in one line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyiceberg", reason="pyiceberg is not installed (the `iceberg` extra)")

from runtime.connectors.iceberg import IcebergSink, versions_in_summaries  # noqa: E402
from runtime.connectors.table_sink import TableConfigError  # noqa: E402
from tests.support.iceberg_tables import (  # noqa: E402
    iceberg_rows,
    iceberg_summaries,
    make_counts_table,
    sqlite_catalog,
)

APP = "sluice-job-1-sink-x"


def sinks(catalog: dict[str, str], n: int = 2) -> list[IcebergSink]:
    out = []
    for i in range(n):
        sink = IcebergSink(catalog, "db.counts", columns=["key", "n"])
        sink.bind("job-1", "sink-x")
        sink.open(i, n, 0)
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
    catalog = sqlite_catalog(tmp_path)
    make_counts_table(catalog)
    subtasks = sinks(catalog)
    for s in subtasks:
        s.write(("a", s.subtask_index))
    states = checkpoint(subtasks, 1)
    (Path(subtasks[0].staging) / "committed.json").unlink()  # the committer died right after the snapshot
    restored = sinks(catalog)  # restored from checkpoint 1, whose commit happened
    for s, state in zip(restored, states, strict=True):
        s.restore_state(state)
        s.write(("b", s.subtask_index))
    checkpoint(restored, 2)
    assert sorted(iceberg_rows(catalog)) == [(k, i) for k in "ab" for i in range(2)]
    summaries = iceberg_summaries(catalog)
    assert [(s["sluice.checkpoint"], s["sluice.versions"], s["added-records"]) for s in summaries] == [
        ("1", f'{{"{APP}":1}}', "2"), ("2", f'{{"{APP}":2}}', "2")]
    assert restored[0].statistics().files_already_committed == 2  # both subtasks' files of checkpoint 1


def test_missing_table_or_catalog_is_one_line(tmp_path: Path) -> None:
    catalog = sqlite_catalog(tmp_path)
    with pytest.raises(TableConfigError, match=r"no table 'db.counts' in the catalog .*create it first") as info:
        IcebergSink(catalog, "db.counts").check_config()
    assert "\n" not in str(info.value)
    with pytest.raises(TableConfigError, match="cannot open the catalog"):
        IcebergSink({"type": "nonsense"}, "db.counts").check_config()
