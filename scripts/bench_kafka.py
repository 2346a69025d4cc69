"""Kafka -> keyed count -> Kafka: records/s of a Sluice job with an exactly-once sink at parallelism 1 and 2,
against the same job with an at-least-once sink, against aiokafka's own consume -> count -> produce loop in
one process (plain, and transactional with a commit a second: the limit for this broker and client), and, with
--bytewax-python naming a Python that has `bytewax[kafka]`, against the same count written in Bytewax (its
Kafka input and output over confluent-kafka; at-least-once, the most its Kafka sink offers) at 1 and 2
processes.

Every run gets fresh topics (IN with 4 partitions holding --records JSON records [key, i] over 1000 keys, OUT
with 4) on a noida-db Kafka service started here on a free port (or SLUICE_KAFKA_BOOTSTRAP's broker). A Sluice
run is timed from submit to FINISHED (bounded source, so that includes the final checkpoint and its commit) on
a local cluster of 2 workers x 2 slots with checkpoints every second; each run's OUT is counted (read_committed)
and must hold exactly --records records. Figures: median and slowest of --repeat runs, runs alternating.

    .venv/bin/python scripts/bench_kafka.py --records 200000 --repeat 3 [--bytewax-python PYTHON]

A Bytewax run is timed from starting its process to its exit (its input stops at the partitions' ends), so it
includes the process's start, which a Sluice run (its cluster already up) does not.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition  # noqa: E402
from aiokafka.structs import OffsetAndMetadata  # noqa: E402

from runtime.cli.local_cluster import LocalCluster, run_job_on_cluster  # noqa: E402
from scripts.bench_throughput import logs_kept_on_failure, machine  # noqa: E402
from tests.support.kafka_broker import KafkaBroker  # noqa: E402
from tests.support.kafka_topics import create_topics  # noqa: E402

KEYS = 1000
PARTITIONS = 4

JOB = '''
import os

from runtime.api import Job, KafkaSink, KafkaSource
from runtime.examples.wordcount import Count


def build(job: Job) -> None:
    bootstrap, topic_in, topic_out = os.environ["BENCH_KAFKA"], os.environ["BENCH_IN"], os.environ["BENCH_OUT"]
    delivery, parallelism = os.environ["BENCH_DELIVERY"], int(os.environ["BENCH_P"])
    (job.source(KafkaSource(bootstrap, [topic_in], bounded=True), parallelism=parallelism)
        .key_by(lambda r: r[0])
        .process(Count())
        .sink(KafkaSink(bootstrap, topic_out, delivery=delivery, transactional_id_prefix="bench-" + topic_out,
                        key=lambda r: r[0])))
'''

BYTEWAX_FLOW = '''
import json
import os

import bytewax.operators as op
from bytewax.connectors.kafka import KafkaSinkMessage
from bytewax.connectors.kafka import operators as kop
from bytewax.dataflow import Dataflow

BOOTSTRAP, IN, OUT = os.environ["BENCH_KAFKA"], os.environ["BENCH_IN"], os.environ["BENCH_OUT"]


def count(state, _):
    n = (state or 0) + 1
    return n, n


def encode(key_n):
    return KafkaSinkMessage(key_n[0].encode(), json.dumps([key_n[0], key_n[1]]).encode())


flow = Dataflow("kafka-count")
read = kop.input("in", flow, brokers=[BOOTSTRAP], topics=[IN], tail=False,
                 add_config={"isolation.level": "read_committed"})
words = op.map("word", read.oks, lambda m: (json.loads(m.value)[0], None))
kop.output("out", op.map("encode", op.stateful_map("count", words, count), encode), brokers=[BOOTSTRAP],
           topic=OUT, add_config={"acks": "all", "enable.idempotence": "true"})
'''


async def fill(bootstrap: str, topic: str, records: int) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=20)
    await producer.start()
    try:
        futures = []
        for i in range(records):
            value = json.dumps([f"k{i * 7919 % KEYS}", i]).encode()
            futures.append(await producer.send(topic, value=value, partition=i % PARTITIONS))
            if len(futures) >= 10_000:
                await asyncio.gather(*futures)
                futures = []
        await asyncio.gather(*futures)
    finally:
        await producer.stop()


async def count(bootstrap: str, topic: str) -> int:
    """Committed records of `topic` (read_committed, to its last stable offset)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, isolation_level="read_committed", group_id=None)
    await consumer.start()
    try:
        parts = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        consumer.assign(parts)
        await consumer.seek_to_beginning(*parts)
        ends = await consumer.end_offsets(parts)
        n = 0
        deadline = time.monotonic() + 300
        while [tp for tp in parts if await consumer.position(tp) < ends[tp]]:
            if time.monotonic() > deadline:
                raise TimeoutError(f"counted {n} records of {topic}")
            for messages in (await consumer.getmany(timeout_ms=200, max_records=10_000)).values():
                n += len(messages)
        return n
    finally:
        await consumer.stop()


async def fresh_topics(broker: KafkaBroker, run: str, records: int) -> tuple[str, str]:
    topic_in, topic_out = broker.topic(f"bench-in-{run}"), broker.topic(f"bench-out-{run}")
    await create_topics(broker.bootstrap, {topic_in: PARTITIONS, topic_out: PARTITIONS})
    await fill(broker.bootstrap, topic_in, records)
    return topic_in, topic_out


# -- aiokafka alone ----------------------------------------------------------------------------------------


async def loop_in_one_process(bootstrap: str, topic_in: str, topic_out: str, records: int, *,
                              transactional: bool) -> float:
    """consume -> keyed count -> produce with aiokafka alone; transactional: a transaction a second, committing
    the consumer's offsets in it (the classic consume-transform-produce loop). Returns the seconds taken."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, isolation_level="read_committed", group_id=None,
                                enable_auto_commit=False)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, enable_idempotence=True,
                                transactional_id=f"loop-{topic_out}" if transactional else None)
    await consumer.start()
    await producer.start()
    try:
        parts = [TopicPartition(topic_in, p) for p in range(PARTITIONS)]
        consumer.assign(parts)
        await consumer.seek_to_beginning(*parts)
        counts: Counter[str] = Counter()
        seen = 0
        start = time.monotonic()
        last_commit = start
        if transactional:
            await producer.begin_transaction()
        pending = []
        while seen < records:
            for messages in (await consumer.getmany(timeout_ms=200, max_records=2000)).values():
                for m in messages:
                    key, _ = json.loads(m.value)
                    counts[key] += 1
                    out = json.dumps([key, counts[key]]).encode()
                    pending.append(await producer.send(topic_out, value=out, key=key.encode()))
                seen += len(messages)
            if transactional and time.monotonic() - last_commit >= 1.0:
                positions = {tp: OffsetAndMetadata(await consumer.position(tp), "") for tp in parts}
                await producer.send_offsets_to_transaction(positions, f"loop-{topic_out}")
                await producer.commit_transaction()
                await producer.begin_transaction()
                last_commit = time.monotonic()
                pending = []
            elif len(pending) > 20_000:
                await asyncio.gather(*pending)
                pending = []
        if transactional:
            await producer.commit_transaction()
        else:
            await asyncio.gather(*pending)
        return time.monotonic() - start
    finally:
        await producer.stop()
        await consumer.stop()


# -- Sluice ------------------------------------------------------------------------------------------------


def run_sluice(broker: KafkaBroker, module_dir: str, topic_in: str, topic_out: str, *, delivery: str,
               parallelism: int, timeout_s: float) -> float:
    os.environ.update({"BENCH_KAFKA": broker.bootstrap, "BENCH_IN": topic_in, "BENCH_OUT": topic_out,
                       "BENCH_DELIVERY": delivery, "BENCH_P": str(parallelism)})
    log_dir = tempfile.mkdtemp(prefix="sluice-bench-kafka-")
    here = os.getcwd()
    os.chdir(module_dir)  # the job module is imported from the submitter's directory
    try:
        with logs_kept_on_failure(LocalCluster(workers=2, slots=2, log_dir=log_dir), log_dir) as cluster:
            cluster.start()
            config = {"checkpoint": {"interval_s": 1.0, "mode": "unaligned"}}
            summary = asyncio.run(run_job_on_cluster(cluster, "kafkabench:build", config=config, name=None,
                                                     progress=None, timeout_s=timeout_s))
            if summary["state"] != "FINISHED":
                raise RuntimeError(f"job ended {summary['state']}: {summary.get('failure')}")
            return float(summary["elapsed_s"])
    finally:
        os.chdir(here)


def run_bytewax(python: str, module_dir: str, bootstrap: str, topic_in: str, topic_out: str, *, processes: int,
                timeout_s: float) -> float:
    """The Bytewax flow in its own process(es), timed from start to exit."""
    env = {**os.environ, "BENCH_KAFKA": bootstrap, "BENCH_IN": topic_in, "BENCH_OUT": topic_out}
    entry = ["-m", "bytewax.run", "bytewaxbench:flow"] if processes == 1 else \
        ["-m", "bytewax.testing", "bytewaxbench:flow", "-p", str(processes)]
    start = time.monotonic()
    done = subprocess.run([python, *entry], cwd=module_dir, env=env, capture_output=True, text=True,
                          timeout=timeout_s, check=False)
    elapsed = time.monotonic() - start
    if done.returncode != 0:
        raise RuntimeError(f"bytewax exited {done.returncode}: {done.stderr[-2000:]}")
    return elapsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--bytewax-python", default=None,
                        help="a Python with bytewax[kafka] installed (a venv of its own): adds the Bytewax runs")
    args = parser.parse_args(argv)
    info = machine()
    print(f"bench_kafka: {args.records:,} records x {args.repeat} runs; {info['nproc']} cpus ({info['cpu_model']}), "
          f"Python {info['python']}; revision {info['revision']}", flush=True)
    work = tempfile.mkdtemp(prefix="sluice-bench-kafka-")
    Path(work, "kafkabench.py").write_text(JOB)
    Path(work, "bytewaxbench.py").write_text(BYTEWAX_FLOW)
    broker = KafkaBroker(Path(work) / "broker")
    kinds = [("sluice exactly-once p=1", "exactly-once", 1), ("sluice exactly-once p=2", "exactly-once", 2),
             ("sluice at-least-once p=1", "at-least-once", 1), ("sluice at-least-once p=2", "at-least-once", 2),
             ("aiokafka loop, plain", None, 0), ("aiokafka loop, transactional", None, 1)]
    if args.bytewax_python:
        kinds += [("bytewax at-least-once p=1", "bytewax", 1), ("bytewax at-least-once p=2", "bytewax", 2)]
    times: dict[str, list[float]] = {name: [] for name, _, _ in kinds}
    try:
        for r in range(args.repeat):
            for index, (name, delivery, parallelism) in enumerate(kinds):
                topic_in, topic_out = asyncio.run(fresh_topics(broker, f"{r}-{index}", args.records))
                if delivery == "bytewax":
                    elapsed = run_bytewax(args.bytewax_python, work, broker.bootstrap, topic_in, topic_out,
                                          processes=parallelism, timeout_s=args.timeout)
                elif delivery is None:
                    elapsed = asyncio.run(loop_in_one_process(broker.bootstrap, topic_in, topic_out, args.records,
                                                              transactional=bool(parallelism)))
                else:
                    elapsed = run_sluice(broker, work, topic_in, topic_out, delivery=delivery,
                                         parallelism=parallelism, timeout_s=args.timeout)
                produced = asyncio.run(count(broker.bootstrap, topic_out))
                if produced != args.records:
                    raise RuntimeError(f"{name}: {produced} records in {topic_out}, expected {args.records}")
                times[name].append(elapsed)
                print(f"  run {r + 1} {name:<30} {elapsed:7.2f}s  {args.records / elapsed:>9,.0f} records/s",
                      flush=True)
    finally:
        broker.stop()
    print(f"\n{'':<30} {'median rec/s':>12} {'slowest rec/s':>13} {'vs at-least-once':>16}")
    medians = {name: args.records / statistics.median(ts) for name, ts in times.items()}
    for name, ts in times.items():
        ratio = ""
        if name.startswith("sluice exactly-once"):
            ratio = f"{medians[name] / medians[name.replace('exactly-once', 'at-least-once')]:.2f}x"
        print(f"{name:<30} {medians[name]:>12,.0f} {args.records / max(ts):>13,.0f} {ratio:>16}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
