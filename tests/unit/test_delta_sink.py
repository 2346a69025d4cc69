"""DeltaSink against a real Delta table in a temporary directory (deltalake writes the log): two subtasks, one
commit per checkpoint with the application transaction, partition directories, a replayed commit skipped,
files of an aborted checkpoint committed with the next one, and bad configuration in one line."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("deltalake", reason="deltalake is not installed (the `delta` extra)")

from runtime.connectors.delta import DeltaSink  # noqa: E402
from runtime.connectors.table_sink import TableConfigError  # noqa: E402
from tests.support.lake import delta_rows, delta_transactions  # noqa: E402


def sinks(table: str, n: int = 2, **kwargs: Any) -> list[DeltaSink]:
    out = []
    for i in range(n):
        sink = DeltaSink(table, **kwargs)
        sink.bind("job-1", "sink-x")
        sink.open(i, n, 0)
        out.append(sink)
    return out


def checkpoint(subtasks: list[DeltaSink], checkpoint_id: int, *, complete: bool = True) -> list[Any]:
    states = [s.snapshot_state(checkpoint_id) for s in subtasks]
    if complete:
        for s in subtasks:
            s.commit(checkpoint_id)
    return states


def test_one_commit_per_checkpoint_with_its_app_transaction_and_partitions(tmp_path: Path) -> None:
    table = str(tmp_path / "t")
    subtasks = sinks(table, partition_by=["day"])
    for c in (1, 2):
        for i, s in enumerate(subtasks):
            for n in range(4):
                s.write({"day": f"d{n % 2}", "n": c * 100 + i * 10 + n})
        checkpoint(subtasks, c)
    app = "sluice-job-1-sink-x"
    assert delta_transactions(table) == [[(app, 1)], [(app, 2)]]
    assert sorted(delta_rows(table, ["n", "day"])) == sorted(
        (c * 100 + i * 10 + n, f"d{n % 2}") for c in (1, 2) for i in range(2) for n in range(4))
    assert sorted(p for p in os.listdir(table) if p.startswith("day=")) == ["day=d0", "day=d1"]
    assert subtasks[0].statistics().commits == 2 and subtasks[1].statistics().commits == 0
    # the staging manifests of committed checkpoints are gone; the note says what the table has
    staging = Path(table) / "_sluice" / app
    assert sorted(os.listdir(staging)) == ["committed.json"]
    assert json.loads((staging / "committed.json").read_text()) == {"versions": {app: 2}}


def test_a_commit_replayed_after_a_restore_is_skipped_and_an_aborted_checkpoint_waits(tmp_path: Path) -> None:
    table = str(tmp_path / "t")
    subtasks = sinks(table, columns=["k", "n"])
    for s in subtasks:
        s.write(("a", s.subtask_index))
    states = checkpoint(subtasks, 1)  # committed; the job then restores checkpoint 1 (it never heard)
    restored = sinks(table, columns=["k", "n"])
    for s, state in zip(restored, states, strict=True):
        s.restore_state(state)
        s.write(("b", s.subtask_index))
    checkpoint(restored, 2, complete=False)  # aborted: its files wait for the next completed checkpoint
    for s in restored:
        s.write(("c", s.subtask_index))
    checkpoint(restored, 3)
    app = "sluice-job-1-sink-x"
    assert delta_transactions(table) == [[(app, 1)], [(app, 3)]]
    assert sorted(delta_rows(table, ["k", "n"])) == [(k, i) for k in "abc" for i in range(2)]
    # subtask 0 listed its file of checkpoint 1 again; subtask 1 read the committer's note and dropped its own
    assert restored[0].statistics().files_already_committed == 1
    # the committer knows at once; the others see the note at their next barrier
    assert (restored[0].statistics().files_pending, restored[1].statistics().files_pending) == (0, 2)
    checkpoint(restored, 4)
    assert restored[1].statistics().files_pending == 0 and len(delta_transactions(table)) == 2


def test_bad_configuration_is_one_line(tmp_path: Path) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    with pytest.raises(TableConfigError, match="is not writable") as info:
        DeltaSink(str(blocked / "t")).check_config()
    assert "\n" not in str(info.value)
    table = str(tmp_path / "t")
    subtasks = sinks(table, n=1, partition_by=["k"])
    subtasks[0].write({"k": "a", "n": 1})
    checkpoint(subtasks, 1)
    with pytest.raises(TableConfigError, match=r"partitioned by \['k'\], the sink by \[\]"):
        DeltaSink(table).check_config()
    subtasks = sinks(str(tmp_path / "u"), n=1, partition_by=["missing"])
    subtasks[0].write({"k": "a"})
    with pytest.raises(TableConfigError, match="no column 'missing'"):
        subtasks[0].snapshot_state(1)


def test_rescaled_sink_states_commit_every_file_once(tmp_path: Path) -> None:
    """Two subtasks' pending files (checkpoint 1 completed, its commit never happened) are dealt to three
    (checkpointing/rescaling.py): the new subtask 0 commits them with its first checkpoint, once."""
    from runtime.checkpointing.rescaling import rescale_sinks

    table = str(tmp_path / "t")
    old = sinks(table, columns=["k", "n"])
    for s in old:
        s.write(("a", s.subtask_index))
    states = [[s.snapshot_state(1)] for s in old]  # completed; the job failed before the commit
    new = sinks(table, n=3, columns=["k", "n"])
    for s in new:
        s.restore_state(rescale_sinks(states, 3, s.subtask_index, 1)[0])
        s.write(("b", s.subtask_index))
    checkpoint(new, 2)
    assert sorted(delta_rows(table, ["k", "n"])) == [("a", 0), ("a", 1), ("b", 0), ("b", 1), ("b", 2)]
    assert delta_transactions(table) == [[("sluice-job-1-sink-x", 2)]]
