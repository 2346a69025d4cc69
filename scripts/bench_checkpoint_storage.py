#!/usr/bin/env python
"""RocksDB checkpoint duration to a local directory vs an S3-compatible bucket (moto's server, a local process).

The same state each time: --entries keys of --value-bytes in one RocksDB backend. Per store and repetition: a
full first checkpoint (every SST file uploaded), then --update-pct % of the keys rewritten and an incremental
second one; duration = begin_snapshot + upload (runtime/checkpointing/backend_snapshots.py), what the worker's
checkpoint writer thread spends. Medians over --repeat. Needs the rocksdb and test extras (moto).

    .venv/bin/python scripts/bench_checkpoint_storage.py
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from runtime.checkpointing import backend_snapshots  # noqa: E402
from runtime.common import objectstore  # noqa: E402
from runtime.graph.partitioning import key_group  # noqa: E402
from runtime.state.registry import make_backend  # noqa: E402
from tests.support.s3_server import S3Server, client_env  # noqa: E402

MAX_PAR = 128


def checkpoint_seconds(root: str, args: argparse.Namespace, work: str) -> tuple[float, float]:
    backend = make_backend("rocksdb", range(MAX_PAR), work_dir=os.path.join(work, secrets.token_hex(4)), options={})
    value = b"v" * args.value_bytes
    for start in range(0, args.entries, 10_000):
        backend.put_many([("1/count", key_group(f"k{i}", MAX_PAR), f"k{i}", value)
                          for i in range(start, min(start + 10_000, args.entries))])
    job_dir = objectstore.join(root, "checkpoints", secrets.token_hex(4))
    times = []
    for n in (1, 2):
        if n == 2:
            step = max(1, int(100 / args.update_pct))
            backend.put_many([("1/count", key_group(f"k{i}", MAX_PAR), f"k{i}", value + b"!")
                              for i in range(0, args.entries, step)])
        t0 = time.perf_counter()
        backend_snapshots.upload(backend.begin_snapshot(n), objectstore.join(job_dir, f"chk-{n}"), savepoint=False)
        times.append(time.perf_counter() - t0)
    backend.close()
    return times[0], times[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--entries", type=int, default=200_000)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--update-pct", type=float, default=1.0)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work, S3Server.start() as s3, client_env(s3):
        bucket = f"bench-{secrets.token_hex(4)}"
        s3.create_bucket(bucket)
        roots = {"local": os.path.join(work, "store"), "s3 (moto)": f"s3://{bucket}/bench"}
        results: dict[str, list[tuple[float, float]]] = {name: [] for name in roots}
        for _ in range(args.repeat):  # interleaved, so drift on a shared machine hits both alike
            for name, root in roots.items():
                results[name].append(checkpoint_seconds(root, args, work))
    print(f"RocksDB, {args.entries:,} entries x {args.value_bytes} B, medians of {args.repeat}:")
    for name, runs in results.items():
        full = statistics.median(r[0] for r in runs) * 1000
        incremental = statistics.median(r[1] for r in runs) * 1000
        print(f"  {name:>10}: full checkpoint {full:7.1f} ms, incremental ({args.update_pct:g} % updated) "
              f"{incremental:7.1f} ms")


if __name__ == "__main__":
    main()
