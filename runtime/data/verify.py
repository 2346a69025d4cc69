"""`sluice data verify`: compare a job's committed output with a batch computation of the same query.

The expected result comes from the job's input (the Parquet data set
`generate` wrote); the actual result is what the job's FileSink committed:
its visible part files (`part-*`; in-progress files start with a dot and are
never read), or the rows of the Delta or Iceberg table its DeltaSink or
IcebergSink committed to (`--output-format`; runtime/data/tables.py).
Output rows are compared as a multiset, and every output line falls in
exactly one class:

- the first copy of an expected row: correct (the first n, for a row
  expected n times: window-join);
- a further copy of an expected row: a duplicate (N copies count N - 1);
- a row that is not expected at all (including lines that do not parse as
  a row of the query's shape): wrong, every copy counted.

An expected row with no copy in the output is missing. So
output rows = expected - missing + duplicate + wrong.

Queries (rows are JSON arrays, as FileSink writes tuples):
- wordcount (the README's job): for every key k with c input rows, exactly
  the rows [k, 1], [k, 2], ..., [k, c].
- window-count (--window-ms W [--slide-ms S] [--max-delay-ms D]
  [--allowed-lateness-ms L] [--late-output DIR]): every firing
  [key, window_start, window_end, count] of a count over tumbling (or
  sliding) event-time windows, with the records that are late under a
  bounded-out-of-orderness watermark left out of the counts, and (with
  --late-output) those late records [key, seq, event_time_ms] in the side
  output's directory. With L > 0 a window fires once more for every record
  added after its first firing, so it has several rows.
- session-count (--gap-ms G [--max-delay-ms D]): every firing
  [key, session_start, session_end, count] of event-time session windows.
  Needs an input where no record arrives behind the watermark.
- interval-join, window-join (--right-input R ...): rows [key, left_seq,
  right_seq] of a join of two inputs; see runtime/data/verify_joins.py.

The rules of the windowed queries (watermarks, window assignment, lateness,
firing) are stated and simulated in runtime/data/event_time.py; here they
are computed in closed form with Spark SQL (window functions, no Python
UDF). They hold for a job whose source has parallelism 1: the watermark
depends on the order records are read, and only one reader has a fixed
order. That order is ParquetSource's: files sorted by path, row groups and
rows in file order (for what `generate` writes: seq order).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from runtime.connectors.files import list_input_files
from runtime.data.spark import DataError
from runtime.data.tables import OutputTable, table_frame
from runtime.data.verify_input import EventTimeOptions, read_in_source_order, records_behind, with_watermark
from runtime.data.verify_joins import join_expected

EXAMPLES = 5  # rows shown per kind of difference
KINDS = ("missing", "duplicate", "wrong")
QUERIES = ("wordcount", "window-count", "session-count", "interval-join", "window-join")


def check_verify_args(input: str, output: str, query: str, options: EventTimeOptions | None = None, *,
                      table: OutputTable | None = None) -> None:
    """Raise DataError for a missing input or output, an unknown query or options that do not fit it;
    runs before Spark starts. `table`: the output is that table, not part files."""
    opts = options or EventTimeOptions()
    if query not in QUERIES:
        raise DataError(f"unknown --query {query!r}; known: {', '.join(QUERIES)}")
    _check_options(query, opts)
    if not os.path.exists(input):
        raise DataError(f"no input at {input}")
    if not list_input_files(input, (".parquet",)):
        raise DataError(f"no Parquet files under {input}")
    if table is None and not os.path.isdir(output):
        raise DataError(f"no output directory at {output}")
    if opts.late_output is not None and not os.path.isdir(opts.late_output):
        raise DataError(f"no late-output directory at {opts.late_output}")
    if opts.right_input is not None and not list_input_files(opts.right_input, (".parquet",)):
        raise DataError(f"no Parquet files under {opts.right_input} (--right-input)")


def _check_options(query: str, o: EventTimeOptions) -> None:
    given = {"--window-ms": o.window_ms is not None, "--slide-ms": o.slide_ms is not None,
             "--max-delay-ms": o.max_delay_ms != 0, "--allowed-lateness-ms": o.allowed_lateness_ms != 0,
             "--gap-ms": o.gap_ms is not None, "--late-output": o.late_output is not None,
             "--right-input": o.right_input is not None, "--lower-ms": o.lower_ms is not None,
             "--upper-ms": o.upper_ms is not None}
    allowed = {"wordcount": set(),
               "window-count": {"--window-ms", "--slide-ms", "--max-delay-ms", "--allowed-lateness-ms",
                                "--late-output"},
               "session-count": {"--gap-ms", "--max-delay-ms", "--late-output"},
               "interval-join": {"--right-input", "--lower-ms", "--upper-ms", "--max-delay-ms"},
               "window-join": {"--right-input", "--window-ms", "--slide-ms", "--max-delay-ms"}}[query]
    extra = [name for name, set_ in given.items() if set_ and name not in allowed]
    if extra:
        raise DataError(f"--query {query} takes no {', '.join(extra)}")
    if o.max_delay_ms < 0 or o.allowed_lateness_ms < 0:
        raise DataError("--max-delay-ms and --allowed-lateness-ms must be >= 0")
    if query.endswith("-join") and o.right_input is None:
        raise DataError(f"--query {query} joins two inputs: give the second with --right-input")
    if query == "interval-join" and (o.lower_ms is None or o.upper_ms is None or o.lower_ms > o.upper_ms):
        raise DataError("--query interval-join needs --lower-ms and --upper-ms with lower <= upper")
    if query in ("window-count", "window-join"):
        if o.window_ms is None or o.window_ms <= 0:
            raise DataError(f"--query {query} needs --window-ms > 0")
        if o.slide_ms is not None and not 0 < o.slide_ms <= o.window_ms:
            raise DataError(f"--slide-ms must be > 0 and at most --window-ms ({o.window_ms}), got {o.slide_ms}")
    if query == "session-count" and (o.gap_ms is None or o.gap_ms <= 0):
        raise DataError("--query session-count needs --gap-ms > 0")


@dataclass
class VerifyResult:
    query: str
    input: str
    output: str
    output_files: int
    expected_rows: int
    output_rows: int
    missing: int
    duplicate: int
    wrong: int
    seconds: float
    # kind -> up to EXAMPLES rows {"row": [key, value, ...], "copies", "line"}, sorted by row
    examples: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    params: str = ""  # the windowed queries' parameters, as the summary shows them
    late: VerifyResult | None = None  # the late-records side output, when it was checked

    @property
    def ok(self) -> bool:
        own = self.missing == 0 and self.duplicate == 0 and self.wrong == 0
        return own and (self.late is None or self.late.ok)

    def summary(self) -> str:
        own = self.missing == 0 and self.duplicate == 0 and self.wrong == 0
        return (f"verify {self.query}{self.params}: {self.expected_rows:,} expected rows, "
                f"{self.output_rows:,} output rows: {self.missing:,} missing, {self.duplicate:,} duplicate, "
                f"{self.wrong:,} wrong -> {'OK' if own else 'FAILED'} ({self.output_files} part files, "
                f"{self.seconds:.1f} s)")

    def report(self) -> str:
        """The summary line, then up to EXAMPLES examples of each kind of difference; the same for the late
        records when they were checked."""
        lines = [self.summary()]
        for kind in KINDS:
            for ex in self.examples.get(kind, []):
                if kind == "wrong":
                    text = ex["line"] if len(ex["line"]) <= 200 else ex["line"][:200] + "..."
                else:
                    text = json.dumps(ex["row"], ensure_ascii=False)
                copies = f"  ({ex['copies']} copies)" if ex["copies"] > 1 else ""
                lines.append(f"  {kind:<9} {text}{copies}")
        if self.late is not None:
            lines.append(self.late.report())
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        out = {**asdict(self), "ok": self.ok, "summary": self.summary()}
        if self.late is not None:
            out["late"] = self.late.to_json()
        return out


def output_files(output: str) -> list[str]:
    """The committed part files under `output`: visible (no leading '.' or '_') and named part-*."""
    files = list_input_files(output, (".jsonl", ".json", ".parquet"))
    return [f for f in files if os.path.basename(f).startswith("part-")]


# Expected rows are DataFrames of (key string, v0 long, ..., v{width-1} long): the JSON array [key, v0, ...].

def wordcount_expected(inp: Any) -> Any:
    """(key, n) for n in 1..count(key): the running count the word-count job emits per input row."""
    from pyspark.sql import functions as F

    counts = inp.groupBy("key").agg(F.count(F.lit(1)).alias("c"))
    return counts.select("key", F.explode(F.sequence(F.lit(1).cast("long"), F.col("c"))).alias("v0"))


def window_count_expected(records: Any, o: EventTimeOptions) -> tuple[Any, Any]:
    """(firings (key, start, end, count), late records (key, seq, event_time_ms)) of a window count over
    records that carry their watermark `wm` (event_time.py states the rules; this is their closed form)."""
    from pyspark.sql import functions as F

    assert o.window_ms is not None
    size = o.window_ms
    slide = o.slide_ms or size
    ts, wm = F.col("event_time_ms"), F.col("wm")
    # The windows holding ts start at the multiples of slide in (ts - size, ts].
    last_start = ts - F.pmod(ts, F.lit(slide))
    first_start = (ts - size) - F.pmod(ts - size, F.lit(slide)) + slide
    per_window = records.select("key", "event_time_ms", "wm",
                                F.explode(F.sequence(first_start, last_start, F.lit(slide).cast("long")))
                                .alias("start"))
    end = F.col("start") + size
    kept = wm.isNull() | (end - 1 + o.allowed_lateness_ms > wm)
    on_time = wm.isNull() | (wm < end - 1)  # arrived before the window's first firing
    counts = (per_window.groupBy("key", "start")
              .agg(F.sum(F.when(kept & on_time, 1).otherwise(0)).cast("long").alias("n0"),
                   F.sum(F.when(kept & ~on_time, 1).otherwise(0)).cast("long").alias("n1"))
              .filter(F.col("n0") + F.col("n1") > 0))
    # First firing with the on-time count n0 (if there is one: a window first reached by a record within the
    # allowed lateness fires at once with 1), then one firing per later record: counts max(n0, 1)..n0 + n1.
    firings = counts.select(F.col("key"), F.col("start").alias("v0"), (F.col("start") + size).alias("v1"),
                            F.explode(F.sequence(F.greatest(F.col("n0"), F.lit(1).cast("long")),
                                                 F.col("n0") + F.col("n1"))).alias("v2"))
    # Dropped from all its windows = dropped from the one that ends last (the drop rule is monotone in the end).
    late = records.filter(wm.isNotNull() & (last_start + size - 1 + o.allowed_lateness_ms <= wm))
    return firings, late.select("key", F.col("seq").alias("v0"), F.col("event_time_ms").alias("v1"))


def session_count_expected(records: Any, o: EventTimeOptions) -> Any:
    """Firings (key, start, end, count) of event-time sessions over records that carry their watermark `wm`;
    DataError if a record arrives behind the watermark (then sessions could fire more than once)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    assert o.gap_ms is not None
    count, first = records_behind(records)
    if count:
        raise DataError(
            f"session-count needs an input where no record is behind the watermark (event time <= max event "
            f"time read before it - max delay - 1); {count:,} records are, the first seq {first['seq']} "
            f"(event time {first['event_time_ms']}, watermark {first['wm']}). Use --jitter-ms at most "
            f"--max-delay-ms when generating the input.")
    by_time = Window.partitionBy("key").orderBy("event_time_ms", "seq")
    gap_before = F.col("event_time_ms") - F.lag("event_time_ms").over(by_time)
    starts = records.withColumn("opens", F.when(gap_before.isNull() | (gap_before >= o.gap_ms), 1).otherwise(0))
    numbered = starts.withColumn(
        "session", F.sum("opens").over(by_time.rowsBetween(Window.unboundedPreceding, Window.currentRow)))
    sessions = numbered.groupBy("key", "session").agg(F.min("event_time_ms").alias("v0"),
                                                      (F.max("event_time_ms") + o.gap_ms).alias("v1"),
                                                      F.count(F.lit(1)).alias("v2"))
    return sessions.select("key", "v0", "v1", "v2")


def _row_pattern(width: int) -> str:
    # FileSink writes ["key",1,2] with no spaces. A line of exactly that shape with no escapes in the key (every
    # line of these jobs) is taken apart by one regular expression, several times faster than a JSON parser;
    # any other line goes through from_json.
    return r'^\["([^"\\]*)"' + r",(-?[0-9]{1,18})" * width + r"\]$"


def read_output(spark: Any, files: list[str] | OutputTable, width: int = 1) -> Any:
    """(key, v0, ..., v{width-1}, line) per committed output row; a line that is not [string, integer * width]
    has a null key or values. `files` may be a table instead (its rows, through Arrow)."""
    from pyspark.sql import functions as F

    if isinstance(files, OutputTable):
        return table_frame(spark, files, width)
    names = [f"v{i}" for i in range(width)]
    frames = []
    jsonl = [f for f in files if not f.endswith(".parquet")]
    if jsonl:
        lines = spark.read.text(jsonl).filter(F.trim("value") != "")  # readers skip blank lines; so do we
        line = F.col("value")
        pattern = _row_pattern(width)
        simple = line.rlike(pattern)
        arr = F.from_json(line, "array<string>")  # as array<string>, a JSON number comes back as its text
        fits = F.size(arr) == width + 1
        key = F.when(simple, F.regexp_extract(line, pattern, 1)).when(fits, F.get(arr, 0))
        values = [F.when(simple, F.regexp_extract(line, pattern, i + 2).cast("long"))
                  .when(fits, F.get(arr, i + 1).try_cast("long")).alias(name) for i, name in enumerate(names)]
        frames.append(lines.select(key.alias("key"), *values, line.alias("line")))
    parquet = [f for f in files if f.endswith(".parquet")]
    if parquet:  # FileSink(format="parquet") writes a tuple (k, a, b, ...) as columns f0, f1, ...
        rows = spark.read.parquet(*parquet)
        cols = [F.col(f"f{i}") for i in range(width + 1)]
        frames.append(rows.select(cols[0].cast("string").alias("key"),
                                  *(c.try_cast("long").alias(name) for c, name in zip(cols[1:], names, strict=True)),
                                  F.to_json(F.array(*(c.cast("string") for c in cols))).alias("line")))
    if not frames:
        schema = ", ".join(["key string", *(f"{name} long" for name in names), "line string"])
        return spark.createDataFrame([], schema)
    out = frames[0]
    for f in frames[1:]:
        out = out.unionByName(f)
    return out


def compare(spark: Any, expected: Any, files: list[str] | OutputTable, width: int, *,
            repeats: bool = False) -> dict[str, Any]:
    """Counts (expected_rows, output_rows, missing, duplicate, wrong) and examples of comparing the rows in
    `files` with `expected` (key, v0, ...) as multisets. `repeats`: an expected row may be there n > 1 times
    (window-join: a pair in several sliding windows); then n copies are correct, fewer are missing ones and
    more duplicates. Without it expected rows are distinct, which spares an aggregation."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    names = [f"v{i}" for i in range(width)]
    exp = expected.select(F.col("key").alias("e_key"), *(F.col(n).alias(f"e_{n}") for n in names))
    if repeats:
        exp = exp.groupBy(*exp.columns).agg(F.count(F.lit(1)).alias("e_copies"))
    else:
        exp = exp.withColumn("e_copies", F.lit(1).cast("long"))
    out = read_output(spark, files, width)
    # Unparsable lines (a null value) are grouped by their text, so each distinct one is its own wrong row.
    unparsed = F.lit(False)
    for n in names:
        unparsed = unparsed | F.col(n).isNull()
    bad_line = F.when(unparsed, F.col("line")).alias("bad_line")
    got = (out.groupBy("key", *names, bad_line)
           .agg(F.count(F.lit(1)).alias("copies"), F.min("line").alias("line")))
    # Null-safe equality: a null key is a key like any other, and an unparsable line (null value) matches nothing.
    on = exp["e_key"].eqNullSafe(got["key"])
    for n in names:
        on = on & exp[f"e_{n}"].eqNullSafe(got[n])
    rows = (exp.join(got, on, "full_outer")
            .select(F.coalesce("e_key", "key").alias("key"), *(F.coalesce(f"e_{n}", n).alias(n) for n in names),
                    F.col(f"e_{names[0]}").isNotNull().alias("expected"),
                    F.coalesce("copies", F.lit(0)).alias("copies"), F.coalesce("e_copies", F.lit(0)).alias("wanted"),
                    "line"))
    copies, wanted = F.col("copies"), F.col("wanted")
    kinds = {"missing": F.col("expected") & (copies < wanted),
             "duplicate": F.col("expected") & (copies > wanted),
             "wrong": ~F.col("expected")}
    weights = {"missing": wanted - copies, "duplicate": copies - wanted, "wrong": copies}
    totals = rows.agg(
        F.sum("wanted").alias("expected_rows"),
        F.sum("copies").alias("output_rows"),
        *(F.sum(F.when(cond, weights[kind]).otherwise(0)).alias(kind) for kind, cond in kinds.items()),
    ).first()
    counts: dict[str, Any] = {name: int(totals[name] or 0) for name in ("expected_rows", "output_rows", *KINDS)}
    examples: dict[str, list[dict[str, Any]]] = {}
    if any(counts[kind] for kind in KINDS):
        # A second pass, only when something differs: the differing rows are kept, then each kind's first
        # few are picked from them.
        differs = kinds["missing"] | kinds["duplicate"] | kinds["wrong"]
        diffs = rows.filter(differs).persist(StorageLevel.MEMORY_AND_DISK)
        try:
            for kind, cond in kinds.items():
                if counts[kind]:
                    picked = diffs.filter(cond).orderBy("key", *names, "line").limit(EXAMPLES).collect()
                    examples[kind] = [{"row": [r["key"], *(r[n] for n in names)], "copies": int(r["copies"]),
                                       "line": r["line"] if r["line"] is not None else ""} for r in picked]
        finally:
            diffs.unpersist()
    return {**counts, "examples": examples}


def _outputs(output: str, table: OutputTable | None) -> tuple[list[str] | OutputTable, int, str]:
    """What to compare (part files or the table), how many data files that is, and the output's name."""
    if table is None:
        files = output_files(output)
        return files, len(files), os.path.abspath(output)
    return table, table.data_files(), table.location if table.format == "iceberg" else os.path.abspath(output)


def verify(spark: Any, input: str, output: str, query: str = "wordcount",
           options: EventTimeOptions | None = None, *, table: OutputTable | None = None) -> VerifyResult:
    """Compare the committed output under `output` (or in `table`; and the late records under
    options.late_output) with `query` computed over the Parquet input `input`."""
    from pyspark import StorageLevel

    opts = options or EventTimeOptions()
    check_verify_args(input, output, query, opts, table=table)
    started = time.monotonic()
    params = opts.describe(query)
    if query == "wordcount":
        files, count, name = _outputs(output, table)
        found = compare(spark, wordcount_expected(spark.read.parquet(input)), files, 1)
        return VerifyResult(query=query, input=os.path.abspath(input), output=name, output_files=count,
                            seconds=time.monotonic() - started, **found)
    if query.endswith("-join"):
        assert opts.right_input is not None
        files, count, name = _outputs(output, table)
        found = compare(spark, join_expected(spark, query, input, opts.right_input, opts), files, 2,
                        repeats=query == "window-join")
        return VerifyResult(query=query, input=os.path.abspath(input), output=name, output_files=count,
                            seconds=time.monotonic() - started, params=params, **found)
    # The watermark pass is the expensive one; both comparisons and the session check read its result.
    records = with_watermark(read_in_source_order(spark, input), opts.max_delay_ms).persist(
        StorageLevel.MEMORY_AND_DISK)
    try:
        if query == "window-count":
            firings, late = window_count_expected(records, opts)
        else:
            firings = session_count_expected(records, opts)
            late = records.filter("false").select("key", records["seq"].alias("v0"),
                                                  records["event_time_ms"].alias("v1"))
        files, count, name = _outputs(output, table)
        found = compare(spark, firings, files, 3)
        late_result = None
        if opts.late_output is not None:
            late_started = time.monotonic()
            late_files = output_files(opts.late_output)
            late_found = compare(spark, late, late_files, 2)
            late_result = VerifyResult(query=f"{query} late records", input=os.path.abspath(input),
                                       output=os.path.abspath(opts.late_output), output_files=len(late_files),
                                       seconds=time.monotonic() - late_started, **late_found)
    finally:
        records.unpersist()
    return VerifyResult(query=query, input=os.path.abspath(input), output=name, output_files=count,
                        seconds=time.monotonic() - started, params=params, late=late_result, **found)
