"""The expected rows of the join queries of `sluice data verify`, from the job's two Parquet inputs.

- interval-join (--right-input R --lower-ms LO --upper-ms HI [--max-delay-ms D]): a left record l and a right
  record r of the same key join when l.event_time + LO <= r.event_time <= l.event_time + HI
  (runtime/api/interval_join.py); one row [key, l.seq, r.seq] per pair.
- window-join (--right-input R --window-ms W [--slide-ms S] [--max-delay-ms D]): one row [key, l.seq, r.seq]
  per pair of the same key and per tumbling (or sliding) event-time window holding both (runtime/api/joins.py);
  with sliding windows a pair is in several windows, so it has several rows.

The job writes those rows as `fn(left, right) -> (left[0], left[1], right[1])` over the (key, seq,
event_time_ms) records of `sluice data generate`. Which records a join drops as late depends on how the two
inputs interleave at the operator, which no batch computation knows; so these queries need inputs where no
record is behind its own source's watermark (event time > max event time read before it - D - 1), which
`generate --jitter-ms J` gives for J <= D. Then no record is late at the join either, whatever the
interleaving: the operator's watermark is at most each input's. Other inputs are refused with the first such
record named. Outer joins are not covered (their rows hold nulls).
"""

from __future__ import annotations

from typing import Any

from runtime.data.spark import DataError
from runtime.data.verify_input import EventTimeOptions, read_in_source_order, records_behind, with_watermark

JOIN_QUERIES = ("interval-join", "window-join")


def join_expected(spark: Any, query: str, left_input: str, right_input: str, o: EventTimeOptions) -> Any:
    """(key, v0 = left seq, v1 = right seq): the rows the join job must have committed."""
    sides = []
    for flag, path in (("--input", left_input), ("--right-input", right_input)):
        records = with_watermark(read_in_source_order(spark, path), o.max_delay_ms)
        _refuse_records_behind(records, query, flag, o.max_delay_ms)
        sides.append(records)
    left, right = sides
    if query == "interval-join":
        return interval_join_expected(left, right, o)
    return window_join_expected(left, right, o)


def interval_join_expected(left: Any, right: Any, o: EventTimeOptions) -> Any:
    from pyspark.sql import functions as F

    assert o.lower_ms is not None and o.upper_ms is not None
    lt, rt = F.col("l.event_time_ms"), F.col("r.event_time_ms")
    on = (F.col("l.key") == F.col("r.key")) & (rt >= lt + o.lower_ms) & (rt <= lt + o.upper_ms)
    return (left.alias("l").join(right.alias("r"), on)
            .select(F.col("l.key").alias("key"), F.col("l.seq").alias("v0"), F.col("r.seq").alias("v1")))


def window_join_expected(left: Any, right: Any, o: EventTimeOptions) -> Any:
    from pyspark.sql import functions as F

    assert o.window_ms is not None
    size, slide = o.window_ms, o.slide_ms or o.window_ms

    def windows(records: Any) -> Any:
        # the windows holding ts start at the multiples of slide in (ts - size, ts] (as window-count)
        ts = F.col("event_time_ms")
        last_start = ts - F.pmod(ts, F.lit(slide))
        first_start = (ts - size) - F.pmod(ts - size, F.lit(slide)) + slide
        return records.select("key", "seq", F.explode(F.sequence(first_start, last_start, F.lit(slide).cast("long")))
                              .alias("start"))

    on = (F.col("l.key") == F.col("r.key")) & (F.col("l.start") == F.col("r.start"))
    return (windows(left).alias("l").join(windows(right).alias("r"), on)
            .select(F.col("l.key").alias("key"), F.col("l.seq").alias("v0"), F.col("r.seq").alias("v1")))


def _refuse_records_behind(records: Any, query: str, flag: str, max_delay_ms: int) -> None:
    count, first = records_behind(records)
    if count:
        raise DataError(
            f"{query} needs inputs where no record is behind its source's watermark (event time <= max event "
            f"time read before it - max delay - 1): in {flag}, {count:,} records are, the first seq {first['seq']} "
            f"(event time {first['event_time_ms']}, watermark {first['wm']}; --max-delay-ms {max_delay_ms}). "
            f"Use --jitter-ms at most --max-delay-ms when generating the inputs.")
