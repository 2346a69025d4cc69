"""One conformance suite for every state backend, on real files; then RocksDB's incremental checkpoints."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.common.values import UnpicklableValue
from runtime.graph.partitioning import key_group
from runtime.state.backend import MISSING, SnapshotHandle, StateBackend, StateBackendError
from runtime.state.codec import StateCodecError, decode_key, encode_key
from runtime.state.files import SharedFileRegistry, SnapshotStore
from runtime.state.memory import MemoryBackend
from runtime.state.rocksdb import RocksDBBackend, available
from tests.support.state_backend_conformance import (  # the conformance suite, run here with the `make` fixture below
    ALL,
    MAX_PAR,
    Factory,
    entry,
    test_a_missing_snapshot_file_is_a_clear_error,
    test_an_entry_outside_the_key_groups_is_refused,
    test_get_put_delete_in_batches,
    test_restore_splits_and_merges_along_key_groups,
    test_scan_reads_exactly_a_key_group_range_in_group_order,
    test_snapshot_round_trip_with_later_writes_excluded,
)

__all__ = [  # re-exported so that pytest collects them in this module, against the memory and RocksDB backends
    "test_a_missing_snapshot_file_is_a_clear_error", "test_an_entry_outside_the_key_groups_is_refused",
    "test_get_put_delete_in_batches", "test_restore_splits_and_merges_along_key_groups",
    "test_scan_reads_exactly_a_key_group_range_in_group_order", "test_snapshot_round_trip_with_later_writes_excluded",
]

needs_rocksdb = pytest.mark.skipif(not available(), reason="the rocksdb extra is not installed")


@pytest.fixture(params=["memory", pytest.param("rocksdb", marks=needs_rocksdb)])
def make(request: pytest.FixtureRequest, tmp_path: object) -> Iterator[Factory]:
    made: list[StateBackend] = []
    counter = iter(range(1000))

    def factory(groups: range) -> StateBackend:
        if request.param == "memory":
            backend: StateBackend = MemoryBackend(groups)
        else:
            backend = RocksDBBackend(groups, directory=os.path.join(str(tmp_path), f"local-{next(counter)}"))
        made.append(backend)
        return backend

    yield factory
    for backend in made:
        backend.close()


KEYS = st.one_of(st.text(max_size=5), st.integers(-2**63, 2**63 - 1),
                 st.tuples(st.integers(0, 1000), st.text(max_size=3)))


@given(st.lists(st.tuples(st.sampled_from(["a", "b"]), KEYS), max_size=20),
       st.integers(min_value=0, max_value=65535))
@settings(max_examples=200, deadline=None)
def test_encoded_keys_round_trip_and_sort_by_key_group(pairs: list[tuple[str, object]], group: int) -> None:
    for name, key in pairs:
        assert decode_key(encode_key(name, group, key)) == (name, group, key)
    if group < 65535:
        assert encode_key("z" * 200, group, "\uffff" * 5) < encode_key("", group + 1, 0)


def test_a_key_that_cannot_be_encoded_is_a_clear_error() -> None:
    # an int past 64 bits is any other Python value now (runtime/common/values.py): pickled, and back
    assert decode_key(encode_key("count", 0, 2**70)) == ("count", 0, 2**70)
    with pytest.raises(UnpicklableValue, match="a keyed state's key: a value of type builtins.generator"):
        encode_key("count", 0, (i for i in range(1)))
    with pytest.raises(StateCodecError, match="longer than 255"):
        encode_key("n" * 300, 0, "k")


# -- RocksDB: incremental checkpoints -----------------------------------------------------------------

@pytest.fixture
def rocks(tmp_path: object) -> Iterator[RocksDBBackend]:
    if not available():
        pytest.skip("the rocksdb extra is not installed")
    b = RocksDBBackend(ALL, directory=os.path.join(str(tmp_path), "local"), write_buffer_bytes=1 << 20)
    yield b
    b.close()


def fill(b: StateBackend, start: int, count: int) -> None:
    for chunk in range(start, start + count, 5000):
        b.put_many([entry("count", f"key-{i}", "v" * 40) for i in range(chunk, min(chunk + 5000, start + count))])


def test_an_incremental_checkpoint_uploads_only_new_sst_files(rocks: RocksDBBackend, tmp_path: object) -> None:
    store = SnapshotStore(os.path.join(str(tmp_path), "checkpoints"))
    fill(rocks, 0, 20_000)
    first = rocks.snapshot(1, store)
    assert first.shared_files
    assert first.uploaded_bytes == first.total_bytes  # nothing was there before
    fill(rocks, 20_000, 2_000)
    second = rocks.snapshot(2, store)
    old = {f.name for f in first.shared_files}
    new = [f for f in second.shared_files if f.name not in old]
    reused = [f for f in second.shared_files if f.name in old]
    assert reused, "the second checkpoint references the first one's SST files"
    assert new, "the second checkpoint has the flushed new writes"
    private = sum(os.path.getsize(store.path(p)) for p in second.private_files)
    assert second.uploaded_bytes == sum(f.size for f in new) + private
    assert second.uploaded_bytes < first.uploaded_bytes / 2
    # nothing changed: only the private files (MANIFEST, CURRENT, OPTIONS, ...) and the memtable flush
    third = rocks.snapshot(3, store)
    assert {f.name for f in second.shared_files} <= {f.name for f in third.shared_files}
    restored = RocksDBBackend(ALL, directory=os.path.join(str(tmp_path), "restored"))
    try:
        restored.restore(store, [second])
        assert sum(1 for _ in restored.scan(ALL)) == 22_000
        # a restored instance goes on incrementally: its files are the shared ones
        fill(restored, 22_000, 10)
        after = restored.snapshot(4, store)
        assert {f.name for f in second.shared_files} <= {f.name for f in after.shared_files}
        assert after.uploaded_bytes < second.uploaded_bytes
    finally:
        restored.close()


def test_shared_files_are_deleted_when_the_last_checkpoint_referencing_them_is(
        rocks: RocksDBBackend, tmp_path: object) -> None:
    store = SnapshotStore(os.path.join(str(tmp_path), "checkpoints"))
    registry = SharedFileRegistry()
    fill(rocks, 0, 10_000)
    first = rocks.snapshot(1, store)
    registry.register(first)
    fill(rocks, 10_000, 10_000)
    rocks._db.compact_range(None, None)  # merges the SSTs: the first checkpoint's files are no longer live
    second = rocks.snapshot(2, store)
    registry.register(second)
    only_first = {f.name for f in first.shared_files} - {f.name for f in second.shared_files}
    assert only_first
    for f in first.shared_files:
        assert registry.count(f.name) == (1 if f.name in only_first else 2)
    deleted = store.discard(first, registry)
    assert sorted(deleted) == sorted(f"shared/{n}" for n in only_first)
    for f in first.shared_files:
        assert os.path.exists(store.shared_path(f.name)) == (f.name not in only_first)
    assert not any(os.path.exists(store.path(p)) for p in first.private_files)
    restored = RocksDBBackend(ALL, directory=os.path.join(str(tmp_path), "restored"))
    try:
        restored.restore(store, [second])  # what the second still references is all there
        assert sum(1 for _ in restored.scan(ALL)) == 20_000
    finally:
        restored.close()
    store.discard(second, registry)
    assert registry.referenced() == set()
    assert os.listdir(store.path("shared")) == []
    with pytest.raises(ValueError, match="no handle holds"):
        registry.release(second)


def test_the_synchronous_part_stays_short_whatever_the_state_size(rocks: RocksDBBackend, tmp_path: object) -> None:
    store = SnapshotStore(os.path.join(str(tmp_path), "checkpoints"))
    timings = []
    for round_ in range(4):
        fill(rocks, round_ * 30_000, 30_000)
        pending = rocks.begin_snapshot(round_)
        timings.append(pending.sync_seconds)
        pending.upload(store)
    # bounded by the memtable (1 MiB here), not by the state (4x larger at the end): the median against a bound
    # generous for a loaded box, the slowest against one a single stall of a busy machine stays under (a sync part
    # that copied the state would take seconds at the last round, every time)
    assert sorted(timings)[len(timings) // 2] < 0.5, timings
    assert max(timings) < 2.0, timings


def test_a_snapshot_of_another_backend_or_a_malformed_handle_is_refused(rocks: RocksDBBackend,
                                                                         tmp_path: object) -> None:
    store = SnapshotStore(os.path.join(str(tmp_path), "checkpoints"))
    memory = MemoryBackend(ALL)
    memory.put_many([entry("count", "a", 1)])
    handle = memory.snapshot(1, store)
    with pytest.raises(StateBackendError, match="taken by the memory backend"):
        rocks.restore(store, [handle])
    with pytest.raises(StateBackendError, match="taken by the rocksdb backend"):
        MemoryBackend(ALL).restore(store, [rocks.snapshot(2, store)])
    with pytest.raises(StateBackendError, match="malformed"):
        SnapshotHandle.from_dict({"backend": "rocksdb"})


OPS = st.lists(st.tuples(st.sampled_from(["put", "delete"]), st.sampled_from(["a", "b"]),
                         st.integers(0, 40), st.integers(0, 5)), max_size=60)


@pytest.mark.parametrize("kind", ["memory", pytest.param("rocksdb", marks=needs_rocksdb)])
@given(ops=OPS, split=st.integers(1, MAX_PAR - 1))
@settings(max_examples=40, deadline=None)
def test_any_sequence_of_writes_reads_scans_and_restores_like_a_dict(
        kind: str, ops: list[tuple[str, str, int, int]], split: int, tmp_path_factory: pytest.TempPathFactory) -> None:
    root = str(tmp_path_factory.mktemp("model"))

    def new(groups: range) -> StateBackend:
        if kind == "memory":
            return MemoryBackend(groups)
        return RocksDBBackend(groups, directory=os.path.join(root, "local"))

    model: dict[tuple[str, int, object], int] = {}
    store = SnapshotStore(os.path.join(root, "checkpoints"))
    with new(ALL) as b:
        for op, name, k, v in ops:
            address = (name, key_group(k, MAX_PAR), k)
            if op == "put":
                b.put_many([(*address, v)])
                model[address] = v
            else:
                b.delete_many([address])
                model.pop(address, None)
        addresses = [(n, key_group(k, MAX_PAR), k) for n in ("a", "b") for k in range(41)]
        assert b.get_many(addresses) == [model.get(a, MISSING) for a in addresses]
        assert {(n, g_, k): v for n, g_, k, v in b.scan(ALL)} == model
        handle = b.snapshot(1, store)
    for part in (range(0, split), range(split, MAX_PAR)):
        with new(part) as restored:
            restored.restore(store, [handle])
            assert {(n, g_, k): v for n, g_, k, v in restored.scan(ALL)} == {
                a: v for a, v in model.items() if a[1] in part}
