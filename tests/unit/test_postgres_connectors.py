"""The pure parts of the PostgreSQL connectors: the sink's transaction ids and its recovery decision, upsert
batches, and the source's regions (which changes the stream emits after a resumed snapshot) and positions."""

from __future__ import annotations

import hashlib
from typing import Any

from runtime.connectors.pgoutput import parse_lsn
from runtime.connectors.postgres_cdc import (
    _NO_RECORD,
    CdcPosition,
    ChangeQueue,
    Regions,
    change_key,
    key_partition,
    key_text,
    partition_sql,
)
from runtime.connectors.postgres_sink import (
    GID_MAX,
    gid_prefix,
    parse_transaction_id,
    recovery_plan,
    transaction_id,
    upsert_rows,
)
from runtime.connectors.source import Source
from runtime.connectors.splits import SplitReader

PREFIX = gid_prefix("orders-job", "public.totals")


def test_transaction_ids_name_job_sink_subtask_checkpoint_and_parse_back() -> None:
    assert PREFIX == "sluice:orders-job:public.totals:"
    gid = transaction_id(PREFIX, 3, 41, "a1b2c3")
    assert gid == "sluice:orders-job:public.totals:3:41:a1b2c3"
    assert parse_transaction_id(gid, PREFIX) == (3, 41)
    # another sink's, another job's, or not ours at all
    assert parse_transaction_id(transaction_id(gid_prefix("orders-job", "public.other"), 3, 41, "x"), PREFIX) is None
    assert parse_transaction_id("sluice:orders-job:public.totals:3:41", PREFIX) is None
    assert parse_transaction_id("sluice:orders-job:public.totals:x:41:t", PREFIX) is None
    assert parse_transaction_id("manual-fix", PREFIX) is None


def test_long_names_are_replaced_by_a_digest_that_fits_the_server_limit() -> None:
    prefix = gid_prefix("j" * 150, "s" * 100)
    assert prefix.startswith("sluice:") and len(prefix) == len("sluice:") + 33
    assert prefix == gid_prefix("j" * 150, "s" * 100) != gid_prefix("j" * 150, "s" * 99)
    assert len(transaction_id(prefix, 9999, 10**12, "ffffff")) <= GID_MAX


def test_recovery_commits_the_restored_pending_rolls_back_the_rest_of_its_subtasks() -> None:
    ours = [transaction_id(PREFIX, s, cp, "t0") for s, cp in [(0, 6), (0, 7), (0, 8), (2, 7), (2, 9)]]
    others = [transaction_id(PREFIX, 1, 8, "t0"), transaction_id(gid_prefix("other", "public.totals"), 0, 8, "t0"),
              "manual"]
    pending = [[6, ours[0], None], [7, ours[1], None], [7, ours[3], None]]
    plan = recovery_plan(ours + others, PREFIX, pending=pending, committed=[], owners=[0, 2],
                         restored_checkpoint=7)
    assert plan.commit == tuple(sorted([ours[0], ours[1], ours[3]]))
    assert plan.rollback == tuple(sorted([ours[2], ours[4]]))  # checkpoints 8 and 9: after the restored 7
    assert plan.rewrite == () and plan.orphans == ()


def test_recovery_writes_deferred_rows_only_when_neither_prepared_nor_committed() -> None:
    gid6, gid7, gid8 = (transaction_id(PREFIX, 0, cp, "t0") for cp in (6, 7, 8))
    pending = [[6, gid6, None], [7, gid7, [("a", 1)]], [8, gid8, [("a", 2)]]]
    # 7 was prepared once 6 committed; 8 never was
    plan = recovery_plan([gid7], PREFIX, pending=pending, committed=[], owners=[0], restored_checkpoint=8)
    assert (plan.commit, plan.rollback, plan.rewrite) == ((gid7,), (), (gid8,))
    # both were written and committed before the crash: their marker rows say so, nothing is written again
    plan = recovery_plan([], PREFIX, pending=pending, committed=[gid7, gid8], owners=[0], restored_checkpoint=8)
    assert (plan.commit, plan.rollback, plan.rewrite) == ((), (), ())


def test_a_prepared_transaction_missing_from_the_restored_state_is_rolled_back_as_an_orphan() -> None:
    stray = transaction_id(PREFIX, 0, 5, "old")
    plan = recovery_plan([stray], PREFIX, pending=[], committed=[], owners=[0], restored_checkpoint=7)
    assert (plan.rollback, plan.orphans) == ((stray,), (stray,))


def test_upsert_batches_keep_the_last_row_of_each_key_in_first_seen_order() -> None:
    rows = [("a", 1, "x"), ("b", 1, "y"), ("a", 2, "z"), ("c", 1, "w"), ("b", 1, "v")]
    assert upsert_rows(rows, [0]) == [("a", 2, "z"), ("b", 1, "v"), ("c", 1, "w")]
    assert upsert_rows(rows, [0, 1]) == [("a", 1, "x"), ("b", 1, "v"), ("a", 2, "z"), ("c", 1, "w")]


def test_regions_decide_which_changes_the_stream_emits_after_resumed_snapshots() -> None:
    # table 0 read as of LSN 100; resumed after key (500,) of table 0 as of 200; after (10,) of table 1 as of 300
    regions = Regions(((0, None, 100),)).resumed(0, (500,), 200).resumed(1, (10,), 300)
    assert [regions.lsn_of(t, k) for t, k in [(0, (1,)), (0, (500,)), (0, (501,)), (1, (3,)), (1, (10,)),
                                              (1, (11,)), (2, (1,)), (0, None)]] == [
        100, 100, 200, 200, 200, 300, 300, 100]
    assert regions.emits(0, (7,), 150)  # key 7 was read as of 100: a change committed at 150 is new
    assert not regions.emits(0, (700,), 150)  # key 700 was read as of 200: that change is in its row
    assert regions.emits(0, (700,), 200)  # committed at the consistent point: after the snapshot


def test_positions_round_trip_through_checkpoint_state() -> None:
    position = CdcPosition(Regions(((0, None, 100), (0, (5, "x"), 200))), (1, (7,)), parse_lsn("0/1A2B"), 2)
    state = position.to_state()
    assert state == {"regions": [[0, None, 100], [0, [5, "x"], 200]], "snapshot": [1, [7]], "lsn": "0/1A2B",
                     "skip": 2}
    assert CdcPosition.from_state(state) == position


def at(lsn: int, skip: int = 0) -> CdcPosition:
    return CdcPosition(Regions(((0, None, 10),)), None, lsn, skip)


def expand(change: dict[str, Any]) -> list[Any]:
    """As a SQL table's changes: an update is two records."""
    return [("-U", change["id"]), ("+U", change["id"])] if change["op"] == "u" else [(change["op"], change["id"])]


def queued(*changes: dict[str, Any]) -> ChangeQueue:
    """A queue as the reader fills it: a position-only entry, an update and an insert in one transaction (at
    LSN 40, skipping 1 after the update), and a delete in the next (at 50)."""
    changes_queue = ChangeQueue()
    changes_queue.entries.extend([(_NO_RECORD, at(30)), (changes[0], at(30, 1)), (changes[1], at(40)),
                                  (changes[2], at(50))])
    return changes_queue


UPDATE, INSERT, DELETE = ({"op": "u", "id": 1, "ts_ms": 5}, {"op": "c", "id": 2, "ts_ms": 5},
                          {"op": "d", "id": 3, "ts_ms": 6})


def test_a_batch_never_holds_more_records_than_asked_and_may_end_inside_a_change() -> None:
    """The task skips as many records as a checkpoint said it emitted after a restore, so a batch of a change
    that makes two records may end between them: the position is then the one before the change plus one."""
    q = queued(UPDATE, INSERT, DELETE)
    assert q.state() is None
    assert q.take(512, expand) == [] and q.state() == at(30).to_state()  # first a position, then records
    assert q.take(1, expand) == [("-U", 1)]
    assert q.state() == {**at(30).to_state(), "rows": 1}  # before the update, one of its records out
    state = q.state()
    assert q.take(2, expand) == [("+U", 1), ("c", 2)] and q.state() == at(40).to_state()
    assert q.take(5, expand) == [("d", 3)] and q.state() == at(50).to_state() and q.last_commit_ms == 6
    # restored mid-change: the reader queues from the update again; the queue hands out the rest of it
    assert state is not None
    restored = ChangeQueue()
    assert restored.restore(state) == at(30)
    restored.entries.extend([(UPDATE, at(30, 1)), (INSERT, at(40))])
    assert restored.take(512, expand) == [("+U", 1), ("c", 2)] and restored.state() == at(40).to_state()
    # one record per change (the Python API's source): the batch ends at max_records changes
    plain = queued(UPDATE, INSERT, DELETE)
    assert plain.take(2, None) == [] and plain.take(2, None) == [UPDATE, INSERT] and plain.state() == at(40).to_state()


def test_snapshot_rows_are_handed_out_one_batch_each() -> None:
    """A snapshot restored midway is read as of a new snapshot, so the task's skip of the records of a batch
    after its position could skip other rows: a snapshot row is a batch of its own, and the next position is
    after it."""
    rows = ChangeQueue()
    first, second = at(10), at(10)
    rows.entries.extend([(_NO_RECORD, at(10)), ({"op": "r", "id": 1}, first), ({"op": "r", "id": 2}, second),
                         (INSERT, at(40))])
    assert rows.take(512, None) == []
    assert rows.take(512, None) == [{"op": "r", "id": 1}] and rows.position is first
    assert rows.take(512, expand) == [("r", 2)] and rows.position is second
    assert rows.take(512, expand) == [("c", 2)]


def test_a_change_is_keyed_by_its_after_image_or_for_a_delete_its_before_image() -> None:
    assert change_key({"after": {"id": 3, "a": 1}, "before": {"id": 2}}, ["id"]) == (3,)
    assert change_key({"after": None, "before": {"id": 2, "k": "x"}}, ["id", "k"]) == (2, "x")
    assert change_key({"after": None, "before": None}, ["id"]) is None


def test_keys_are_dealt_to_subtasks_by_the_md5_of_their_text() -> None:
    assert [key_text(v) for v in (7, "a b", True, False, None)] == ["7", "a b", "t", "f", ""]
    # md5("7") = 8f14e45f...: its first 7 hex digits 0x8f14e45 = 150031941
    assert key_partition((7,), 1) == 0 and key_partition((7,), 2) == 150031941 % 2 == 1
    assert key_partition((7, "x"), 5) == int(hashlib.md5(b"7\x1fx").hexdigest()[:7], 16) % 5
    shares = [key_partition((k,), 3) for k in range(3000)]
    assert all(900 < shares.count(i) < 1100 for i in range(3))
    assert partition_sql(['"id"'], 3, 1) == (
        "mod(('x' || substr(md5(concat_ws(chr(31), \"id\"::text)), 1, 7))::bit(28)::int, 3) = 1")


def test_a_split_reader_passes_each_split_its_own_position_of_a_completed_checkpoint() -> None:
    class Confirming(Source):
        bounded = False

        def open(self, subtask_index: int, parallelism: int) -> None:
            super().open(subtask_index, parallelism)
            self.confirmed: list[tuple[int, object]] = []

        def read_batch(self, max_records: int) -> list[object]:
            return []

        def position(self) -> object:
            return f"at-{self.subtask_index}"

        def checkpoint_complete(self, checkpoint_id: int, position: object) -> None:
            self.confirmed.append((checkpoint_id, position))

    reader = SplitReader(Confirming())
    reader.restore({"splits": [[0, 3, "p0", 0], [2, 3, "p2", 0]], "next": 0})
    reader.checkpoint_complete(9, reader.position())
    assert [r[2].confirmed for r in reader._readers] == [[(9, "at-0")], [(9, "at-2")]]
    reader.checkpoint_complete(10, None)  # a position of another shape: nothing to confirm
    assert [len(r[2].confirmed) for r in reader._readers] == [1, 1]
