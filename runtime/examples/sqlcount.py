"""A windowed count and sum in SQL and the same job written by hand on the DataStream API, over one generated
stream: the pair scripts/bench_sql.py times against each other (and an example of `job.from_stream` and
`job.sql`)."""

from __future__ import annotations

import os
from typing import Any

from runtime.api import (
    AggregateFunction,
    BoundedOutOfOrderness,
    DataStream,
    DiscardSink,
    GeneratorSource,
    Job,
    TumblingEventTimeWindows,
)


def _event_time(record: tuple) -> int:
    return int(record[2])


def _stream(job: Job) -> DataStream:
    records = int(os.environ.get("SLUICE_BENCH_RECORDS", "2000000"))
    watermarks = BoundedOutOfOrderness(max_delay_ms=0, timestamp=_event_time, granularity_ms=10)
    return job.source(GeneratorSource(count=records, keys=1000, seed=7), parallelism=2, watermarks=watermarks,
                      name="generator")


class CountSum(AggregateFunction[Any, Any, Any]):
    """COUNT(*) and SUM(seq) of a window, by hand."""

    def create_accumulator(self) -> Any:
        return (0, 0)

    def add(self, value: Any, accumulator: Any) -> Any:
        return (accumulator[0] + 1, accumulator[1] + value[1])

    def get_result(self, accumulator: Any) -> Any:
        return accumulator

    def merge(self, a: Any, b: Any) -> Any:
        return (a[0] + b[0], a[1] + b[1])


def build_bench_datastream(job: Job) -> None:
    """key_by -> 10 s tumbling window -> CountSum -> rows (key, start, end, count, sum) -> discard."""
    (_stream(job).key_by(lambda r: r[0]).window(TumblingEventTimeWindows(10_000))
     .aggregate(CountSum(), parallelism=2)
     .map(lambda e: (e[0], e[1], e[2], e[3][0], e[3][1]))
     .sink(DiscardSink()))


def build_bench_sql(job: Job) -> None:
    """The same query in SQL over the same stream."""
    # NOT NULL as the generator's fields are (the hand-written job assumes it as well)
    job.from_stream("gen", _stream(job), "word STRING NOT NULL, seq BIGINT NOT NULL, ts TIMESTAMP(3) NOT NULL",
                    rowtime="ts")
    job.sql("""
        SET 'parallelism.default' = '2';
        CREATE TABLE counts (word STRING, window_start TIMESTAMP(3), window_end TIMESTAMP(3), n BIGINT, total BIGINT)
          WITH ('connector' = 'blackhole');
        INSERT INTO counts
        SELECT word, window_start, window_end, COUNT(*), SUM(seq)
        FROM TABLE(TUMBLE(TABLE gen, DESCRIPTOR(ts), INTERVAL '10' SECOND))
        GROUP BY word, window_start, window_end;
    """)
