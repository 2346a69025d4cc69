"""A task's state backend restored from a checkpoint on real files: the same backend at another parallelism,
and across backends (a RocksDB checkpoint restored on memory; a memory one on RocksDB)."""

from __future__ import annotations

import os
from typing import Any

import pytest

from runtime.api import DiscardSink, GeneratorSource, Job, KeyedProcessFunction
from runtime.checkpointing import backend_snapshots
from runtime.execution.operators import Chain
from runtime.execution.task import RestoredState
from runtime.graph.job_config import JobConfig, StateConfig
from runtime.graph.partitioning import key_group, key_group_range
from runtime.graph.plan import Plan, Vertex
from runtime.graph.restore_spec import RestoreSpec
from runtime.state.backend import StateBackendError
from runtime.state.registry import make_backend
from runtime.state.rocksdb import available
from runtime.worker.state_backends import backend_for, backend_kind, restore_backend

pytestmark = pytest.mark.skipif(not available(), reason="the rocksdb extra is not installed")
MAX_PAR = 128


class Count(KeyedProcessFunction):
    def open(self, ctx: Any) -> None:
        self.count = ctx.value_state("count", default=0)

    def process(self, record: Any, ctx: Any) -> None:
        self.count.update(self.count.value() + 1)


def job(parallelism: int) -> Job:
    j = Job("t")
    (j.source(GeneratorSource(count=1), parallelism=parallelism).key_by(lambda r: r[0])
        .process(Count(), parallelism=parallelism).sink(DiscardSink()))
    return j


def plan(tmp_path: Any, parallelism: int, backend: str | None, restore_path: str = "") -> Plan:
    state = StateConfig(backend=backend, work_dir=str(tmp_path / "work")) if backend else StateConfig()
    return Plan(job_id="job-1", attempt=1, entry="m:f", name="t", sys_path="", channel_base=0,
                vertices=[Vertex(0, [0], parallelism, "src"), Vertex(1, [1, 2], parallelism, "Count")], edges=[],
                placement={}, workers={}, config=JobConfig(state=state),
                restore=RestoreSpec(path=restore_path, checkpoint_id=4) if restore_path else None)


RECORDS = [(f"k{i % 9}", i, 0) for i in range(90)]


def checkpoint_on_rocksdb(tmp_path: Any, parallelism: int) -> list[dict[str, Any]]:
    """Run the count at `parallelism` on RocksDB and checkpoint it as chk-4 of the job: the handles."""
    directory = tmp_path / "checkpoints" / "job-1" / "chk-4"
    os.makedirs(directory)
    handles = []
    for subtask in range(parallelism):
        groups = key_group_range(MAX_PAR, parallelism, subtask)
        chain = Chain(job(parallelism), [1, 2], subtask_index=subtask, parallelism=parallelism, attempt=0,
                      outputs=[], state_backend=make_backend("rocksdb", groups, work_dir=str(tmp_path / f"w{subtask}"),
                                                             options={}))
        chain.open()
        chain.process_batch([r for r in RECORDS if key_group(r[0], MAX_PAR) in groups])
        pending = chain.begin_state_snapshot(4)
        assert pending is not None
        handles.append(backend_snapshots.upload(pending, str(directory), savepoint=False))
        chain.close()
    assert {h["store"] for h in handles} == {"job"}
    assert all(os.path.exists(tmp_path / "checkpoints" / "job-1" / "shared" / f[1])
               for h in handles for f in h["shared_files"])
    return handles


def test_the_backend_comes_from_the_command_line_then_the_job_then_memory(tmp_path: Any) -> None:
    j = job(1)
    assert backend_kind(plan(tmp_path, 1, None), j) == "memory"
    j.state_backend = "rocksdb"
    assert backend_kind(plan(tmp_path, 1, None), j) == "rocksdb"
    assert backend_kind(plan(tmp_path, 1, "memory"), j) == "memory"
    assert backend_for(plan(tmp_path, 1, "memory"), Vertex(1, [1, 2], 1, "Count"), 0, j) is None
    assert backend_for(plan(tmp_path, 1, "rocksdb"), Vertex(0, [0], 1, "src"), 0, j) is None  # no keyed operator


def test_a_rocksdb_checkpoint_restores_on_rocksdb_at_another_parallelism(tmp_path: Any) -> None:
    handles = checkpoint_on_rocksdb(tmp_path, 2)
    path = str(tmp_path / "checkpoints" / "job-1" / "chk-4")
    for subtask in range(3):
        p = plan(tmp_path, 3, "rocksdb", path)
        backend = backend_for(p, p.vertices[1], subtask, job(3))
        assert backend is not None
        restore_backend(backend, RestoredState(backend=handles), p, p.vertices[1], subtask, job(3))
        groups = key_group_range(MAX_PAR, 3, subtask)
        got = {key: value for _, _, key, value in backend.scan(groups)}
        assert got == {f"k{k}": 10 for k in range(9) if key_group(f"k{k}", MAX_PAR) in groups}
        backend.close()


def test_a_rocksdb_checkpoint_restores_on_memory_as_dict_tables(tmp_path: Any) -> None:
    handles = checkpoint_on_rocksdb(tmp_path, 1)
    p = plan(tmp_path, 1, "memory", str(tmp_path / "checkpoints" / "job-1" / "chk-4" / "_metadata"))
    restored = RestoredState(keyed={1: {"\0timers:event": {}}}, backend=handles)
    restore_backend(None, restored, p, p.vertices[1], 0, job(1))
    assert restored.backend is None
    assert restored.keyed == {1: {"\0timers:event": {}, "count": {f"k{k}": 10 for k in range(9)}}}
    assert not os.listdir(tmp_path / "work")  # the scratch instance is gone


def test_a_memory_checkpoint_restores_on_rocksdb_through_the_tables(tmp_path: Any) -> None:
    backend = make_backend("rocksdb", range(MAX_PAR), work_dir=str(tmp_path / "w"), options={})
    chain = Chain(job(1), [1, 2], subtask_index=0, parallelism=1, attempt=1, outputs=[], state_backend=backend)
    chain.restore_state({1: {"count": {"a": 3, "b": 4}, "\0timers:event": {}}}, [])
    chain.open()
    chain.process_batch([("a", 1, 0)])
    assert {key: value for _, _, key, value in backend.scan(range(MAX_PAR))} == {"a": 4, "b": 4}
    chain.close()


def test_a_remote_checkpoint_cannot_restore_on_memory(tmp_path: Any) -> None:
    p = plan(tmp_path, 1, "memory", str(tmp_path / "chk-1"))
    restored = RestoredState(backend=[{"backend": "remote", "checkpoint_id": 1, "key_groups": [0, 128],
                                       "private_files": [], "shared_files": []}])
    with pytest.raises(StateBackendError, match="--state-backend remote"):
        restore_backend(None, restored, p, p.vertices[1], 0, job(1))


def test_snapshots_into_an_object_store_are_refused_in_one_line(tmp_path: Any) -> None:
    backend = make_backend("rocksdb", range(MAX_PAR), work_dir=str(tmp_path / "w"), options={})
    pending = backend.begin_snapshot(1)
    with pytest.raises(StateBackendError, match="object store"):
        backend_snapshots.upload(pending, "s3://bucket/checkpoints/job/chk-1", savepoint=False)
    backend.close()
    assert not os.path.exists(tmp_path / "w")


def test_a_savepoint_is_self_contained_and_the_next_checkpoint_uploads_everything_again(tmp_path: Any) -> None:
    backend = make_backend("rocksdb", range(MAX_PAR), work_dir=str(tmp_path / "w"), options={})
    backend.put_many([("1/count", key_group(f"k{i}", MAX_PAR), f"k{i}", i) for i in range(1000)])
    checkpoints = tmp_path / "checkpoints" / "job-1"
    first = backend_snapshots.upload(backend.begin_snapshot(1), str(checkpoints / "chk-1"), savepoint=False)
    savepoint = tmp_path / "savepoints" / "savepoint-job-1-2"
    saved = backend_snapshots.upload(backend.begin_snapshot(2), str(savepoint), savepoint=True)
    assert saved["store"] == "self" and saved["uploaded_bytes"] == saved["total_bytes"] > 0
    assert all(os.path.exists(savepoint / "shared" / f[1]) for f in saved["shared_files"])
    third = backend_snapshots.upload(backend.begin_snapshot(3), str(checkpoints / "chk-3"), savepoint=False)
    assert first["uploaded_bytes"] == first["total_bytes"] and third["uploaded_bytes"] == third["total_bytes"]
    backend.close()
    restored = make_backend("rocksdb", range(MAX_PAR), work_dir=str(tmp_path / "r"), options={})
    backend_snapshots.restore(restored, [saved], str(savepoint))
    assert sorted(v for _, _, _, v in restored.scan(range(MAX_PAR))) == list(range(1000))
    restored.close()
