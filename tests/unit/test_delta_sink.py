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
        for s in subtasks:
            s.drain()  # the commit runs on the committer's thread
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
    # the committer died right after the table commit, before its note
    (Path(table) / "_sluice" / "sluice-job-1-sink-x" / "committed.json").unlink()
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
    # both subtasks listed their files of checkpoint 1 again: the table's txn version says they are in
    assert restored[0].statistics().files_already_committed == 2
    # the committer knows at once; the others see the note at their next barrier
    assert (restored[0].statistics().files_pending, restored[1].statistics().files_pending) == (0, 3)
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


def test_the_worker_reports_the_table_sink_and_file_source_figures(tmp_path: Path) -> None:
    """The worker's collector turns a task's DeltaSink and FileSource figures into the documented metrics."""
    from runtime.connectors.file_source import FileSource
    from runtime.worker.connector_metrics import task_figures
    from runtime.worker.metrics import _ConnectorFamilies

    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.json").write_text('["a", 1]\n')
    source = FileSource(str(tmp_path / "in"), bounded=True)
    source.open(0, 1)
    while source.read_batch(10) is not None:
        pass
    subtasks = sinks(str(tmp_path / "t"), n=1, columns=["k", "n"])
    subtasks[0].write(("a", 1))
    checkpoint(subtasks, 1)
    families = _ConnectorFamilies(["job_id", "task", "subtask"])
    families.add(["job-1", "t", "0"], task_figures(source, subtasks))
    samples = {s.name: s.value for family in families.families() for s in family.samples}
    assert samples == {"sluice_table_sink_files_pending": 0, "sluice_table_sink_commits_total": 1,
                       "sluice_table_sink_files_already_committed_total": 0,
                       "sluice_table_sink_last_commit_seconds": subtasks[0].statistics().last_commit_s,
                       "sluice_table_sink_rows_written_total": 1, "sluice_file_source_files_pending": 0,
                       "sluice_file_source_files_read_total": 1}


def test_a_failed_commit_fails_the_next_barrier_and_close_waits_for_commits(tmp_path: Path) -> None:
    """The commit runs on subtask 0's commit thread: its failure comes back at the next barrier (the task then
    fails and the restore lists the files again); at the end of a bounded input close waits for it."""

    class Refused(DeltaSink):
        def commit_files(self, plan: Any, checkpoint_id: int) -> None:
            raise OSError("the store refused the commit")

    sink = Refused(str(tmp_path / "t"), columns=["k", "n"])
    sink.open(0, 1, 0)
    sink.write(("a", 1))
    sink.snapshot_state(1)
    sink.commit(1)
    with pytest.raises(OSError, match="refused the commit"):
        sink.drain()
    with pytest.raises(OSError, match="refused the commit"):
        sink.snapshot_state(2)
    sink.close()

    table = str(tmp_path / "u")
    ok = DeltaSink(table, columns=["k", "n"])
    ok.open(0, 1, 0)
    ok.write(("a", 1))
    ok.finish()
    ok.snapshot_state(1)
    ok.commit(1)
    ok.close()  # finished: waits for the commit
    assert delta_rows(table, ["k", "n"]) == [("a", 1)]


def test_when_subtask_0_finished_first_the_next_subtask_commits_the_later_checkpoints(tmp_path: Path) -> None:
    """A bounded input whose sink subtasks end at different checkpoints: subtask 0 finishes at checkpoint 1
    and takes no part later; subtask 1's files of checkpoint 2 are committed by subtask 1, once."""
    table = str(tmp_path / "t")
    first, second = sinks(table, columns=["k", "n"])
    first.write(("a", 0))
    first.finish()
    second.write(("a", 1))
    checkpoint([first, second], 1)
    first.close()  # finished: its task ended after checkpoint 1's commit
    second.write(("b", 1))
    second.finish()
    checkpoint([first, second][1:], 2)
    first.commit(2)  # a finished task may still hear of later checkpoints: it does nothing
    assert sorted(delta_rows(table, ["k", "n"])) == [("a", 0), ("a", 1), ("b", 1)]
    app = "sluice-job-1-sink-x"
    assert delta_transactions(table) == [[(app, 1)], [(app, 2)]]
    assert (first.statistics().commits, second.statistics().commits) == (1, 1)


def test_restored_state_naming_a_data_file_outside_the_table_is_refused(tmp_path: Path) -> None:
    from runtime.connectors.sinks import ForgedSinkState

    table = str(tmp_path / "t")
    (s,) = sinks(table, n=1, columns=["k", "n"])
    s.write(("a", 1))
    (state,) = checkpoint([s], 1, complete=False)
    good = state["pending"][0]
    for path in ("../../outside.parquet", str(tmp_path / "outside.parquet"), None):
        forged = {"pending": [good, [1, good[1], {**good[2], "path": path}]], "checkpoint": 1}
        again = sinks(table, n=1, columns=["k", "n"])[0]
        with pytest.raises(ForgedSinkState, match="not inside the table: refused"):
            again.restore_state(forged)
    again.restore_state(state)  # its own files restore


def restart(table: str, states: list[Any], attempt: int, **kwargs: Any) -> list[DeltaSink]:
    """A run restored from a checkpoint with `states` (None: that subtask restores finished, no state)."""
    out = []
    for i, state in enumerate(states):
        sink = DeltaSink(table, **kwargs)
        sink.bind("job-1", "sink-x")
        sink.open(i, len(states), attempt)
        sink.restore_state(state)
        out.append(sink)
    return out


def test_restored_with_subtask_0_finished_the_next_subtask_commits_every_later_checkpoint_once(
        tmp_path: Path) -> None:
    """Checkpoint 2 was taken after subtask 0 finished (at checkpoint 1); subtask 1's files of checkpoint 2 were
    never committed (the job failed first). The restore of checkpoint 2 runs subtask 0 as finished: its task
    opens, learns it (restored_at_end) and ends. Subtask 1 commits its restored files and later checkpoints,
    once each; before the fix nobody did (the rule named subtask 0, whose task had ended)."""
    table = str(tmp_path / "t")
    first, second = sinks(table, columns=["k", "n"])
    first.write(("a", 0))
    first.finish()
    second.write(("a", 1))
    checkpoint([first, second], 1)
    first.close()
    second.write(("b", 1))
    (state,) = checkpoint([second], 2, complete=False)  # completed; the job failed before its commit
    second.close()
    done, running = restart(table, [None, state], 1, columns=["k", "n"])
    done.restored_at_end(finished=True)
    done.close()  # its task ends at once
    for c in (3, 4):
        running.write(("c", c))
        checkpoint([running], c)
        done.commit(c)  # a late notification to the ended task: nothing
    app = "sluice-job-1-sink-x"
    assert sorted(delta_rows(table, ["k", "n"])) == [("a", 0), ("a", 1), ("b", 1), ("c", 3), ("c", 4)]
    assert delta_transactions(table) == [[(app, 1)], [(app, 3)], [(app, 4)]]
    assert (done.statistics().commits, running.statistics().commits) == (0, 2)


def test_restored_with_subtask_0_at_its_end_it_commits_its_final_checkpoint_then_hands_over(tmp_path: Path) -> None:
    """Checkpoint 1 was taken after subtask 0 reached its end of input, before its final commit: restored at its
    end, subtask 0 takes part in checkpoint 2 only (and commits it, once: subtask 1 does not); subtask 1
    commits checkpoint 3."""
    table = str(tmp_path / "t")
    first, second = sinks(table, columns=["k", "n"])
    first.write(("a", 0))
    first.finish()
    second.write(("a", 1))
    states = checkpoint([first, second], 1, complete=False)
    for s in (first, second):
        s.close()
    ended, running = restart(table, states, 1, columns=["k", "n"])
    ended.restored_at_end(finished=False)
    running.write(("b", 1))
    checkpoint([ended, running], 2)
    ended.close()
    running.write(("c", 1))
    checkpoint([running], 3)
    ended.commit(3)
    app = "sluice-job-1-sink-x"
    assert sorted(delta_rows(table, ["k", "n"])) == [("a", 0), ("a", 1), ("b", 1), ("c", 1)]
    assert delta_transactions(table) == [[(app, 2)], [(app, 3)]]
    assert (ended.statistics().commits, running.statistics().commits) == (1, 1)


def test_a_task_restored_finished_tells_its_table_sink_before_it_ends(tmp_path: Path) -> None:
    """The wiring: a real Task restored as finished (a source chained to a DeltaSink) reads nothing and ends, its
    sink having written its finish marker of this attempt (FINISHED_BEFORE_THIS_RUN) on the way."""
    import asyncio

    from runtime.api import Job
    from runtime.connectors.generator import GeneratorSource
    from runtime.connectors.lake_commits import FINISHED_BEFORE_THIS_RUN, finish_marker_name
    from runtime.execution.channels import OutputGate
    from runtime.execution.operators import Chain
    from runtime.execution.task import Credits, RestoredState, Task, TaskKey

    table = str(tmp_path / "t")
    sink = DeltaSink(table, columns=["n"])
    sink.bind("job-1", "sink-x")
    job = Job("t")
    source = GeneratorSource(count=5)
    job.source(source).sink(sink)
    chain = Chain(job, [n.id for n in job.nodes], subtask_index=0, parallelism=2, attempt=3, outputs=[])
    task = Task(key=TaskKey("job", 0, 0, "t", 1), chain=chain, outputs=[], output_gate=OutputGate(), inputs=[],
                credits=Credits(2, 8), source=source, flush_timeout_s=0.01, restore=RestoredState(finished=True))
    asyncio.run(asyncio.wait_for(task.run(), 30))
    marker = Path(table) / "_sluice" / "sluice-job-1-sink-x" / "finished" / finish_marker_name(3, 0)
    assert json.loads(marker.read_text()) == {"checkpoint": FINISHED_BEFORE_THIS_RUN}
    assert sink.statistics().rows_written == 0
