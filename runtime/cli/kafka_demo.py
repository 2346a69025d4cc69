"""`sluice demo --kafka HOST:PORT`: the demo's story over Kafka instead of Parquet and files.

The input is a topic of 4 partitions holding JSON records [key, seq] over 1,000 keys (written here); the job
(runtime/examples/wordcount.py:build_kafka) reads it with KafkaSource, counts per key and writes [key, n] with
KafkaSink exactly once; a worker that hosts a sink is killed with SIGKILL midway (runtime/cli/demo.py). The
verdict reads the output topic back as a read_committed consumer does: every key's counts 1..n, each once,
nothing else. Topic names carry a run id, so runs never see each other's records.

`verify_counts` is the verdict without I/O (unit-tested with exact answers); the rest is the aiokafka calls.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from runtime.connectors.kafka_client import aiokafka, connect_checked

KEYS = 1000
PARTITIONS = 4
OUTPUT_PARTITIONS = 2


@dataclass(frozen=True)
class KafkaDemoTopics:
    bootstrap: str
    topic_in: str
    topic_out: str
    expected: dict[str, int]  # key -> records of that key in the input


def input_records(records: int, seed: int = 7) -> list[list[Any]]:
    rng = random.Random(seed)
    return [[f"w{rng.randrange(KEYS):03d}", i] for i in range(records)]


@dataclass(frozen=True)
class Verdict:
    ok: bool
    expected_rows: int
    got_rows: int
    wrong_keys: dict[str, dict[str, Any]]  # key -> what is wrong with its counts (at most 10 listed)

    def summary(self) -> str:
        if self.ok:
            return f"{self.got_rows:,} committed records, every key's counts 1..n exactly once"
        sample = dict(list(self.wrong_keys.items())[:3])
        return (f"{self.got_rows:,} committed records where {self.expected_rows:,} were expected; "
                f"{len(self.wrong_keys)} keys wrong, e.g. {sample}")


def verify_counts(expected: dict[str, int], outputs: Iterable[tuple[str, int]]) -> Verdict:
    """The output of a keyed count is exact iff every input key's outputs are its counts 1..n, each once, and
    there is no other key: a lost record shows as a missing count, a repeated one as a duplicate."""
    counts: dict[str, list[int]] = defaultdict(list)
    got_rows = 0
    for key, n in outputs:
        counts[key].append(n)
        got_rows += 1
    wrong: dict[str, dict[str, Any]] = {}
    for key in sorted(set(expected) | set(counts)):
        n = expected.get(key, 0)
        seen = Counter(counts.get(key, ()))
        if sorted(counts.get(key, ())) != list(range(1, n + 1)):
            wrong[key] = {"expected": n, "got": sum(seen.values()),
                          "missing": sorted(set(range(1, n + 1)) - set(seen))[:10],
                          "duplicated": sorted(c for c, m in seen.items() if m > 1)[:10],
                          "unexpected": sorted(c for c in seen if not 1 <= c <= n)[:10]}
    expected_rows = sum(expected.values())
    return Verdict(not wrong and got_rows == expected_rows, expected_rows, got_rows, wrong)


async def _admin(bootstrap: str, timeout_s: float) -> Any:
    kafka = aiokafka()
    admin = kafka.admin.AIOKafkaAdminClient(bootstrap_servers=bootstrap, client_id="sluice-demo")
    await connect_checked(admin.start(), bootstrap, timeout_s)
    return admin


async def prepare(bootstrap: str, records: int, *, timeout_s: float = 10.0) -> KafkaDemoTopics:
    """Create this run's topics and write the input: record i to partition i mod 4."""
    kafka = aiokafka()
    run_id = uuid.uuid4().hex[:8]
    topic_in, topic_out = f"sluice-demo-in-{run_id}", f"sluice-demo-out-{run_id}"
    admin = await _admin(bootstrap, timeout_s)
    try:
        await admin.create_topics([kafka.admin.NewTopic(topic_in, PARTITIONS, 1),
                                   kafka.admin.NewTopic(topic_out, OUTPUT_PARTITIONS, 1)])
    finally:
        await admin.close()
    rows = input_records(records)
    producer = kafka.AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, acks="all")
    await connect_checked(producer.start(), bootstrap, timeout_s)
    try:
        sends = [await producer.send(topic_in, value=json.dumps(r).encode(), partition=i % PARTITIONS)
                 for i, r in enumerate(rows)]
        await asyncio.gather(*sends)
    finally:
        await producer.stop()
    return KafkaDemoTopics(bootstrap, topic_in, topic_out, dict(Counter(k for k, _ in rows)))


async def read_output(topics: KafkaDemoTopics, *, timeout_s: float = 120.0) -> list[tuple[str, int]]:
    """Every committed record of the output topic, up to its end, as (key, count)."""
    kafka = aiokafka()
    consumer = kafka.AIOKafkaConsumer(bootstrap_servers=topics.bootstrap, isolation_level="read_committed",
                                      group_id=None, enable_auto_commit=False)
    await connect_checked(consumer.start(), topics.bootstrap, 10.0)
    try:
        parts = [kafka.TopicPartition(topics.topic_out, p) for p in range(OUTPUT_PARTITIONS)]
        consumer.assign(parts)
        await consumer.seek_to_beginning(*parts)
        ends = await consumer.end_offsets(parts)
        out: list[tuple[str, int]] = []
        deadline = time.monotonic() + timeout_s
        while [tp for tp in parts if await consumer.position(tp) < ends[tp]]:
            if time.monotonic() > deadline:
                raise TimeoutError(f"read {len(out)} records of {topics.topic_out} in {timeout_s:g}s")
            for messages in (await consumer.getmany(timeout_ms=200)).values():
                out += [tuple(json.loads(m.value)) for m in messages]  # type: ignore[misc]
        return out
    finally:
        await consumer.stop()

