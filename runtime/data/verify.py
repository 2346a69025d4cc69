"""`sluice data verify`: compare a job's committed output with a batch computation of the same query.

The expected result comes from the job's input (the Parquet data set
`generate` wrote); the actual result is what the job's FileSink committed:
its visible part files (`part-*`; in-progress files start with a dot and are
never read). Output rows are compared as a multiset, and every output line
falls in exactly one class:

- the first copy of an expected row: correct;
- a further copy of an expected row: a duplicate (N copies count N - 1);
- a row that is not expected at all (including lines that do not parse as
  [key, integer]): wrong, every copy counted.

An expected row with no copy in the output is missing. So
output rows = expected - missing + duplicate + wrong.

Queries:
- wordcount (the README's job): for every key k with c input rows, exactly
  the rows (k, 1), (k, 2), ..., (k, c).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from runtime.connectors.files import list_input_files
from runtime.data.spark import DataError

EXAMPLES = 5  # rows shown per kind of difference
KINDS = ("missing", "duplicate", "wrong")


def wordcount_expected(inp: Any) -> Any:
    """(key, n) for n in 1..count(key): the running count the word-count job emits per input row."""
    from pyspark.sql import functions as F

    counts = inp.groupBy("key").agg(F.count(F.lit(1)).alias("c"))
    return counts.select("key", F.explode(F.sequence(F.lit(1).cast("long"), F.col("c"))).alias("n"))


QUERIES: dict[str, Callable[[Any], Any]] = {"wordcount": wordcount_expected}


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
    # kind -> up to EXAMPLES rows {"key", "n", "copies", "line"}, sorted by key and n
    examples: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.missing == 0 and self.duplicate == 0 and self.wrong == 0

    def summary(self) -> str:
        return (f"verify {self.query}: {self.expected_rows:,} expected rows, {self.output_rows:,} output rows: "
                f"{self.missing:,} missing, {self.duplicate:,} duplicate, {self.wrong:,} wrong -> "
                f"{'OK' if self.ok else 'FAILED'} ({self.output_files} part files, {self.seconds:.1f} s)")

    def report(self) -> str:
        """The summary line, then up to EXAMPLES examples of each kind of difference."""
        lines = [self.summary()]
        for kind in KINDS:
            for ex in self.examples.get(kind, []):
                if kind == "wrong":
                    text = ex["line"] if len(ex["line"]) <= 200 else ex["line"][:200] + "..."
                else:
                    text = json.dumps([ex["key"], ex["n"]], ensure_ascii=False)
                copies = f"  ({ex['copies']} copies)" if ex["copies"] > 1 else ""
                lines.append(f"  {kind:<9} {text}{copies}")
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok, "summary": self.summary()}


def output_files(output: str) -> list[str]:
    """The committed part files under `output`: visible (no leading '.' or '_') and named part-*."""
    files = list_input_files(output, (".jsonl", ".json", ".parquet"))
    return [f for f in files if os.path.basename(f).startswith("part-")]


def check_verify_args(input: str, output: str, query: str) -> None:
    """Raise DataError for a missing input or output, or an unknown query; runs before Spark starts."""
    if query not in QUERIES:
        raise DataError(f"unknown --query {query!r}; known: {', '.join(sorted(QUERIES))}")
    if not os.path.exists(input):
        raise DataError(f"no input at {input}")
    if not list_input_files(input, (".parquet",)):
        raise DataError(f"no Parquet files under {input}")
    if not os.path.isdir(output):
        raise DataError(f"no output directory at {output}")


# FileSink writes ["key",n] with no spaces. A line of exactly that shape with no escapes in the key (every
# line of a word count) is taken apart by one regular expression, several times faster than a JSON parser;
# any other line goes through from_json. As array<string>, a JSON number comes back as its text ("3").
_PAIR = r'^\["([^"\\]*)",(-?[0-9]{1,18})\]$'


def read_output(spark: Any, files: list[str]) -> Any:
    """(key, n, line) per committed output row; a line that is not [string, integer] has a null key or n."""
    from pyspark.sql import functions as F

    frames = []
    jsonl = [f for f in files if not f.endswith(".parquet")]
    if jsonl:
        lines = spark.read.text(jsonl).filter(F.trim("value") != "")  # readers skip blank lines; so do we
        line = F.col("value")
        simple = line.rlike(_PAIR)
        arr = F.from_json(line, "array<string>")
        pair = F.size(arr) == 2
        key = F.when(simple, F.regexp_extract(line, _PAIR, 1)).when(pair, F.get(arr, 0))
        n = F.when(simple, F.regexp_extract(line, _PAIR, 2).cast("long")).when(pair, F.get(arr, 1).try_cast("long"))
        frames.append(lines.select(key.alias("key"), n.alias("n"), line.alias("line")))
    parquet = [f for f in files if f.endswith(".parquet")]
    if parquet:  # FileSink(format="parquet") writes a tuple (k, n) as columns f0, f1
        rows = spark.read.parquet(*parquet)
        frames.append(rows.select(F.col("f0").cast("string").alias("key"), F.col("f1").try_cast("long").alias("n"),
                                  F.to_json(F.array(F.col("f0").cast("string"), F.col("f1").cast("string")))
                                  .alias("line")))
    if not frames:
        return spark.createDataFrame([], "key string, n long, line string")
    out = frames[0]
    for f in frames[1:]:
        out = out.unionByName(f)
    return out


def verify(spark: Any, input: str, output: str, query: str = "wordcount") -> VerifyResult:
    """Compare the committed output under `output` with `query` computed over the Parquet input `input`."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    check_verify_args(input, output, query)
    started = time.monotonic()
    files = output_files(output)
    expected = QUERIES[query](spark.read.parquet(input)).select(F.col("key").alias("e_key"), F.col("n").alias("e_n"))
    out = read_output(spark, files)
    # Unparsable lines (null n) are grouped by their text, so each distinct one is its own wrong row.
    bad_line = F.when(F.col("n").isNull(), F.col("line")).alias("bad_line")
    got = (out.groupBy("key", "n", bad_line)
           .agg(F.count(F.lit(1)).alias("copies"), F.min("line").alias("line")))
    # Null-safe equality: a null key is a key like any other, and an unparsable line (null n) matches nothing.
    on = expected["e_key"].eqNullSafe(got["key"]) & expected["e_n"].eqNullSafe(got["n"])
    rows = (expected.join(got, on, "full_outer")
            .select(F.coalesce("e_key", "key").alias("key"), F.coalesce("e_n", "n").alias("n"),
                    F.col("e_n").isNotNull().alias("expected"),
                    F.coalesce("copies", F.lit(0)).alias("copies"), "line"))
    kinds = {"missing": F.col("expected") & (F.col("copies") == 0),
             "duplicate": F.col("expected") & (F.col("copies") > 1),
             "wrong": ~F.col("expected")}
    weights = {"missing": F.lit(1), "duplicate": F.col("copies") - 1, "wrong": F.col("copies")}
    totals = rows.agg(
        F.sum(F.when(F.col("expected"), 1).otherwise(0)).alias("expected_rows"),
        F.sum("copies").alias("output_rows"),
        *(F.sum(F.when(cond, weights[kind]).otherwise(0)).alias(kind) for kind, cond in kinds.items()),
    ).first()
    counts = {name: int(totals[name] or 0) for name in ("expected_rows", "output_rows", *KINDS)}
    examples: dict[str, list[dict[str, Any]]] = {}
    if any(counts[kind] for kind in KINDS):
        # A second pass, only when something differs: the differing rows are kept, then each kind's first
        # few are picked from them.
        differs = kinds["missing"] | kinds["duplicate"] | kinds["wrong"]
        diffs = rows.filter(differs).persist(StorageLevel.MEMORY_AND_DISK)
        try:
            for kind, cond in kinds.items():
                if counts[kind]:
                    picked = diffs.filter(cond).orderBy("key", "n", "line").limit(EXAMPLES).collect()
                    examples[kind] = [{"key": r["key"], "n": r["n"], "copies": int(r["copies"]),
                                       "line": r["line"] if r["line"] is not None else ""} for r in picked]
        finally:
            diffs.unpersist()
    return VerifyResult(query=query, input=os.path.abspath(input), output=os.path.abspath(output),
                        output_files=len(files), seconds=time.monotonic() - started, examples=examples, **counts)
