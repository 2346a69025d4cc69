"""Windowed counts over event time: the jobs the window benchmark and the windowed chaos run use.

Rows out: `[key, window_start_ms, window_end_ms, count]`; late records (side output): the input record
`[key, seq, event_time_ms]`. `sluice data verify --query window-count` recomputes both with Spark.
"""

from __future__ import annotations

import os

from runtime.api import (
    LATE_DATA,
    BoundedOutOfOrderness,
    DiscardSink,
    EventTimeSessionWindows,
    FileSink,
    GeneratorSource,
    Job,
    ParquetSource,
    SlidingEventTimeWindows,
    TumblingEventTimeWindows,
)
from runtime.examples.wordcount import Count

SESSION_GAP_MS = 1000
"""The session job's gap: with keys in bursts (runtime/connectors/generator.py) a key's records are 100 ms apart
in its burst and 9 s apart between bursts, so every key's session closes once per ten bursts."""


def _event_time(record: tuple) -> int:
    return int(record[2])


def _bench_stream(job: Job):
    records = int(os.environ.get("SLUICE_BENCH_RECORDS", "2000000"))
    jitter = int(os.environ.get("SLUICE_BENCH_JITTER_MS", "0"))
    grain = int(os.environ.get("SLUICE_BENCH_GRAIN_MS", "10"))  # event time between two watermarks
    interval = os.environ.get("SLUICE_BENCH_WATERMARK_INTERVAL_MS")  # periodic watermarks (bench_windows --grain-ms pN)
    keys = os.environ.get("SLUICE_BENCH_KEYS", "uniform")  # or bursts (bench_windows --keys): a function of seq
    watermarks = BoundedOutOfOrderness(max_delay_ms=jitter, timestamp=_event_time, granularity_ms=grain,
                                       emit_interval_ms=int(interval) if interval else None)
    source = GeneratorSource(count=records, keys=1000, seed=7, jitter_ms=jitter, distribution=keys)
    return job.source(source, parallelism=2, watermarks=watermarks).key_by(lambda r: r[0])


def build_bench_keyed(job: Job) -> None:
    """The keyed count of wordcount.py on an event-time job (no windows): the baseline the windows are measured
    against."""
    _bench_stream(job).process(Count(), parallelism=2).sink(DiscardSink())


def build_bench_tumbling(job: Job) -> None:
    """Tumbling 10 s event-time count windows (the generator's event time advances 1 ms per record: with 1000
    keys, about ten records per window)."""
    _bench_stream(job).window(TumblingEventTimeWindows(10_000)).count(parallelism=2).sink(DiscardSink())


def build_bench_sliding(job: Job) -> None:
    """Sliding 60 s / 10 s event-time count windows: every record lands in six windows."""
    _bench_stream(job).window(SlidingEventTimeWindows(60_000, 10_000)).count(parallelism=2).sink(DiscardSink())


def build_bench_session(job: Job) -> None:
    """Event-time session count windows with a gap of SESSION_GAP_MS (meant for keys in bursts: with uniform
    keys a key's records are about 1 s apart, and a third of them start a session of their own)."""
    (_bench_stream(job).window(EventTimeSessionWindows(SESSION_GAP_MS)).count(parallelism=2)
     .sink(DiscardSink()))


def build_parquet(job: Job) -> None:
    """Tumbling event-time count over a Parquet input (`sluice data generate --jitter-ms`), for the chaos run.

    One source subtask, so that which records are late is a function of the input alone (what
    `sluice data verify --query window-count` assumes). Environment: SLUICE_INPUT, SLUICE_OUTPUT,
    SLUICE_LATE_OUTPUT, SLUICE_WINDOW_MS, SLUICE_MAX_DELAY_MS, SLUICE_ALLOWED_LATENESS_MS, SLUICE_PARALLELISM
    (of the window operator and the sink), SLUICE_SINK_DELAY_S.
    """
    source = ParquetSource(os.environ["SLUICE_INPUT"], columns=["key", "seq", "event_time_ms"])
    parallelism = int(os.environ.get("SLUICE_PARALLELISM", "2"))
    delay = float(os.environ.get("SLUICE_SINK_DELAY_S", "0"))
    watermarks = BoundedOutOfOrderness(max_delay_ms=int(os.environ.get("SLUICE_MAX_DELAY_MS", "0")),
                                       timestamp=_event_time)
    counts = (job.source(source, parallelism=1, watermarks=watermarks)
              .key_by(lambda r: r[0])
              .window(TumblingEventTimeWindows(int(os.environ["SLUICE_WINDOW_MS"])),
                      allowed_lateness_ms=int(os.environ.get("SLUICE_ALLOWED_LATENESS_MS", "0")))
              .count(parallelism=parallelism))
    counts.sink(FileSink(os.environ["SLUICE_OUTPUT"], delay_per_record_s=delay), parallelism=parallelism)
    counts.side_output(LATE_DATA).sink(FileSink(os.environ["SLUICE_LATE_OUTPUT"]), parallelism=1, name="late-sink")
