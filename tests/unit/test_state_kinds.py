"""Keyed state kinds (value, list, map, reducing, aggregating) and state TTL, on every backend.

The same tests run on the memory path (plain dict tables) and on RocksDB (BackendTables over a real
RocksDB instance on disk): the kinds only see a table, so both must behave the same. Then the wiring: a
Chain whose keyed state lives on RocksDB, snapshotted, and restored at another parallelism by key groups.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from runtime.api import (
    AggregateFunction,
    DiscardSink,
    GeneratorSource,
    Job,
    KeyedContext,
    KeyedProcessFunction,
)
from runtime.api.state import AggregatingState, KeyedListState, MapState, ReducingState, TtlValueState
from runtime.execution.operators import Chain
from runtime.graph.partitioning import key_group, key_group_range
from runtime.state.backend import StateBackend, StateBackendError
from runtime.state.files import SnapshotStore
from runtime.state.registry import make_backend
from runtime.state.rocksdb import RocksDBBackend, available
from runtime.state.tables import BackendTable, BackendTables

MAX_PAR = 128
needs_rocksdb = pytest.mark.skipif(not available(), reason="the rocksdb extra is not installed")


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000

    def __call__(self) -> int:
        return self.now


Tables = Callable[[], Any]  # a fresh keyed-operator table mapping: {} or BackendTables


@pytest.fixture(params=["memory", pytest.param("rocksdb", marks=needs_rocksdb)])
def tables(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[Tables]:
    backends: list[StateBackend] = []

    def make() -> Any:
        if request.param == "memory":
            return {}
        backend = RocksDBBackend(range(MAX_PAR), directory=os.path.join(str(tmp_path), f"db-{len(backends)}"))
        backends.append(backend)
        return BackendTables(backend, 7, MAX_PAR)

    yield make
    for b in backends:
        b.close()


def context(state: Any) -> KeyedContext:
    return KeyedContext(lambda r: None, 0, 1, "op", state)


def test_value_state_per_key(tables: Tables) -> None:
    ctx = context(tables())
    count = ctx.value_state("count", default=0)
    for key in ["a", "b", "a", ("t", 1), "a"]:
        ctx.current_key = key
        count.update(count.value() + 1)
    ctx.current_key = "a"
    assert count.value() == 3
    ctx.current_key = ("t", 1)
    assert count.value() == 1
    count.clear()
    assert count.value() == 0


def test_list_state(tables: Tables) -> None:
    ctx = context(tables())
    items = ctx.list_state("items")
    ctx.current_key = "a"
    assert items.get() == []
    items.add(1)
    items.add_all([2, 3])
    items.add_all([])
    ctx.current_key = "b"
    items.add("x")
    ctx.current_key = "a"
    got = items.get()
    assert got == [1, 2, 3]
    got.append(99)  # a copy: changing it changes nothing stored
    assert items.get() == [1, 2, 3]
    items.update([5])
    assert items.get() == [5]
    items.clear()
    assert items.get() == []
    ctx.current_key = "b"
    assert items.get() == ["x"]
    items.update([])
    assert items.get() == []


def test_map_state(tables: Tables) -> None:
    ctx = context(tables())
    m = ctx.map_state("m")
    ctx.current_key = "a"
    assert m.is_empty() and m.get("x") is None and m.get("x", 0) == 0
    m.put("x", 1)
    m.put("y", [1, 2])
    m.put_all({"z": 3, 4: "four"})
    assert m.contains("x") and not m.contains("nope")
    assert m.get("y") == [1, 2]
    assert sorted(m.keys(), key=str) == [4, "x", "y", "z"]
    assert dict(m.items()) == {"x": 1, "y": [1, 2], "z": 3, 4: "four"}
    assert sorted(map(str, m.values())) == ["1", "3", "[1, 2]", "four"]
    m.remove("x")
    m.remove("absent")
    assert not m.contains("x")
    ctx.current_key = "b"
    assert m.is_empty()
    ctx.current_key = "a"
    m.clear()
    assert m.is_empty()


def test_reducing_state(tables: Tables) -> None:
    ctx = context(tables())
    total = ctx.reducing_state("sum", lambda a, b: a + b)
    ctx.current_key = "a"
    assert total.get() is None
    for v in (1, 2, 3):
        total.add(v)
    ctx.current_key = "b"
    total.add(10)
    ctx.current_key = "a"
    assert total.get() == 6
    total.clear()
    assert total.get() is None


class Average(AggregateFunction[float, list[float], float]):
    def create_accumulator(self) -> list[float]:
        return [0.0, 0]

    def add(self, value: float, accumulator: list[float]) -> list[float]:
        return [accumulator[0] + value, accumulator[1] + 1]

    def get_result(self, accumulator: list[float]) -> float:
        return accumulator[0] / accumulator[1]

    def merge(self, a: list[float], b: list[float]) -> list[float]:
        return [a[0] + b[0], a[1] + b[1]]


def test_aggregating_state(tables: Tables) -> None:
    ctx = context(tables())
    avg = ctx.aggregating_state("avg", Average())
    ctx.current_key = "a"
    assert avg.get() is None
    for v in (1.0, 2.0, 6.0):
        avg.add(v)
    assert avg.get() == 3.0
    ctx.current_key = "b"
    avg.add(5.0)
    assert avg.get() == 5.0
    avg.clear()
    assert avg.get() is None


def test_writes_replace_values_so_a_memory_snapshot_copy_is_not_changed_later() -> None:
    state: dict[str, Any] = {}
    ctx = context(state)
    items, m, total = ctx.list_state("l"), ctx.map_state("m"), ctx.reducing_state("r", lambda a, b: a + b)
    ctx.current_key = "k"
    items.add(1)
    m.put("a", 1)
    total.add(1)
    snapshot = {name: dict(table) for name, table in state.items()}  # what Task.snapshot_operator_state takes
    items.add(2)
    m.put("b", 2)
    total.add(1)
    assert snapshot == {"l": {"k": [1]}, "m": {"k": {"a": 1}}, "r": {"k": 1}}


# -- TTL -------------------------------------------------------------------------------------------------------


def test_value_ttl_expires_after_the_last_write_and_reads_do_not_extend_it(tables: Tables) -> None:
    t = tables()
    table = t.setdefault("v", {})
    clock = Clock()
    ctx = context(t)
    v = TtlValueState(table, "default", ctx, ttl_ms=100, clock=clock)
    ctx.current_key = "a"
    v.update("x")
    clock.now += 60
    assert v.value() == "x"  # a read does not extend the TTL
    clock.now += 39
    assert v.value() == "x"
    clock.now += 1
    assert v.value() == "default"
    assert table.get("a") is None  # deleted when the read came across it
    v.update("y")
    clock.now += 99
    assert v.value() == "y"
    v.update("z")  # a write does extend it
    clock.now += 99
    assert v.value() == "z"


def test_value_state_with_ttl_through_the_context(tables: Tables) -> None:
    ctx = context(tables())
    v = ctx.value_state("v", default=0, ttl_ms=60_000)
    ctx.current_key = "a"
    v.update(v.value() + 1)
    assert v.value() == 1
    with pytest.raises(ValueError, match="ttl_ms must be positive"):
        ctx.value_state("w", ttl_ms=0)


def test_list_ttl_expires_each_element(tables: Tables) -> None:
    t = tables()
    table = t.setdefault("l", {})
    clock = Clock()
    ctx = context(t)
    items = KeyedListState(table, ctx, ttl_ms=100, clock=clock)
    ctx.current_key = "a"
    items.add(1)
    clock.now += 50
    items.add_all([2, 3])
    clock.now += 50
    assert items.get() == [2, 3]
    assert len(table.get("a")) == 2  # the expired element was dropped on the read
    clock.now += 50
    assert items.get() == []
    assert table.get("a") is None
    items.update([7, 8])
    assert items.get() == [7, 8]


def test_map_ttl_expires_each_entry(tables: Tables) -> None:
    t = tables()
    table = t.setdefault("m", {})
    clock = Clock()
    ctx = context(t)
    m = MapState(table, ctx, ttl_ms=100, clock=clock)
    ctx.current_key = "a"
    m.put("old", 1)
    clock.now += 50
    m.put("new", 2)
    clock.now += 50
    assert dict(m.items()) == {"new": 2}
    assert not m.contains("old") and m.get("new") == 2
    assert list(table.get("a")) == ["new"]
    clock.now += 50
    assert m.is_empty()
    assert table.get("a") is None


def test_reducing_and_aggregating_ttl(tables: Tables) -> None:
    t = tables()
    clock = Clock()
    ctx = context(t)
    total = ReducingState(t.setdefault("r", {}), ctx, lambda a, b: a + b, ttl_ms=100, clock=clock)
    avg = AggregatingState(t.setdefault("g", {}), ctx, Average(), ttl_ms=100, clock=clock)
    ctx.current_key = "a"
    total.add(1)
    avg.add(4.0)
    clock.now += 99
    total.add(1)  # folded into the live value, and its expiry extended
    avg.add(2.0)
    clock.now += 99
    assert total.get() == 2 and avg.get() == 3.0
    clock.now += 1
    assert total.get() is None and avg.get() is None
    total.add(5)
    assert total.get() == 5  # starts over after expiry


# -- tables on a backend ---------------------------------------------------------------------------------------


@needs_rocksdb
def test_backend_tables_keep_timer_tables_in_memory_and_name_state_by_operator(tmp_path: Any) -> None:
    with RocksDBBackend(range(MAX_PAR), directory=str(tmp_path / "db")) as backend:
        tables = BackendTables(backend, 3, MAX_PAR)
        timers = tables.setdefault("\0timers:event", {})
        count = tables.setdefault("count", {})
        assert isinstance(timers, dict) and isinstance(count, BackendTable)
        assert tables.setdefault("count", {}) is count
        count["k"] = 5
        count.update({"j": 1, ("t", 2): 2})
        assert [e for e in backend.scan(range(MAX_PAR)) if e[2] == "k"] == [("3/count", key_group("k", MAX_PAR),
                                                                            "k", 5)]
        assert dict(count.items()) == {"k": 5, "j": 1, ("t", 2): 2} and len(count) == 3 and "j" in count
        assert count.pop("j") == 1 and count.pop("j", "gone") == "gone"
        with pytest.raises(KeyError):
            count["j"]
        assert tables.in_memory() == {"\0timers:event": {}}
        count.clear()
        assert len(count) == 0


class Lists(KeyedProcessFunction):
    """Keeps every record's sequence number per key in a list, a map and a reducing sum."""

    def open(self, ctx: Any) -> None:
        self.seen = ctx.list_state("seen")
        self.by_seq = ctx.map_state("by_seq")
        self.total = ctx.reducing_state("total", lambda a, b: a + b)

    def process(self, record: Any, ctx: Any) -> None:
        self.seen.add(record[1])
        self.by_seq.put(record[1], record[0])
        self.total.add(1)


def chain_on(backend: StateBackend | None, parallelism: int, subtask: int) -> Chain:
    job = Job("t")
    (job.source(GeneratorSource(count=10, keys=5, seed=1), parallelism=parallelism)
        .key_by(lambda r: r[0]).process(Lists(), parallelism=parallelism).sink(DiscardSink()))
    chain = Chain(job, [1, 2], subtask_index=subtask, parallelism=parallelism, attempt=0, outputs=[],
                  state_backend=backend)
    chain.open()
    return chain


@needs_rocksdb
def test_a_chain_on_rocksdb_snapshots_and_restores_at_another_parallelism(tmp_path: Any) -> None:
    store = SnapshotStore(str(tmp_path / "store"))
    records = [(f"k{i % 7}", i, 0) for i in range(200)]
    handles = []
    for subtask in range(2):
        groups = key_group_range(MAX_PAR, 2, subtask)
        backend = make_backend("rocksdb", groups, work_dir=str(tmp_path / f"old-{subtask}"), options={})
        chain = chain_on(backend, 2, subtask)
        chain.process_batch([r for r in records if key_group(r[0], MAX_PAR) in groups])
        pending = chain.begin_state_snapshot(5)
        assert pending is not None and pending.sync_seconds < 1.0
        handles.append(pending.upload(store))
        chain.close()
    # one subtask now: it reads both old subtasks' snapshots, each for the groups it owns (all of them)
    merged = make_backend("rocksdb", range(MAX_PAR), work_dir=str(tmp_path / "new"), options={})
    merged.restore(store, handles)
    chain = chain_on(merged, 1, 0)
    ctx = chain.operators[0].ctx
    fn = chain.operators[0].node.payload
    assert isinstance(ctx, KeyedContext) and isinstance(fn, Lists)
    for k in range(7):
        ctx.current_key = f"k{k}"
        expected = [i for key, i, _ in records if key == f"k{k}"]
        assert fn.seen.get() == expected
        assert dict(fn.by_seq.items()) == {i: f"k{k}" for i in expected}
        assert fn.total.get() == len(expected)
    chain.close()
    # three subtasks: each reads only its own key groups out of the old snapshots
    for subtask in range(3):
        groups = key_group_range(MAX_PAR, 3, subtask)
        part = make_backend("rocksdb", groups, work_dir=str(tmp_path / f"three-{subtask}"), options={})
        part.restore(store, handles)
        keys = {key for name, _, key, _ in part.scan(groups) if name.endswith("/seen")}
        assert keys == {f"k{k}" for k in range(7) if key_group(f"k{k}", MAX_PAR) in groups}
        part.close()


def test_the_memory_path_has_no_backend_and_dict_tables() -> None:
    chain = chain_on(None, 1, 0)
    assert chain.begin_state_snapshot(1) is None
    chain.process_batch([("a", 1, 0), ("a", 2, 0)])
    tables = chain.keyed_state[1]
    assert type(tables) is dict and tables["seen"] == {"a": [1, 2]} and tables["total"] == {"a": 2}


# -- the registry ----------------------------------------------------------------------------------------------


def test_make_backend_refuses_unknown_kinds_and_a_remote_without_address(tmp_path: Any) -> None:
    with pytest.raises(StateBackendError, match="unknown state backend 'disk'"):
        make_backend("disk", range(4), work_dir=str(tmp_path), options={})
    with pytest.raises(StateBackendError, match="--state-remote-address"):
        make_backend("remote", range(4), work_dir=str(tmp_path), options={})
    assert make_backend("memory", range(4), work_dir=str(tmp_path), options={}).name == "memory"


def test_make_backend_remote_without_its_module_says_so(tmp_path: Any) -> None:
    try:
        import runtime.state.remote  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("runtime/state/remote.py is installed: the remote backend's own tests cover it")
    with pytest.raises(StateBackendError, match="remote state backend is not available"):
        make_backend("remote", range(4), work_dir=str(tmp_path), options={"remote_address": "127.0.0.1:1"})


def test_job_state_backend_default_is_checked() -> None:
    from runtime.api import JobDefinitionError

    job = Job("j", state_backend="rocksdb")
    assert job.state_backend == "rocksdb"
    job.state_backend = None
    with pytest.raises(JobDefinitionError, match="unknown state backend"):
        job.state_backend = "disk"
