#!/usr/bin/env python
"""Interval join: Sluice against Flink 2.3 SQL's own interval join, over the same input files, in one session.

Input: the JSON-lines files of scripts/join_bench.py (`{"k", "seq", "ts"}` per side, p files per side for a run
at parallelism p, written once into --data-dir). A left record l and a right record r join when their keys are
equal and l.ts + --lower <= r.ts <= l.ts + --upper; the expected number of pairs is counted here (per key, by
bisection) and every run's output count is checked against it.

Jobs, each at each --parallelism (every operator):
- sluice: FileSource (json, bounded) -> map to (k, seq, ts) -> key_by(k).interval_join(key_by(k))
  .between(lower, upper).process(emit (k, l.seq, r.seq)) -> DiscardSink (chained), watermarks
  BoundedOutOfOrderness(0) with granularity --grain-ms; on a fresh local cluster of 2 workers with 2 slots.
- sluice-grouped: the sluice job with the join and its sink in a slot sharing group of their own
  (`.slot_sharing_group("join")`): the two sources' parsing run in one worker process, the join in the other
  (without it every operator's subtask i shares slot i, so at p=1 the whole job runs in one process).
- sluice-split: as sluice-grouped, and each side's source (with its map) in a group of its own too: 3 slots
  per parallelism, so at p=1 only (the cluster has 4).
- sluice-sql: the same files and join as SQL (`job.sql`, runtime/sql: a filesystem json table per side with
  `WATERMARK FOR ts AS ts`, the join's BETWEEN, a blackhole table); its sources send watermarks periodically,
  every 200 ms of wall-clock time as Flink's (the SQL default, `pipeline.auto-watermark-interval`).
- flink-sql: Flink 2.3 SQL through PyFlink's TableEnvironment, the planner's Java interval join
  (scripts/flink_interval_join_sql_job.py; its mini cluster starts with the process).
- flink-coprocess (--coprocess-records > 0): scripts/flink_interval_join_job.py, PyFlink's Python
  KeyedCoProcessFunction doing Flink's IntervalJoinOperator algorithm, on the same records generated in the job
  (NumberSequenceSource; no files), at --coprocess-records per side: it runs at a few thousand records/s.

Times, start-up runs, medians and the load average per run: scripts/join_bench.py.

    .venv/bin/python scripts/bench_interval_join.py --flink-python FLINK_VENV/bin/python --records 1000000 \\
        --parallelism 1,2 --repeat 3
"""

from __future__ import annotations

import argparse
import bisect
import os
import sys
from operator import itemgetter
from typing import Any

SCRIPTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(SCRIPTS)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from join_bench import (  # noqa: E402
    LEFT_HASH,
    RIGHT_HASH,
    T0,
    add_session_arguments,
    file_sides,
    flink_run,
    job_settings,
    key_of,
    session,
    sluice_run,
    sql_tables,
)

from runtime.api import DiscardSink, Job  # noqa: E402

ENV = "SLUICE_BENCH_INTERVAL_JOIN"  # JSON settings for the job, set before the cluster starts (inherited)


def expected_pairs(records: int, keys: int, lower: int, upper: int) -> int:
    """Pairs of the join over the two sides: per key, the right side's event times sorted, ranges by bisection."""
    right: dict[str, list[int]] = {}
    for seq in range(records):
        right.setdefault(key_of(seq, keys, RIGHT_HASH), []).append(T0 + seq)  # in order: sorted already
    pairs = 0
    for seq in range(records):
        stamps = right.get(key_of(seq, keys, LEFT_HASH), [])
        ts = T0 + seq
        pairs += bisect.bisect_right(stamps, ts + upper) - bisect.bisect_left(stamps, ts + lower)
    return pairs


# -- the Sluice jobs (built in the cluster's processes from ENV) --------------------------------------------------


def _pair(left: Any, right: Any, ctx: Any) -> None:
    ctx.emit((left[0], left[1], right[1]))


def build(job: Job) -> None:
    """The DataStream job (module docstring)."""
    _build(job, join_group=None)


def build_grouped(job: Job) -> None:
    """The DataStream job with the join and its sink in a slot sharing group of their own: the sources' parsing
    and the join run in different worker processes."""
    _build(job, join_group="join")


def build_split(job: Job) -> None:
    """As build_grouped, and each side's source in a group of its own too (three slots at p=1)."""
    _build(job, join_group="join", side_groups=True)


def _build(job: Job, *, join_group: str | None, side_groups: bool = False) -> None:
    s = job_settings(ENV)
    left, right = file_sides(job, s, side_groups=side_groups)
    first = itemgetter(0)
    joined = (left.key_by(first).interval_join(right.key_by(first)).between(s["lower"], s["upper"])
              .process(_pair, parallelism=s["parallelism"], name="interval-join"))
    if join_group is not None:
        joined.slot_sharing_group(join_group)
    joined.sink(DiscardSink(), parallelism=s["parallelism"], name="discard")


def build_sql(job: Job) -> None:
    """The SQL job: the same files and join as Flink's (flink_interval_join_sql_job.py), in Sluice's SQL."""
    s = job_settings(ENV)
    job.sql(f"""
        SET 'parallelism.default' = '{s['parallelism']}';
        {sql_tables(s)}
        CREATE TABLE out_rows (k STRING, lseq BIGINT, rseq BIGINT) WITH ('connector' = 'blackhole');
        INSERT INTO out_rows SELECT l.k, l.seq, r.seq FROM l, r WHERE l.k = r.k
            AND r.ts BETWEEN l.ts + INTERVAL '{s['lower']}' MILLISECOND AND l.ts + INTERVAL '{s['upper']}' MILLISECOND;
    """)


ENTRIES = {"sluice": "bench_interval_join:build", "sluice-grouped": "bench_interval_join:build_grouped",
           "sluice-split": "bench_interval_join:build_split",
           "sluice-sql": "bench_interval_join:build_sql"}


# -- runs ------------------------------------------------------------------------------------------------------


def one_run(args: argparse.Namespace, engine: str, p: int, records: int, data: str) -> dict[str, Any]:
    left, right = os.path.join(data, "left"), os.path.join(data, "right")
    if engine in ENTRIES:
        return sluice_run(engine, ENTRIES[engine], ENV, {"left": left, "right": right, "lower": args.lower,
                                                         "upper": args.upper, "parallelism": p,
                                                         "grain_ms": args.grain_ms}, records, args.timeout)
    if engine == "flink-sql":
        return flink_run(args.flink_python, "flink_interval_join_sql_job.py",
                         ["--left", left, "--right", right, "--lower", str(args.lower), "--upper", str(args.upper),
                          "--records", str(records), "--parallelism", str(p)], args.timeout)
    return flink_run(args.flink_python, "flink_interval_join_job.py",
                     ["--mode", "throughput", "--records", str(records), "--keys", str(args.keys), "--lower",
                      str(args.lower), "--upper", str(args.upper), "--parallelism", str(p)], args.timeout)


def flink_count(args: argparse.Namespace, data: str) -> dict[str, Any]:
    return flink_run(args.flink_python, "flink_interval_join_sql_job.py",
                     ["--left", os.path.join(data, "left"), "--right", os.path.join(data, "right"), "--lower",
                      str(args.lower), "--upper", str(args.upper), "--records", str(args.records), "--count"],
                     args.timeout)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_session_arguments(parser, "sluice,sluice-sql,flink-sql")
    parser.add_argument("--lower", type=int, default=-30, help="ms (default -30)")
    parser.add_argument("--upper", type=int, default=30, help="ms (default 30)")
    parser.add_argument("--grain-ms", type=int, default=100,
                        help="event time between two watermarks of a Sluice DataStream source (default 100)")
    args = parser.parse_args(argv)
    pairs = expected_pairs(args.records, args.keys, args.lower, args.upper)
    return session(args, parser, f"interval join, bounds [{args.lower}, {args.upper}] ms; Sluice grain "
                   f"{args.grain_ms} ms", pairs,
                   lambda engine, p, records, data: one_run(args, engine, p, records, data),
                   lambda data: flink_count(args, data))


if __name__ == "__main__":
    sys.exit(main())
