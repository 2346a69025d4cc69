"""The table sinks' commit protocol (runtime/connectors/lake_commits.py): which files a checkpoint's one commit
adds, which are skipped because the table's recorded version says they are in, and what a subtask keeps."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from runtime.connectors.lake_commits import (
    FINISHED_BEFORE_THIS_RUN,
    CommitPlan,
    app_id_of,
    committer_of,
    manifest_name,
    manifests_of,
    manifests_up_to,
    parse_manifest_name,
    plan_commit,
    still_pending,
)

A, B = "sluice-job-a-sink", "sluice-job-b-sink"


def f(path: str) -> dict[str, str]:
    return {"path": path}


def test_first_commit_adds_every_file_up_to_the_checkpoint_and_records_it() -> None:
    entries = [[1, A, f("x")], [2, A, f("y")], [2, A, f("z")]]
    assert plan_commit(entries, {A: None}, checkpoint_id=2, app_id=A) == CommitPlan(
        (f("x"), f("y"), f("z")), ((A, 2),))


def test_a_replayed_commit_is_skipped() -> None:
    """The commit of checkpoint 2 happened; the job restored from 2 lists the same files again."""
    entries = [[1, A, f("x")], [2, A, f("y")]]
    plan = plan_commit(entries, {A: 2}, checkpoint_id=3, app_id=A)
    assert plan.empty and plan.versions == ()


def test_files_committed_before_are_left_out_and_the_rest_added() -> None:
    entries = [[1, A, f("x")], [2, A, f("y")], [3, A, f("w")]]
    assert plan_commit(entries, {A: 2}, checkpoint_id=3, app_id=A) == CommitPlan((f("w"),), ((A, 3),))


def test_restored_files_of_an_earlier_job_keep_their_app_and_get_its_version() -> None:
    """Job b restored job a's checkpoint 5 (a had committed up to 4): a's files of 5 are added under a's app,
    b's own under b's, in the one commit."""
    entries = [[4, A, f("old")], [5, A, f("restored")], [7, B, f("new")]]
    assert plan_commit(entries, {A: 4, B: None}, checkpoint_id=7, app_id=B) == CommitPlan(
        (f("restored"), f("new")), ((A, 5), (B, 7)))


def test_a_file_listed_by_two_manifests_is_added_once_and_later_checkpoints_wait() -> None:
    entries = [[1, A, f("x")], [1, A, f("x")], [4, A, f("later")]]
    assert plan_commit(entries, {}, checkpoint_id=3, app_id=A) == CommitPlan((f("x"),), ((A, 3),))


def test_still_pending_keeps_what_the_table_does_not_have() -> None:
    entries = [[1, A, f("x")], [3, A, f("y")], [2, B, f("z")]]
    assert still_pending(entries, {A: 2}) == [[3, A, f("y")], [2, B, f("z")]]
    assert still_pending(entries, {A: 3, B: 2}) == []


def test_manifest_names_sort_by_checkpoint_and_parse_back() -> None:
    names = [manifest_name(12, 1), manifest_name(3, 0), manifest_name(12, 0), "committed.json", "x-y.json"]
    assert parse_manifest_name(manifest_name(12, 1)) == (12, 1)
    assert parse_manifest_name("committed.json") is None
    assert manifests_of(names, 12) == [manifest_name(12, 0), manifest_name(12, 1)]
    assert manifests_up_to(names, 11) == [manifest_name(3, 0)]
    assert app_id_of("job-1", "sink-abc") == "sluice-job-1-sink-abc"


@given(st.lists(st.tuples(st.integers(1, 8), st.sampled_from([A, B]), st.integers(0, 30)), max_size=40),
       st.lists(st.integers(1, 8), min_size=1, max_size=6))
def test_after_any_sequence_of_commits_every_file_is_in_the_table_exactly_once(
        raw: list[tuple[int, str, int]], commits: list[int]) -> None:
    """Invariant: committing at increasing checkpoints, with every commit's manifests listing all entries
    still pending (and replays of earlier commits mixed in), adds each file once and only at or before its
    checkpoint's commit."""
    entries = [[c, app, f(f"{app}-{c}-{n}")] for c, app, n in raw]
    committed: dict[str, int | None] = {A: None, B: None}
    table: list[str] = []
    pending = list(entries)
    for checkpoint in sorted(set(commits)):
        for replay in (False, True):  # the same manifests again: a replayed commit
            plan = plan_commit(pending if not replay else entries, committed, checkpoint_id=checkpoint, app_id=B)
            table += [file["path"] for file in plan.files]
            committed.update(dict(plan.versions))
        pending = still_pending(pending, committed)
    assert len(table) == len(set(table))
    due = {e[2]["path"] for e in entries if e[0] <= max(commits)}
    assert set(table) == due


def test_the_committer_is_the_lowest_subtask_that_had_not_finished_before_the_checkpoint() -> None:
    from runtime.connectors.lake_commits import committer_of, finish_marker_name, finished_in_attempt

    assert committer_of(7, 3, {}) == 0
    assert committer_of(7, 3, {0: 7}) == 0  # its final checkpoint: it still commits that one
    assert committer_of(8, 3, {0: 7}) == 1
    assert committer_of(8, 3, {0: 7, 1: 5}) == 2
    assert committer_of(8, 2, {0: 7, 1: 5}) is None
    names = [finish_marker_name(1, 0), finish_marker_name(0, 1), finish_marker_name(1, 2), "x.json"]
    assert finished_in_attempt(names, 1) == [(0, finish_marker_name(1, 0)), (2, finish_marker_name(1, 2))]


def test_a_subtask_restored_finished_hands_every_checkpoint_of_the_run_to_the_next() -> None:
    """Restored from checkpoint 10 taken after subtask 0 had finished: its marker (written when it opens) is
    FINISHED_BEFORE_THIS_RUN, so subtask 1 commits 11, 12, ...; with subtask 1 also restored at its end (its
    final checkpoint is 11) subtask 2 takes over from 12; restored finished as well, 1 is skipped from 11."""
    assert [committer_of(k, 3, {0: FINISHED_BEFORE_THIS_RUN}) for k in (11, 12, 13)] == [1, 1, 1]
    assert [committer_of(k, 3, {0: FINISHED_BEFORE_THIS_RUN, 1: 11}) for k in (11, 12)] == [1, 2]
    assert committer_of(11, 3, {0: FINISHED_BEFORE_THIS_RUN, 1: FINISHED_BEFORE_THIS_RUN}) == 2
    assert committer_of(11, 2, {0: FINISHED_BEFORE_THIS_RUN, 1: FINISHED_BEFORE_THIS_RUN}) is None
    # without subtask 0's marker (before the fix) the rule named 0, whose task had ended: nobody committed
    assert committer_of(11, 3, {}) == 0


# How a subtask of a run takes part in its checkpoints, by how it was restored (or started):
#   ("finished",)   restored finished: in none; its marker is FINISHED_BEFORE_THIS_RUN, written when it opens
#   ("ended",)      restored at its end of input: in the run's first checkpoint only, its marker's
#   ("runs", e)     reads input and ends at checkpoint e (None: not within the run): in every checkpoint <= e
Life = tuple[str] | tuple[str, int | None]
lives = st.one_of(st.just(("finished",)), st.just(("ended",)),
                  st.tuples(st.just("runs"), st.one_of(st.none(), st.integers(11, 16))))


@given(st.lists(lives, min_size=1, max_size=5), st.data())
def test_every_checkpoint_of_a_restored_run_is_committed_once_by_a_subtask_that_takes_part_in_it(
        subtasks: list[Life], data: st.DataObject) -> None:
    """Invariant of `committer_of` with the markers the sinks write (TableSink.restored_at_end and the
    snapshot at the end of input): for checkpoints 11..16 of a run restored from checkpoint 10, whatever
    markers above the checkpoint a subtask happens to see already, every subtask names the same committer,
    it takes part in that checkpoint (it gets the commit call), and there is none only if no subtask does."""
    first = 11
    finals: dict[int, int | None] = {}  # subtask -> its last checkpoint in the run (None: all of them)
    for i, life in enumerate(subtasks):
        finals[i] = (FINISHED_BEFORE_THIS_RUN if life[0] == "finished" else first if life[0] == "ended"
                     else life[1] if len(life) == 2 else None)
    markers = {i: final for i, final in finals.items() if final is not None}
    for k in range(first, 17):
        takes_part = [i for i, final in finals.items() if final is None or final >= k]
        certain = {i: m for i, m in markers.items() if m <= k}  # written before their subtask acknowledged k
        later = sorted(i for i, m in markers.items() if m > k)
        seen = data.draw(st.lists(st.sampled_from(later), unique=True) if later else st.just([]))
        named = {committer_of(k, len(subtasks), certain),
                 committer_of(k, len(subtasks), {**certain, **{i: markers[i] for i in seen}}),
                 committer_of(k, len(subtasks), markers)}
        assert len(named) == 1
        (committer,) = named
        if takes_part:
            assert committer in takes_part
        else:
            assert committer is None
