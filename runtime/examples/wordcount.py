"""The README's word count, and the variants the benchmarks, the chaos runs and the demo use."""

from __future__ import annotations

import os

from runtime.api import (
    AsyncKeyedProcessFunction,
    DiscardSink,
    FileSink,
    GeneratorSource,
    Job,
    KafkaSink,
    KafkaSource,
    KeyedProcessFunction,
    ParquetSource,
    Sink,
)


class Count(KeyedProcessFunction):
    def open(self, ctx):
        self.count = ctx.value_state("count", default=0)

    def process(self, record, ctx):
        n = self.count.value() + 1
        self.count.update(n)
        ctx.emit((record[0], n))


class AsyncCount(AsyncKeyedProcessFunction):
    """Count with asynchronous state: records of different keys overlap their state round trips."""

    def open(self, ctx):
        self.count = ctx.value_state("count", 0)

    async def process(self, record, ctx):
        n = (await self.count.value()) + 1
        await self.count.update(n)
        ctx.emit((record[0], n))


def _keyed_count(job: Job, count: int, function: KeyedProcessFunction | AsyncKeyedProcessFunction,
                 sink: Sink) -> None:
    (job.source(GeneratorSource(count=count, keys=1000, seed=7), parallelism=2)
        .key_by(lambda r: r[0])
        .process(function, parallelism=2)
        .sink(sink, parallelism=1 if isinstance(sink, FileSink) else None))


def _bench_records() -> int:
    return int(os.environ.get("SLUICE_BENCH_RECORDS", "2000000"))


def build(job: Job) -> None:
    _keyed_count(job, 1_000_000, Count(), FileSink("out/"))


def build_bench(job: Job) -> None:
    """The throughput benchmark: keyed count into a discard sink, chained after the count."""
    _keyed_count(job, _bench_records(), Count(), DiscardSink())


def build_async(job: Job) -> None:
    """The word count with AsyncCount (README: Asynchronous state)."""
    _keyed_count(job, 1_000_000, AsyncCount(), FileSink("out/"))


def build_async_bench(job: Job) -> None:
    """The throughput benchmark with AsyncCount: keyed count into a discard sink, chained after the count."""
    _keyed_count(job, _bench_records(), AsyncCount(), DiscardSink())


def build_parquet(job: Job) -> None:
    """The word count over a Parquet input (made by `sluice data generate`), for the chaos runs and the demo.

    SLUICE_INPUT and SLUICE_OUTPUT name the directories; SLUICE_SINK_DELAY_S slows the sink so the
    pipeline is backpressured; SLUICE_PARALLELISM sets every operator's parallelism.
    """
    source = ParquetSource(os.environ["SLUICE_INPUT"], columns=["key", "seq", "event_time_ms"])
    parallelism = int(os.environ.get("SLUICE_PARALLELISM", "2"))
    delay = float(os.environ.get("SLUICE_SINK_DELAY_S", "0"))
    (job.source(source, parallelism=parallelism)
        .key_by(lambda r: r[0])
        .process(Count(), parallelism=parallelism)
        .sink(FileSink(os.environ["SLUICE_OUTPUT"], delay_per_record_s=delay), parallelism=parallelism))


def build_kafka(job: Job) -> None:
    """The word count over Kafka, for `sluice demo --kafka` (runtime/cli/kafka_demo.py): [word, seq] JSON records
    of SLUICE_KAFKA_DEMO_IN counted per word into SLUICE_KAFKA_DEMO_OUT exactly once, keyed by the word.
    SLUICE_SINK_DELAY_S and SLUICE_PARALLELISM as build_parquet's."""
    bootstrap = os.environ["SLUICE_KAFKA_DEMO_BOOTSTRAP"]
    topic_out = os.environ["SLUICE_KAFKA_DEMO_OUT"]
    parallelism = int(os.environ.get("SLUICE_PARALLELISM", "2"))
    delay = float(os.environ.get("SLUICE_SINK_DELAY_S", "0"))
    (job.source(KafkaSource(bootstrap, [os.environ["SLUICE_KAFKA_DEMO_IN"]], bounded=True), parallelism=parallelism)
        .uid("words")
        .key_by(lambda r: r[0])
        .process(Count(), parallelism=parallelism).uid("count")
        .sink(KafkaSink(bootstrap, topic_out, delivery="exactly-once", transactional_id_prefix=topic_out,
                        key=lambda r: r[0], delay_per_record_s=delay), parallelism=parallelism).uid("counts"))
