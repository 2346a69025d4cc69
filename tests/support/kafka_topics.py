"""Topics for the Kafka tests (needs aiokafka: import this after `pytest.importorskip("aiokafka")`): creating
them, producing input, reading a topic back (read_committed) and reading a source the way a task does."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewPartitions, NewTopic

from tests.support.source_reading import read_source, run

__all__ = ["add_partitions", "create_topics", "end_offsets", "group_offsets", "produce", "read_source", "read_topic",
           "run"]


async def create_topics(bootstrap: str, topics: dict[str, int]) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(name, partitions, 1) for name, partitions in topics.items()])
    finally:
        await admin.close()


async def add_partitions(bootstrap: str, topic: str, total: int) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_partitions({topic: NewPartitions(total)})
    finally:
        await admin.close()


async def produce(bootstrap: str, topic: str, records: list[Any], *, partitions: int,
                  raw: list[bytes] | None = None) -> None:
    """Record i (JSON) goes to partition i mod `partitions`; `raw` payloads instead, the same way."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    await producer.start()
    try:
        payloads = raw if raw is not None else [json.dumps(r).encode() for r in records]
        futures = [await producer.send(topic, value=v, partition=i % partitions) for i, v in enumerate(payloads)]
        await asyncio.gather(*futures)
    finally:
        await producer.stop()


async def read_topic(bootstrap: str, topic: str, *, isolation_level: str = "read_committed",
                     quiet_s: float = 1.0, timeout_s: float = 60.0, keys: bool = False,
                     headers: bool = False) -> list[Any]:
    """Every record of `topic` up to its end as (partition, offset, JSON value), in partition order; `keys`:
    as (key bytes, JSON value or None for a tombstone) instead; `headers`: as (headers, JSON value)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, isolation_level=isolation_level, group_id=None,
                                enable_auto_commit=False)
    await consumer.start()
    try:
        parts = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or
                                                          await _partitions(consumer, topic))]
        consumer.assign(parts)
        await consumer.seek_to_beginning(*parts)
        ends = await consumer.end_offsets(parts)
        out: list[tuple[int, int, Any, Any]] = []
        deadline = time.monotonic() + timeout_s
        while [tp for tp in parts if await consumer.position(tp) < ends[tp]]:
            assert time.monotonic() < deadline, f"read {len(out)} records of {topic} in {timeout_s}s"
            for tp, messages in (await consumer.getmany(timeout_ms=200)).items():
                out += [(tp.partition, m.offset, tuple(m.headers or ()) if headers else m.key,
                         None if m.value is None else json.loads(m.value))
                        for m in messages]
        out.sort(key=lambda r: (r[0], r[1]))
        return [(k, v) for _, _, k, v in out] if keys or headers else [(p, o, v) for p, o, _, v in out]
    finally:
        await consumer.stop()


async def end_offsets(bootstrap: str, topic: str, *, isolation_level: str = "read_committed") -> dict[int, int]:
    """The broker's end of every partition of `topic` as a read_committed consumer sees it (the last stable
    offset: what a source's lag is measured against), or a read_uncommitted one (the high watermark: beyond
    the last stable offset while a transaction is open)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, isolation_level=isolation_level, group_id=None,
                                enable_auto_commit=False)
    await consumer.start()
    try:
        parts = [TopicPartition(topic, p) for p in sorted(await _partitions(consumer, topic))]
        return {tp.partition: offset for tp, offset in (await consumer.end_offsets(parts)).items()}
    finally:
        await consumer.stop()


async def _partitions(consumer: AIOKafkaConsumer, topic: str) -> set[int]:
    cluster = await consumer._client.fetch_all_metadata()
    return set(cluster.partitions_for_topic(topic) or ())


async def group_offsets(bootstrap: str, group: str) -> dict[tuple[str, int], int]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        offsets = await admin.list_consumer_group_offsets(group)
        return {(tp.topic, tp.partition): meta.offset for tp, meta in offsets.items()}
    finally:
        await admin.close()
