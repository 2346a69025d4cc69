"""What `sluice data verify` knows of the job before it reads any output: the query's event-time options, and
the job's input read in the order its source reads it, with the watermark each record meets.

runtime/data/verify.py (the counts) and runtime/data/verify_joins.py (the joins) both compute their expected
results from these; neither imports the other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from runtime.connectors.files import list_input_files


@dataclass(frozen=True)
class EventTimeOptions:
    """The windowed queries' parameters, as the job was configured (milliseconds)."""

    window_ms: int | None = None
    slide_ms: int | None = None  # None: tumbling windows
    max_delay_ms: int = 0
    allowed_lateness_ms: int = 0
    gap_ms: int | None = None
    late_output: str | None = None  # the late-records side output's FileSink directory, if it is to be checked
    right_input: str | None = None  # the joins: the second input (--input is the left one)
    lower_ms: int | None = None  # interval-join: the bounds, inclusive
    upper_ms: int | None = None

    def describe(self, query: str) -> str:
        """The parameters that shape `query`'s result, for the summary line ('' for wordcount)."""
        if query == "window-count":
            shape = f"window {self.window_ms} ms" + (f", slide {self.slide_ms} ms" if self.slide_ms else "")
            return f" ({shape}, max delay {self.max_delay_ms} ms, lateness {self.allowed_lateness_ms} ms)"
        if query == "session-count":
            return f" (gap {self.gap_ms} ms, max delay {self.max_delay_ms} ms)"
        if query == "interval-join":
            return f" (bounds [{self.lower_ms}, {self.upper_ms}] ms, max delay {self.max_delay_ms} ms)"
        if query == "window-join":
            shape = f"window {self.window_ms} ms" + (f", slide {self.slide_ms} ms" if self.slide_ms else "")
            return f" ({shape}, max delay {self.max_delay_ms} ms)"
        return ""



def read_in_source_order(spark: Any, input: str) -> Any:
    """(key, seq, event_time_ms, file_index, row_index): the input with the position at which ParquetSource at
    parallelism 1 reads each row, (file_index, row_index) ascending: files sorted by path as list_input_files
    sorts them, rows in file order (row groups are read in order)."""
    from functools import reduce

    from pyspark.sql import functions as F

    files = list_input_files(input, (".parquet",))
    frames = [spark.read.parquet(path).select("key", "seq", "event_time_ms", F.lit(i).alias("file_index"),
                                              F.col("_metadata.row_index").alias("row_index"))
              for i, path in enumerate(files)]
    return reduce(lambda a, b: a.unionByName(b), frames)


def with_watermark(records: Any, max_delay_ms: int) -> Any:
    """Adds `wm`: the watermark in force when each record arrives, max(event time of the records read before
    it) - max_delay_ms - 1; null for the first record (no watermark yet)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    # One ordered pass over the whole input: a window without partitions (Spark moves it to one partition;
    # a running max over 1e6 rows takes a second or two).
    before = Window.orderBy("file_index", "row_index").rowsBetween(Window.unboundedPreceding, -1)
    return records.withColumn("wm", F.max("event_time_ms").over(before) - F.lit(max_delay_ms + 1))



def records_behind(records: Any) -> tuple[int, Any]:
    """How many records (that carry their watermark `wm`) arrive behind it, and the first of them in read order."""
    from pyspark.sql import functions as F

    behind = records.filter(F.col("wm").isNotNull() & (F.col("event_time_ms") <= F.col("wm")))
    count = behind.count()
    return count, behind.orderBy("file_index", "row_index").first() if count else None

