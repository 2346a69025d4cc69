"""`sluice data generate`: a deterministic input data set as Parquet, written by Spark.

Rows are (key: string, seq: long, event_time_ms: long). seq runs over
0..rows-1 exactly once; event_time_ms = 1_700_000_000_000 + seq - d, like the
runtime's GeneratorSource, where d = 0 unless `--jitter-ms J` asks for
out-of-order event times: then d = pmod(xxhash64(seed, seq, JITTER_SALT),
J + 1), an integer in [0, J] (J = 0 leaves every row as it was). Rows stay
in seq order in the files, so a source reading them in order sees event
times up to J ms out of order. The key of a row is a pure function of
(seed, seq): h = xxhash64(seed, seq), then

- uniform: key index pmod(h, keys);
- zipf: an inverse-CDF draw. u = the top 53 bits of h / 2**53 is uniform in
  [0, 1); the key is the i whose interval [cum[i-1], cum[i]) of the
  normalised cumulative Zipf weights holds u.

So the data set depends only on (rows, keys, skew, exponent, seed), not on
the number of partitions or the Spark master. It is a different data set
from GeneratorSource's for the same seed (that one draws with Python's
random module); key names and event times follow the same conventions.

Everything runs as Spark SQL expressions (no Python UDF): the zipf lookup is
a broadcast join against a small table of key intervals, cut at a grid of
bucket boundaries so that the join is an equi-join on the bucket of u plus a
range check among the few intervals in that bucket.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from typing import Any

from runtime.connectors.files import list_input_files
from runtime.connectors.generator import EVENT_TIME_START_MS, zipf_cum_weights
from runtime.data.spark import DataError

SKEWS = ("uniform", "zipf")
DEFAULT_PARTITIONS = 4
GROUPS_PER_FILE = 8  # aim for this many row groups per file: the units ParquetSource splits across subtasks
MIN_ROW_GROUP_ROWS = 1_000
MAX_ROW_GROUP_ROWS = 1_000_000
_U_BITS = 53  # a double holds 53 bits exactly, so u = (h >>> 11) / 2**53 is exact and < 1
JITTER_SALT = 0x6A177E4  # a third hash input, so the jitter of a row is independent of its key


@dataclass
class GenerateResult:
    path: str
    rows: int
    keys: int
    skew: str
    zipf_exponent: float
    seed: int
    jitter_ms: int
    files: int
    row_groups: int
    seconds: float

    def summary(self) -> str:
        skew = f"zipf {self.zipf_exponent:g}" if self.skew == "zipf" else "uniform"
        jitter = f", jitter {self.jitter_ms:,} ms" if self.jitter_ms else ""
        return (f"generated {self.rows:,} rows, {self.keys:,} keys ({skew}, seed {self.seed}{jitter}) "
                f"in {self.files} files "
                f"/ {self.row_groups} row groups at {self.path} in {self.seconds:.1f} s")


def check_generate_args(out: str, *, rows: int, keys: int, skew: str, zipf_exponent: float, partitions: int,
                        row_group_rows: int | None, seed: int = 0, jitter_ms: int = 0) -> None:
    """Raise DataError for arguments `generate` cannot honour; runs before Spark starts."""
    if rows < 1:
        raise DataError(f"--rows must be at least 1, got {rows}")
    if keys < 1:
        raise DataError(f"--keys must be at least 1, got {keys}")
    if skew not in SKEWS:
        raise DataError(f"--skew must be one of {', '.join(SKEWS)}, not {skew!r}")
    if not (math.isfinite(zipf_exponent) and zipf_exponent >= 0):
        raise DataError(f"--zipf-exponent must be a finite number >= 0, got {zipf_exponent}")
    if partitions < 1:
        raise DataError(f"--partitions must be at least 1, got {partitions}")
    if row_group_rows is not None and row_group_rows < 1:
        raise DataError(f"--row-group-rows must be at least 1, got {row_group_rows}")
    if not -(2**63) <= seed < 2**63:
        raise DataError(f"--seed must fit in 64 bits, got {seed}")
    if not 0 <= jitter_ms < 2**62:
        raise DataError(f"--jitter-ms must be between 0 and 2**62, got {jitter_ms}")
    check_overwritable(out)


def check_overwritable(out: str) -> None:
    """Refuse to let Spark's overwrite delete a directory that is not a previous Parquet output.

    `generate` replaces OUT wholesale; a slip such as `generate .` must not wipe a working directory.
    """
    if not os.path.exists(out):
        return
    if not os.path.isdir(out):
        raise DataError(f"{out} exists and is not a directory")
    for name in sorted(os.listdir(out)):
        spark_file = name.startswith(("_", ".")) or (name.startswith("part-") and name.endswith(".parquet"))
        if not spark_file or os.path.isdir(os.path.join(out, name)):
            raise DataError(f"refusing to overwrite {out}: it holds {name!r}, which a Parquet data set written by "
                            f"Spark would not; remove it or pick another directory")


def default_row_group_rows(rows: int, partitions: int) -> int:
    per_file = -(-rows // partitions)
    return max(MIN_ROW_GROUP_ROWS, min(MAX_ROW_GROUP_ROWS, -(-per_file // GROUPS_PER_FILE)))


def zipf_buckets(keys: int) -> int:
    """Grid size for the zipf lookup: a power of two (so u * buckets is exact) at least 2 * keys, so a bucket
    holds about one interval boundary on average (min 4096)."""
    return max(4096, 1 << (2 * keys - 1).bit_length())


def zipf_intervals(keys: int, exponent: float) -> list[tuple[int, float, float]]:
    """(key index, lo, hi): key i is drawn for u in [lo, hi); the intervals tile [0, 1) in key order."""
    cum = zipf_cum_weights(keys, exponent)
    total = cum[-1]
    his = [c / total for c in cum[:-1]] + [1.0]  # the last interval ends exactly at 1: every u < 1 finds a key
    los = [0.0] + his[:-1]  # lo of one key is hi of the previous one, bit for bit, so there are no gaps
    return list(zip(range(keys), los, his, strict=True))


def _zipf_lookup(spark: Any, keys: int, exponent: float, buckets: int) -> Any:
    """The broadcast side of the zipf draw: (bucket, key_index, lo, hi) for every bucket an interval touches."""
    from functools import reduce

    from pyspark.sql import functions as F

    intervals = zipf_intervals(keys, exponent)
    # Local data travels inside tasks; in chunks, no task gets big enough for Spark to warn (1 MB) even for
    # 100k keys. createDataFrame from a list needs no Python workers, so this works on any master.
    chunk = 20_000
    parts = [spark.createDataFrame(intervals[i : i + chunk], "key_index long, lo double, hi double")
             for i in range(0, len(intervals), chunk)]
    table = reduce(lambda a, b: a.unionAll(b), parts)
    # floor(x * buckets) is exact for a power of two, and monotone: the bucket of any u in [lo, hi) is between
    # those of lo and hi.
    last = F.lit(buckets - 1)
    first_bucket = F.least(F.floor(F.col("lo") * buckets), last)
    last_bucket = F.least(F.floor(F.col("hi") * buckets), last)
    return table.withColumn("bucket", F.explode(F.sequence(first_bucket, last_bucket)))


def dataset(spark: Any, *, rows: int, keys: int, skew: str = "uniform", zipf_exponent: float = 1.1,
            partitions: int = DEFAULT_PARTITIONS, seed: int = 0, jitter_ms: int = 0) -> Any:
    """The data set as a DataFrame of (key, seq, event_time_ms), one partition per output file, sorted by seq."""
    from pyspark.sql import functions as F

    # spark.range cuts 0..rows-1 into `partitions` contiguous ranges, already in order: each becomes one file
    # holding a run of seq, with no shuffle.
    df = spark.range(0, rows, 1, numPartitions=partitions).withColumnRenamed("id", "seq")
    h = F.xxhash64(F.lit(seed).cast("long"), F.col("seq"))
    if skew == "uniform":
        df = df.withColumn("key_index", F.pmod(h, F.lit(keys)))
    else:
        buckets = zipf_buckets(keys)
        lookup = _zipf_lookup(spark, keys, zipf_exponent, buckets)
        u = F.shiftrightunsigned(h, 64 - _U_BITS).cast("double") / float(1 << _U_BITS)
        df = df.withColumn("u", u).withColumn("bucket", F.floor(F.col("u") * buckets))
        # Broadcast: the stream side keeps its partitions and order, so files stay runs of seq.
        cond = (df["bucket"] == lookup["bucket"]) & (df["u"] >= lookup["lo"]) & (df["u"] < lookup["hi"])
        df = df.join(F.broadcast(lookup), cond, "inner").select(df["seq"], lookup["key_index"])
    width = len(str(keys - 1))
    key = F.concat(F.lit("k"), F.lpad(F.col("key_index").cast("string"), width, "0"))
    event_time = F.lit(EVENT_TIME_START_MS) + F.col("seq")
    if jitter_ms:
        behind = F.pmod(F.xxhash64(F.lit(seed).cast("long"), F.col("seq"), F.lit(JITTER_SALT).cast("long")),
                        F.lit(jitter_ms + 1).cast("long"))
        event_time = event_time - behind
    return df.select(key.alias("key"), F.col("seq"), event_time.alias("event_time_ms")).sortWithinPartitions("seq")


def generate(spark: Any, out: str, *, rows: int, keys: int, skew: str = "uniform", zipf_exponent: float = 1.1,
             partitions: int = DEFAULT_PARTITIONS, seed: int = 0, row_group_rows: int | None = None,
             jitter_ms: int = 0) -> GenerateResult:
    """Write the data set to `out` (replaced) as `partitions` Parquet files; return what was written."""
    check_generate_args(out, rows=rows, keys=keys, skew=skew, zipf_exponent=zipf_exponent, partitions=partitions,
                        row_group_rows=row_group_rows, seed=seed, jitter_ms=jitter_ms)
    started = time.monotonic()
    out = os.path.abspath(out)
    group_rows = row_group_rows or default_row_group_rows(rows, partitions)
    df = dataset(spark, rows=rows, keys=keys, skew=skew, zipf_exponent=zipf_exponent, partitions=partitions,
                 seed=seed, jitter_ms=jitter_ms)
    # parquet.block.row.count.limit (parquet-java >= 1.14) cuts row groups by rows; the default cut is by bytes
    # (128 MB), which would leave one row group, one unit of work for ParquetSource, per file.
    (df.write.mode("overwrite")
        .option("parquet.block.row.count.limit", str(group_rows))
        .parquet(out))
    files, groups, written = _parquet_layout(out)
    if written != rows:
        raise RuntimeError(f"wrote {written:,} rows to {out}, expected {rows:,}")
    return GenerateResult(path=out, rows=rows, keys=keys, skew=skew, zipf_exponent=zipf_exponent, seed=seed,
                          jitter_ms=jitter_ms, files=files, row_groups=groups, seconds=time.monotonic() - started)


def _parquet_layout(path: str) -> tuple[int, int, int]:
    """(files, row groups, rows) of the Parquet files a ParquetSource would read under `path`."""
    import pyarrow.parquet as pq

    files = list_input_files(path, (".parquet",))
    groups = rows = 0
    for file in files:
        meta = pq.ParquetFile(file).metadata
        groups += meta.num_row_groups
        rows += meta.num_rows
    return len(files), groups, rows
