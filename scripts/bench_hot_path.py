#!/usr/bin/env python
"""Micro-benchmark of the hot path in one process, without the network: CPU per record of each side.

- producer: a GeneratorSource batch through a hash RecordWriter into 2 subpartitions (32 KiB buffers),
  one record per call (`RecordWriter.emit`) and a list per call (`RecordWriter.emit_batch`);
- consumer: those buffers decoded and run through the keyed running count of the throughput benchmark
  (keyed Count -> DiscardSink), one record per call (Unpacker iteration, `Chain.process`) and a chunk per
  call (`ChannelReader.take`, `Chain.process_batch`).

    .venv/bin/python scripts/bench_hot_path.py --records 1000000 --repeat 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from netstack.credit import ChannelSender, SendData  # noqa: E402
from runtime.api import DiscardSink, GeneratorSource, Job  # noqa: E402
from runtime.examples.wordcount import Count  # noqa: E402
from runtime.execution.channels import ChannelReader, Subpartition  # noqa: E402
from runtime.execution.operators import Chain, RecordWriter  # noqa: E402

CAPACITY = 32 * 1024
CHUNK = 256


def make_writer() -> RecordWriter:
    subs = []
    for c in range(2):
        sender = ChannelSender(c)
        sender.add_credit(10**9)
        subs.append(Subpartition(sender, limit=10**9, capacity=CAPACITY))
    return RecordWriter(subs, "hash", lambda r: r[0], 128, 0)


def drain(writer: RecordWriter) -> list[bytes]:
    writer.flush()
    out = []
    for sub in writer.subpartitions:
        while (item := sub.sender.pop_sendable()) is not None:
            if isinstance(item, SendData):
                out.append(item.buffer.data)
    return out


def produce(records: int, batched: bool) -> tuple[float, list[bytes]]:
    source = GeneratorSource(count=records, keys=1000, seed=7)
    source.open(0, 1)
    writer = make_writer()
    t0 = time.process_time()
    while (batch := source.read_batch(512)) is not None:
        if batched:
            for i in range(0, len(batch), CHUNK):
                writer.emit_batch(batch[i:i + CHUNK])
        else:
            emit = writer.emit
            for record in batch:
                emit(record)
    return time.process_time() - t0, drain(writer)


def count_chain() -> Chain:
    job = Job("bench")
    job.source(GeneratorSource(count=0), parallelism=1).key_by(lambda r: r[0]).process(Count()).sink(DiscardSink())
    chain = Chain(job, [n.id for n in job.nodes[1:]], subtask_index=0, parallelism=1, attempt=0, outputs=[])
    chain.open()
    return chain


def consume(buffers: list[bytes], batched: bool) -> tuple[float, int]:
    chain = count_chain()
    reader = ChannelReader()
    t0 = time.process_time()
    for data in buffers:
        reader.feed(data)
        if batched:
            while records := reader.take(CHUNK):
                chain.process_batch(records)
                reader.consumed = reader.fetched
        else:
            process, tell = chain.process, reader.unpacker.tell
            for record in reader.unpacker:
                process(record)
                reader.consumed = tell()
        reader.trim()
    return time.process_time() - t0, chain.records_out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    results: dict[str, list[float]] = {}
    for _ in range(args.repeat):
        for batched in (False, True):
            mode = "batch" if batched else "per-record"
            cpu, buffers = produce(args.records, batched)
            results.setdefault(f"producer {mode}", []).append(cpu * 1e6 / args.records)
            cpu, n = consume(buffers, batched)
            if n != args.records:
                raise RuntimeError(f"consumer saw {n} records, expected {args.records}")
            results.setdefault(f"consumer {mode}", []).append(cpu * 1e6 / args.records)
    for name, values in results.items():
        print(f"{name:<22} {statistics.median(values):.3f} CPU us/record (median of {len(values)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
