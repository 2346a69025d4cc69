#!/usr/bin/env python
"""State benchmark: synchronous vs asynchronous state access, epochs, capture vs drain, RocksDB checkpoints.

Parts 1 to 5 run standalone (no cluster, no task loop); part 6 runs jobs on a local cluster. In parts 1 to 5
the round trip is simulated by runtime/state/latency.py: an in-memory backend behind a fixed sleep per round
trip (--latency-ms, default 1), which isolates what batching and overlapping buy against a round-trip cost.
`--remote` measures the same against a real Valkey server (runtime/state/remote.py) behind a delay relay.

1. Throughput of a keyed count (read the key's count, write count + 1, emit) over --keys keys:
   - sync: each record does its read and its write as two round trips, one after the other (what a
     synchronous ValueState on a remote store would do);
   - async: AsyncKeyedProcessFunction through AsyncStateRunner, for each --in-flight bound;
   - both again without latency, to show the async framework's own cost.
2. Epochs: a watermark every --watermark-every records, strict vs out-of-order, at the largest bound.
3. Checkpoints while state I/O is slow: time from the barrier to the synchronous snapshot, drain vs
   capture, with --slow-latency-ms per round trip and the largest in-flight bound.
4. RocksDB checkpoints vs state size: synchronous part (ms), bytes uploaded by a full first checkpoint and
   by an incremental second one after updating 1 % of the keys; the memory backend's full snapshot beside.
5. The same through the wired task path (`--parts tasks`): a Chain's keyed operator on the memory path
   (dict tables; sync = the table copy a task takes at the barrier, bytes = the encoded operator state) and
   on RocksDB (BackendTables; sync = begin_state_snapshot, bytes = what the upload copied), with the
   operator's records/s while it fills the state.
6. On a cluster (`--parts cluster`): a local cluster of 2 workers runs the README's keyed count
   (runtime/examples/wordcount.py: GeneratorSource -> key_by -> count, parallelism 2 -> DiscardSink), sync
   (KeyedProcessFunction) vs async (AsyncKeyedProcessFunction through the wired task path), on the memory
   backend, and on RocksDB with --latency-ms per round trip (state.options.round_trip_ms). Records/s = records
   over the coordinator's submit -> FINISHED time (deployment included).

    .venv/bin/python scripts/bench_state.py
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from runtime.api import DiscardSink, GeneratorSource, Job, KeyedProcessFunction  # noqa: E402
from runtime.checkpointing.snapshots import encode_operator_state  # noqa: E402
from runtime.execution.async_controller import ControllerConfig, EpochMode, InFlightAtBarrier  # noqa: E402
from runtime.execution.async_state import (  # noqa: E402
    AsyncKeyedContext,
    AsyncKeyedProcessFunction,
    AsyncStateRunner,
)
from runtime.execution.operators import Chain  # noqa: E402
from runtime.graph.partitioning import key_group  # noqa: E402
from runtime.state.backend import MISSING, StateBackend  # noqa: E402
from runtime.state.files import SnapshotStore  # noqa: E402
from runtime.state.latency import LatencyBackend  # noqa: E402
from runtime.state.memory import MemoryBackend  # noqa: E402
from runtime.state.registry import make_backend  # noqa: E402
from runtime.state.rocksdb import RocksDBBackend, available  # noqa: E402

MAX_PAR = 128
ALL = range(MAX_PAR)


class Count(AsyncKeyedProcessFunction):
    async def process(self, record: Any, ctx: AsyncKeyedContext) -> None:
        state = ctx.value_state("count", 0)
        n = await state.value() + 1
        await state.update(n)
        ctx.emit(n)


def backend(latency_s: float) -> StateBackend:
    inner = MemoryBackend(ALL)
    return LatencyBackend(inner, round_trip_s=latency_s) if latency_s else inner


def sync_run(latency_s: float, n: int, keys: int) -> float:
    b = backend(latency_s)
    out = []
    started = time.perf_counter()
    for i in range(n):
        key = f"k{i % keys}"
        address = ("count", key_group(key, MAX_PAR), key)
        value = b.get_many([address])[0]
        count = (0 if value is MISSING else value) + 1
        b.put_many([(*address, count)])
        out.append(count)
    return n / (time.perf_counter() - started)


async def async_run(latency_s: float, n: int, keys: int, config: ControllerConfig,
                    watermark_every: int = 0) -> float:
    b = backend(latency_s)
    out: list[Any] = []
    runner = AsyncStateRunner(Count(), b, config, key_of=lambda r: r, emit=out.append)
    started = time.perf_counter()
    for i in range(n):
        await runner.process(f"k{i % keys}")
        if watermark_every and i % watermark_every == watermark_every - 1:
            runner.watermark(i)
    await runner.finish()
    elapsed = time.perf_counter() - started
    await runner.aclose()
    assert len(out) == n
    return n / elapsed


async def barrier_to_snapshot(latency_s: float, keys: int, config: ControllerConfig) -> float:
    """Seconds from the barrier to the synchronous snapshot, with the runner full of records in flight."""
    b = backend(latency_s)
    runner = AsyncStateRunner(Count(), b, config, key_of=lambda r: r, emit=lambda v: None)
    n = config.max_in_flight * 2
    for i in range(n):
        await runner.process(f"k{i % keys}")
    loop = asyncio.get_running_loop()
    barrier_at = loop.time()
    runner.barrier(1)
    await runner.finish()
    taken = runner.checkpoints[1].taken_at - barrier_at
    await runner.aclose()
    return taken


# -- the real remote backend: `--remote` -------------------------------------------------------------------

REMOTE_DOC = """The keyed count against the REAL remote backend (runtime/state/remote.py; the `remote` extra).

A Valkey server (tests/support/redis_server.py: append-only file, fsync always unless --remote-appendfsync says
otherwise) behind scripts/delay_relay.py, which adds --remote-one-way-ms each way (this kernel has no netem
to delay a veth; see docs/BENCHMARKS.md, Remote state). Sync (two round trips per record) vs async
(AsyncStateRunner, batched), then checkpoints vs state size: the synchronous part, the upload (manifest and
garbage collection; the second checkpoint after --remote-updates updated entries, the same number at every
size), the manifest's bytes, and a rescale's restore time.

    .venv/bin/python scripts/bench_state.py --remote [--json]
"""


def remote_main() -> None:
    """`--remote`: only this part, with its own options (the simulated parts above take theirs in main)."""
    parser = argparse.ArgumentParser(description=REMOTE_DOC, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--remote", action="store_true", required=True)
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--sync-records", type=int, default=1_000)
    parser.add_argument("--async-records", type=int, default=40_000)
    parser.add_argument("--in-flight", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--batch-size", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--remote-one-way-ms", type=float, default=0.5,
                        help="delay each way between the task and the server (0.5 -> 1 ms round trip)")
    parser.add_argument("--remote-sizes", type=int, nargs="+", default=[100_000, 400_000, 1_600_000])
    parser.add_argument("--remote-updates", type=int, default=10_000,
                        help="entries updated between the two measured checkpoints (the same for every size)")
    parser.add_argument("--remote-appendfsync", default="always", choices=["always", "everysec", "no"])
    args = parser.parse_args()
    results = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version()}, "args": vars(args),
               "remote": remote_benchmark(args)}
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        print_remote(results["remote"])


class RemoteSetUp:
    """A Valkey server (tests/support/redis_server.py) and a delay relay in front of it, both stopped by PID."""

    def __init__(self, root: str, one_way_ms: float, appendfsync: str) -> None:
        import subprocess
        from pathlib import Path

        from tests.support.redis_server import RedisServer

        self.server = RedisServer(Path(root) / "valkey", appendfsync=appendfsync)
        self.relay = subprocess.Popen(
            [sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "delay_relay.py"),
             "--upstream", self.server.address, "--one-way-ms", str(one_way_ms)],
            stdout=subprocess.PIPE, text=True, start_new_session=True)
        assert self.relay.stdout is not None
        line = self.relay.stdout.readline()  # the relay prints its address once it listens
        if not line.startswith("listening on "):
            self.close()
            raise RuntimeError(f"delay relay did not start: {line!r}")
        self.address = line.split()[-1]

    def round_trip_ms(self, samples: int = 200) -> float:
        """Median of PINGs through the relay: the round trip every state request pays."""
        import valkey

        from runtime.state.remote import parse_address
        host, port = parse_address(self.address)
        client = valkey.Valkey(host=host, port=port)
        client.ping()
        times = []
        for _ in range(samples):
            started = time.perf_counter()
            client.ping()
            times.append(time.perf_counter() - started)
        client.close()
        return statistics.median(times) * 1000

    def close(self) -> None:
        import subprocess

        if self.relay.poll() is None:
            self.relay.terminate()
            try:
                self.relay.wait(10)
            except subprocess.TimeoutExpired:
                self.relay.kill()
                self.relay.wait(10)
        self.server.stop()


def remote_backend(address: str, namespace: str, groups: range = ALL) -> StateBackend:
    from runtime.state.remote import RemoteBackend
    return RemoteBackend(groups, address=address, namespace=namespace)


def remote_sync_run(address: str, n: int, keys: int) -> float:
    with remote_backend(address, f"sync{os.urandom(4).hex()}") as b:
        started = time.perf_counter()
        for i in range(n):
            key = f"k{i % keys}"
            address_ = ("count", key_group(key, MAX_PAR), key)
            value = b.get_many([address_])[0]
            b.put_many([(*address_, (0 if value is MISSING else value) + 1)])
        return n / (time.perf_counter() - started)


async def remote_async_run(address: str, n: int, keys: int, config: ControllerConfig) -> tuple[float, int]:
    with remote_backend(address, f"async{os.urandom(4).hex()}") as b:
        out: list[Any] = []
        runner = AsyncStateRunner(Count(), b, config, key_of=lambda r: r, emit=out.append)
        started = time.perf_counter()
        for i in range(n):
            await runner.process(f"k{i % keys}")
        await runner.finish()
        elapsed = time.perf_counter() - started
        await runner.aclose()
        assert len(out) == n
        counts = b.get_many([("count", key_group(f"k{k}", MAX_PAR), f"k{k}") for k in range(min(keys, n))])
        assert sum(counts) == n, "every record's increment reached the server"
        return n / elapsed, b.statistics().round_trips


def remote_checkpoints(address: str, sizes: list[int], updates: int, value_bytes: int,
                       root: str) -> list[dict[str, Any]]:
    """Fill, checkpoint (its collection visits every new entry once), update `updates` entries, checkpoint again."""
    rows = []
    for size in sizes:
        store = SnapshotStore(tempfile.mkdtemp(dir=root))
        namespace = f"chk{size}{os.urandom(4).hex()}"
        with remote_backend(address, namespace) as b:
            fill_started = time.perf_counter()
            for start in range(0, size, 10_000):
                b.put_many([("count", key_group(f"key-{i}", MAX_PAR), f"key-{i}", value(i, value_bytes))
                            for i in range(start, min(start + 10_000, size))])
            fill_s = time.perf_counter() - fill_started
            first = b.begin_snapshot(1)
            started = time.perf_counter()
            first.upload(store)
            upload_first_s = time.perf_counter() - started
            step = max(1, size // updates)  # the same number of updated entries whatever the state size
            updated = range(0, size, step)
            for start in range(0, len(updated), 10_000):
                b.put_many([("count", key_group(f"key-{i}", MAX_PAR), f"key-{i}", value(i + 1, value_bytes))
                            for i in updated[start:start + 10_000]])
            second = b.begin_snapshot(2)
            started = time.perf_counter()
            h2 = second.upload(store)
            upload_second_s = time.perf_counter() - started
            # a rescale from 1 to 2 subtasks: each restores the handle for its half of the key groups
            started = time.perf_counter()
            halves = [remote_backend(address, namespace, range(0, MAX_PAR // 2)),
                      remote_backend(address, namespace, range(MAX_PAR // 2, MAX_PAR))]
            for half in halves:
                half.restore(store, [h2])
            rescale_s = time.perf_counter() - started
            probe = f"key-{size - 1}"
            owner = next(h for h in halves if key_group(probe, MAX_PAR) in h.key_groups)
            assert owner.get_many([("count", key_group(probe, MAX_PAR), probe)]) == [
                value(size - 1 + (1 if size - 1 in updated else 0), value_bytes)]
            for half in halves:
                half.close()
        rows.append({"entries": size, "fill_s": fill_s,
                     "sync_ms_first": first.sync_seconds * 1000, "sync_ms_second": second.sync_seconds * 1000,
                     "upload_ms_first": upload_first_s * 1000, "upload_ms_second": upload_second_s * 1000,
                     "manifest_bytes": h2.uploaded_bytes, "rescale_restore_ms": rescale_s * 1000})
        print(json.dumps(rows[-1]), file=sys.stderr)
    return rows


def remote_benchmark(args: argparse.Namespace) -> dict[str, Any]:
    from runtime.state.remote import available as remote_available
    if not remote_available():
        raise SystemExit("--remote needs the remote extra (scripts/bootstrap.sh installs it)")
    root = tempfile.mkdtemp(prefix="bench-remote-")
    setup = RemoteSetUp(root, args.remote_one_way_ms, args.remote_appendfsync)
    try:
        out: dict[str, Any] = {"round_trip_ms": setup.round_trip_ms(), "appendfsync": args.remote_appendfsync,
                               "one_way_ms": args.remote_one_way_ms, "throughput": []}
        print(json.dumps({"remote_round_trip_ms": out["round_trip_ms"]}), file=sys.stderr)
        sync = statistics.median(remote_sync_run(setup.address, args.sync_records, args.keys)
                                 for _ in range(args.repeats))
        out["throughput"].append({"mode": "sync", "records_per_s": sync})
        for bound in args.in_flight:
            config = ControllerConfig(max_in_flight=bound, batch_size=args.batch_size, max_parallelism=MAX_PAR)
            runs = [asyncio.run(remote_async_run(setup.address, args.async_records, args.keys, config))
                    for _ in range(args.repeats)]
            rate = statistics.median(r[0] for r in runs)
            out["throughput"].append({"mode": f"async, {bound} in flight", "records_per_s": rate,
                                      "vs_sync": rate / sync, "round_trips": runs[0][1]})
        print(json.dumps(out["throughput"]), file=sys.stderr)
        out["checkpoints"] = remote_checkpoints(setup.address, args.remote_sizes, args.remote_updates,
                                                args.value_bytes, root)
        return out
    finally:
        setup.close()
        shutil.rmtree(root, ignore_errors=True)


def print_remote(remote: dict[str, Any]) -> None:
    print(f"remote (Valkey, appendfsync {remote['appendfsync']}), round trip {remote['round_trip_ms']:.2f} ms "
          f"(median PING through the relay)")
    for row in remote["throughput"]:
        vs = f"{row['vs_sync']:.1f}x" if "vs_sync" in row else "-"
        print(f"  remote {row['mode']:<24} {row['records_per_s']:>10,.0f} records/s {vs:>8}")
    for row in remote["checkpoints"]:
        print(f"  remote {row['entries']:>9,} entries: sync {row['sync_ms_first']:.3f} / "
              f"{row['sync_ms_second']:.3f} ms, upload {row['upload_ms_first']:.0f} / "
              f"{row['upload_ms_second']:.0f} ms, manifest "
              f"{row['manifest_bytes']} B, rescale 1 -> 2 restore {row['rescale_restore_ms']:.1f} ms")


def value(i: int, size: int) -> str:
    """A value that compresses about as well as hex text: pseudo-random, different for every key."""
    digest = hashlib.blake2b(i.to_bytes(8, "big"), digest_size=32).hexdigest()
    return (digest * (size // len(digest) + 1))[:size]


def rocksdb_checkpoints(sizes: list[int], value_bytes: int, root: str) -> list[dict[str, Any]]:
    rows = []
    for size in sizes:
        work = tempfile.mkdtemp(dir=root)
        store = SnapshotStore(os.path.join(work, "checkpoints"))
        row: dict[str, Any] = {"entries": size}
        with RocksDBBackend(ALL, directory=os.path.join(work, "local")) as rocks:
            memory = MemoryBackend(ALL)
            for start in range(0, size, 10_000):
                batch = [("count", key_group(f"key-{i}", MAX_PAR), f"key-{i}", value(i, value_bytes))
                         for i in range(start, min(start + 10_000, size))]
                rocks.put_many(batch)
                memory.put_many(batch)
            first = rocks.begin_snapshot(1)
            h1 = first.upload(store)
            updated = [("count", key_group(f"key-{i}", MAX_PAR), f"key-{i}", value(i + 1, value_bytes))
                       for i in range(0, size, 100)]
            rocks.put_many(updated)
            second = rocks.begin_snapshot(2)
            h2 = second.upload(store)
            mem = memory.begin_snapshot(1)
            hm = mem.upload(SnapshotStore(os.path.join(work, "memory")))
            row.update(rocks_sync_ms_first=first.sync_seconds * 1000, rocks_sync_ms_second=second.sync_seconds * 1000,
                       rocks_uploaded_first=h1.uploaded_bytes, rocks_uploaded_second=h2.uploaded_bytes,
                       rocks_total_second=h2.total_bytes, memory_sync_ms=mem.sync_seconds * 1000,
                       memory_bytes=hm.uploaded_bytes)
        shutil.rmtree(work, ignore_errors=True)
        rows.append(row)
    return rows


class StoreValue(KeyedProcessFunction):
    """The wired path's keyed operator: read the key's value, write the record's payload (a keyed count that
    keeps a value of --value-bytes)."""

    def open(self, ctx: Any) -> None:
        self.state = ctx.value_state("v")

    def process(self, record: Any, ctx: Any) -> None:
        self.state.value()
        self.state.update(record[1])


def task_chain(backend: StateBackend | None) -> Chain:
    job = Job("bench")
    (job.source(GeneratorSource(count=1), parallelism=1).key_by(lambda r: r[0])
        .process(StoreValue(), parallelism=1).sink(DiscardSink()))
    chain = Chain(job, [1, 2], subtask_index=0, parallelism=1, attempt=0, outputs=[], state_backend=backend)
    chain.open()
    return chain


def memory_snapshot(chain: Chain) -> tuple[float, int]:
    """What a task on the memory backend does at a checkpoint: copy the dict tables at the barrier (the sync
    part, Task.snapshot_operator_state), then encode them (the file the writer thread uploads)."""
    started = time.perf_counter()
    keyed = {node: {name: table.copy() for name, table in tables.items()} for node, tables in
             chain.keyed_state.items()}
    sync_s = time.perf_counter() - started
    return sync_s, len(encode_operator_state(keyed, max_parallelism=MAX_PAR, source=None, sinks=[]))


def task_checkpoints(sizes: list[int], value_bytes: int, root: str) -> list[dict[str, Any]]:
    """Through the wired path (a Chain's keyed operator on each backend): records/s of the keyed operator, and
    per checkpoint the synchronous part and the bytes uploaded, first full, then after rewriting 1 % of keys."""
    rows = []
    for size in sizes:
        records = [(f"key-{i}", value(i, value_bytes)) for i in range(size)]
        changed = [(f"key-{i}", value(i + 1, value_bytes)) for i in range(0, size, 100)]
        for kind in ("memory", "rocksdb") if available() else ("memory",):
            work = tempfile.mkdtemp(dir=root)
            backend = None if kind == "memory" else make_backend(kind, ALL, work_dir=os.path.join(work, "local"),
                                                                 options={})
            chain = task_chain(backend)
            started = time.perf_counter()
            for start in range(0, size, 256):
                chain.process_batch(records[start:start + 256])
            rate = size / (time.perf_counter() - started)
            row: dict[str, Any] = {"backend": kind, "entries": size, "records_per_s": rate}
            for label, batch in (("first", []), ("second", changed)):
                chain.process_batch(batch)
                if backend is None:
                    sync_s, uploaded = memory_snapshot(chain)
                    total = uploaded
                else:
                    pending = chain.begin_state_snapshot(1 if label == "first" else 2)
                    assert pending is not None
                    sync_s = pending.sync_seconds
                    handle = pending.upload(SnapshotStore(os.path.join(work, "checkpoints")))
                    uploaded, total = handle.uploaded_bytes, handle.total_bytes
                row.update({f"sync_ms_{label}": sync_s * 1000, f"uploaded_{label}": uploaded,
                            f"total_{label}": total})
            chain.close()
            shutil.rmtree(work, ignore_errors=True)
            rows.append(row)
            print(json.dumps(row), file=sys.stderr)
    return rows


def cluster_run(entry: str, records: int, config: dict[str, Any], *, workers: int = 2,
                name: str = "bench-state") -> float:
    """Records/s of one job on a fresh local cluster of `workers` workers (submit -> FINISHED); the job reads its
    record count from SLUICE_BENCH_RECORDS (scripts/bench_async_io.py runs its jobs through this too)."""
    from runtime.cli.local_cluster import LocalCluster, run_job_on_cluster

    os.environ["SLUICE_BENCH_RECORDS"] = str(records)  # inherited by the cluster's processes
    log_dir = tempfile.mkdtemp(prefix=f"sluice-{name}-")
    cluster = LocalCluster(workers=workers, slots=2, log_dir=log_dir)
    try:
        cluster.start()
        summary = asyncio.run(run_job_on_cluster(cluster, entry, config=config, name=name, progress=None,
                                                 timeout_s=900))
        if summary["state"] != "FINISHED" or summary["restarts"]:
            raise RuntimeError(f"{entry} ended {summary['state']} after {summary['restarts']} restarts: "
                               f"{summary.get('error', '')} {summary.get('failures', [])}")
        return records / (summary["ended_at"] - summary["submitted_at"])
    finally:
        cluster.stop()
        shutil.rmtree(log_dir, ignore_errors=True)


def cluster_throughput(latency_ms: float, records: int, slow_records: int, repeats: int) -> list[dict[str, Any]]:
    rows = []
    work_dir = tempfile.mkdtemp(prefix="bench-state-cluster-")
    slow = {"state": {"backend": "rocksdb", "work_dir": work_dir, "options": {"round_trip_ms": latency_ms}}}
    try:
        for label, config, n in (("memory", {}, records), (f"rocksdb, {latency_ms:g} ms per round trip", slow,
                                                             slow_records)):
            for mode, entry, count in (("sync", "runtime.examples.wordcount:build_bench", n if not config else
                                        max(1, n // 20)),
                                       ("async", "runtime.examples.wordcount:build_async_bench", n)):
                rate = statistics.median(cluster_run(entry, count, config) for _ in range(repeats))
                rows.append({"backend": label, "mode": mode, "records": count, "records_per_s": rate})
                print(json.dumps(rows[-1]), file=sys.stderr)
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--latency-ms", type=float, default=1.0)
    parser.add_argument("--slow-latency-ms", type=float, default=20.0)
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--sync-records", type=int, default=1_000)
    parser.add_argument("--async-records", type=int, default=40_000)
    parser.add_argument("--in-flight", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--batch-size", type=int, default=200)
    parser.add_argument("--watermark-every", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 400_000, 1_600_000])
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--cluster-records", type=int, default=1_000_000,
                        help="records per cluster job (memory; --parts cluster)")
    parser.add_argument("--cluster-slow-records", type=int, default=100_000,
                        help="records of the async job at --latency-ms (the sync one runs 1/20 of them)")
    parser.add_argument("--parts", nargs="+", default=["throughput", "epochs", "checkpoints", "rocksdb", "tasks"],
                        choices=["throughput", "epochs", "checkpoints", "rocksdb", "tasks", "cluster"])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    latency = args.latency_ms / 1000
    results: dict[str, Any] = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
                               "args": vars(args)}

    def median(f: Any) -> float:
        return statistics.median(f() for _ in range(args.repeats))

    throughput: list[dict[str, Any]] = []
    for lat in (latency, 0.0) if "throughput" in args.parts else ():
        sync = median(lambda lat=lat: sync_run(lat, args.sync_records if lat else args.async_records, args.keys))
        throughput.append({"latency_ms": lat * 1000, "mode": "sync", "records_per_s": sync})
        for bound in args.in_flight:
            config = ControllerConfig(max_in_flight=bound, batch_size=args.batch_size, max_parallelism=MAX_PAR)
            rate = median(lambda lat=lat, config=config: asyncio.run(
                async_run(lat, args.async_records, args.keys, config)))
            throughput.append({"latency_ms": lat * 1000, "mode": f"async, {bound} in flight",
                               "records_per_s": rate, "vs_sync": rate / sync})
        print(json.dumps(throughput[-1 - len(args.in_flight):]), file=sys.stderr)
    results["throughput"] = throughput

    epochs = []
    bound = max(args.in_flight)
    for mode in EpochMode if "epochs" in args.parts else ():
        config = ControllerConfig(max_in_flight=bound, batch_size=args.batch_size, epoch_mode=mode,
                                  max_parallelism=MAX_PAR)
        rate = median(lambda config=config: asyncio.run(
            async_run(latency, args.async_records, args.keys, config, args.watermark_every)))
        epochs.append({"epoch_mode": mode.value, "records_per_s": rate})
    results["epochs"] = epochs
    print(json.dumps(epochs), file=sys.stderr)

    checkpoints = []
    for mode in InFlightAtBarrier if "checkpoints" in args.parts else ():
        config = ControllerConfig(max_in_flight=bound, batch_size=args.batch_size, checkpoint_mode=mode,
                                  max_parallelism=MAX_PAR)
        seconds = median(lambda config=config: asyncio.run(
            barrier_to_snapshot(args.slow_latency_ms / 1000, args.keys, config)))
        checkpoints.append({"checkpoint_mode": mode.value, "barrier_to_snapshot_ms": seconds * 1000})
    results["checkpoints"] = checkpoints
    print(json.dumps(checkpoints), file=sys.stderr)

    if available() and "rocksdb" in args.parts:
        root = tempfile.mkdtemp(prefix="bench-state-")
        try:
            results["rocksdb"] = rocksdb_checkpoints(args.sizes, args.value_bytes, root)
        finally:
            shutil.rmtree(root, ignore_errors=True)
    if "tasks" in args.parts:
        root = tempfile.mkdtemp(prefix="bench-state-")
        try:
            results["tasks"] = task_checkpoints(args.sizes, args.value_bytes, root)
        finally:
            shutil.rmtree(root, ignore_errors=True)
    if "cluster" in args.parts:
        results["cluster"] = cluster_throughput(args.latency_ms, args.cluster_records, args.cluster_slow_records,
                                                args.repeats)
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(f"{'latency':>8} {'mode':<24} {'records/s':>10} {'vs sync':>8}")
    for row in throughput:
        vs = f"{row['vs_sync']:.1f}x" if "vs_sync" in row else "-"
        print(f"{row['latency_ms']:>6.1f}ms {row['mode']:<24} {row['records_per_s']:>10,.0f} {vs:>8}")
    for row in epochs:
        print(f"epochs {row['epoch_mode']:<14} {row['records_per_s']:>10,.0f} records/s")
    for row in checkpoints:
        print(f"checkpoint {row['checkpoint_mode']:<8} barrier -> snapshot {row['barrier_to_snapshot_ms']:.1f} ms")
    for row in results.get("rocksdb", []):
        print(f"rocksdb {row['entries']:>9,} entries: sync {row['rocks_sync_ms_first']:.1f} / "
              f"{row['rocks_sync_ms_second']:.1f} ms, uploaded {row['rocks_uploaded_first'] / 2**20:.1f} MiB then "
              f"{row['rocks_uploaded_second'] / 2**20:.2f} MiB of {row['rocks_total_second'] / 2**20:.1f} MiB; "
              f"memory sync {row['memory_sync_ms']:.1f} ms, {row['memory_bytes'] / 2**20:.1f} MiB")
    for row in results.get("tasks", []):
        print(f"task on {row['backend']:<7} {row['entries']:>9,} keys: {row['records_per_s']:>9,.0f} records/s; "
              f"checkpoint sync {row['sync_ms_first']:.1f} / {row['sync_ms_second']:.1f} ms, uploaded "
              f"{row['uploaded_first'] / 2**20:.1f} MiB then {row['uploaded_second'] / 2**20:.2f} MiB "
              f"(of {row['total_second'] / 2**20:.1f} MiB)")
    for row in results.get("cluster", []):
        print(f"cluster, {row['backend']:<28} {row['mode']:<5} {row['records']:>9,} records: "
              f"{row['records_per_s']:>9,.0f} records/s")


if __name__ == "__main__":
    remote_main() if "--remote" in sys.argv[1:] else main()
