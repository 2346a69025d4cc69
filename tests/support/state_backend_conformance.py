"""The conformance suite every state backend passes: batched get/put/delete, key-group bounds, ordered range
scans, snapshots that exclude later writes, restores that split and merge along key groups, and a clear
error for a missing file. A test module imports these tests and defines the `make` fixture (a `Factory`)
that builds its backend; pytest then runs them against that backend."""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest

from runtime.graph.partitioning import key_group, key_group_range
from runtime.state.backend import MISSING, SnapshotHandle, StateBackend, StateBackendError
from runtime.state.files import SnapshotStore

MAX_PAR = 128
ALL = range(0, MAX_PAR)

Factory = Callable[[range], StateBackend]


def entry(name: str, key: object, value: object) -> tuple[str, int, object, object]:
    return name, key_group(key, MAX_PAR), key, value


def test_get_put_delete_in_batches(make: Factory) -> None:
    b = make(ALL)
    b.put_many([entry("count", "a", 1), entry("count", "b", None), entry("sum", "a", [1, 2]),
                entry("count", ("t", 1), {"x": 1})])
    got = b.get_many([("count", key_group("a", MAX_PAR), "a"), ("count", key_group("b", MAX_PAR), "b"),
                      ("sum", key_group("a", MAX_PAR), "a"), ("count", key_group("zz", MAX_PAR), "zz"),
                      ("count", key_group(("t", 1), MAX_PAR), ("t", 1))])
    assert got == [1, None, [1, 2], MISSING, {"x": 1}]
    b.delete_many([("count", key_group("a", MAX_PAR), "a"), ("count", key_group("nope", MAX_PAR), "nope")])
    assert b.get_many([("count", key_group("a", MAX_PAR), "a"), ("sum", key_group("a", MAX_PAR), "a")]) == [
        MISSING, [1, 2]]
    b.write_many([entry("count", "a", 7)], [("sum", key_group("a", MAX_PAR), "a")])
    assert b.get_many([("count", key_group("a", MAX_PAR), "a"), ("sum", key_group("a", MAX_PAR), "a")]) == [
        7, MISSING]


def test_an_entry_outside_the_key_groups_is_refused(make: Factory) -> None:
    b = make(range(0, 10))
    with pytest.raises(StateBackendError, match="key group 50"):
        b.put_many([("count", 50, "k", 1)])


def test_scan_reads_exactly_a_key_group_range_in_group_order(make: Factory) -> None:
    b = make(ALL)
    keys = [f"k{i}" for i in range(300)]
    b.put_many([entry("count", k, i) for i, k in enumerate(keys)])
    part = range(20, 70)
    scanned = list(b.scan(part))
    assert [g for _, g, _, _ in scanned] == sorted(g for _, g, _, _ in scanned)
    assert {(k, v) for _, _, k, v in scanned} == {(k, i) for i, k in enumerate(keys)
                                                 if key_group(k, MAX_PAR) in part}


def test_snapshot_round_trip_with_later_writes_excluded(make: Factory, tmp_path: object) -> None:
    store = SnapshotStore(os.path.join(str(tmp_path), "checkpoints"))
    b = make(ALL)
    b.put_many([entry("count", f"k{i}", i) for i in range(500)])
    pending = b.begin_snapshot(1)
    b.put_many([entry("count", "k1", -1), entry("count", "late", 1)])  # after the synchronous part
    handle = pending.upload(store)
    assert SnapshotHandle.from_dict(handle.to_dict()) == handle
    restored = make(ALL)
    restored.restore(store, [handle])
    assert sorted((k, v) for _, _, k, v in restored.scan(ALL)) == sorted((f"k{i}", i) for i in range(500))


def test_restore_splits_and_merges_along_key_groups(make: Factory, tmp_path: object) -> None:
    store = SnapshotStore(os.path.join(str(tmp_path), "checkpoints"))
    data = {f"k{i}": i for i in range(400)}
    # two subtasks take a checkpoint ...
    handles = []
    for subtask in range(2):
        groups = key_group_range(MAX_PAR, 2, subtask)
        b = make(groups)
        b.put_many([entry("count", k, v) for k, v in data.items() if key_group(k, MAX_PAR) in groups])
        handles.append(b.snapshot(3, store))
    # ... restored at parallelism 3: each new subtask reads the handles that overlap its groups
    seen: dict[str, int] = {}
    for subtask in range(3):
        groups = key_group_range(MAX_PAR, 3, subtask)
        b = make(groups)
        b.restore(store, [h for h in handles if range(max(h.key_groups.start, groups.start),
                                                     min(h.key_groups.stop, groups.stop))])
        for _, group, key, value in b.scan(ALL):
            assert group in groups
            assert key not in seen
            seen[key] = value
    assert seen == data
    # and back to one subtask: a merge of all the handles
    one = make(ALL)
    one.restore(store, handles)
    assert {k: v for _, _, k, v in one.scan(ALL)} == data


def test_a_missing_snapshot_file_is_a_clear_error(make: Factory, tmp_path: object) -> None:
    store = SnapshotStore(os.path.join(str(tmp_path), "checkpoints"))
    b = make(ALL)
    b.put_many([entry("count", "a", 1)])
    handle = b.snapshot(1, store)
    os.unlink(store.path(handle.private_files[0]))
    with pytest.raises(StateBackendError, match="missing"):
        make(ALL).restore(store, [handle])
