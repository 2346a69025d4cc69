#!/usr/bin/env python
"""Window join: Sluice against Flink 2.3 SQL's own window join, over the same input files, in one session.

Input: the JSON-lines files of scripts/join_bench.py, the interval join's (`{"k", "seq", "ts"}` per side, p files
per side for a run at parallelism p, written once into --data-dir). A left record l and a right record r join when
their keys are equal and both lie in the same tumbling event-time window of --window-ms; the expected number of
pairs (per key and window, left count times right count) is counted here and every run's output count is checked
against it. With 100 keys and one record per ms per side, a 100 ms window holds one record of each key per side:
as many pairs as records per side (the interval join's [-30, 30] ms gives 0.6 per record).

Jobs, each at each --parallelism (every operator):
- sluice: FileSource (json, bounded) -> map to (k, seq, ts) -> left.join(right).where(k).equal_to(k)
  .window(TumblingEventTimeWindows(--window-ms)).apply(emit (k, l.seq, r.seq)) -> DiscardSink, watermarks
  BoundedOutOfOrderness(0) with granularity --grain-ms; on a fresh local cluster of 2 workers with 2 slots.
- sluice-grouped: the sluice job with the join and its sink in a slot sharing group of their own
  (`.slot_sharing_group("join")`): the sources' parsing in one worker process, the join in the other.
- sluice-sql: the same files and join as SQL (`job.sql`, runtime/sql): a filesystem json table per side with
  `WATERMARK FOR ts AS ts`, the window TVF join below, a blackhole table.
- flink-sql: Flink 2.3 SQL through PyFlink's TableEnvironment, the planner's Java window join
  (scripts/flink_interval_join_sql_job.py --window-ms):

      SELECT L.k, L.seq, R.seq FROM TABLE(TUMBLE(TABLE l, DESCRIPTOR(rt), INTERVAL w)) L
      JOIN TABLE(TUMBLE(TABLE r, DESCRIPTOR(rt), INTERVAL w)) R
      ON L.k = R.k AND L.window_start = R.window_start AND L.window_end = R.window_end

- flink-coprocess (--coprocess-records > 0): scripts/flink_interval_join_job.py --window-ms, a PyFlink Python
  KeyedCoProcessFunction keeping both sides' records per window until the watermark passes its end, on the same
  records generated in the job (NumberSequenceSource; no files).

Times, start-up runs, medians and the load average per run: scripts/join_bench.py.

--chain-records N instead measures the DataStream join's own CPU per record in one process: its chain (the join
-> DiscardSink, built from the sluice job's graph) fed N records per side as the task feeds it, the two sides in
turn in batches of --chain-batch, the watermark moved by each --grain-ms of event time and the due timers fired.

    .venv/bin/python scripts/bench_window_join.py --flink-python FLINK_VENV/bin/python --records 1000000 \\
        --parallelism 1,2 --repeat 3 --engines sluice,sluice-grouped,sluice-sql,flink-sql --check-flink-count
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter
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
    session,
    side_records,
    sluice_run,
    sql_tables,
)

from runtime.api import BoundedOutOfOrderness, DiscardSink, Job, TumblingEventTimeWindows  # noqa: E402

ENV = "SLUICE_BENCH_WINDOW_JOIN"  # JSON settings for the job, set before the cluster starts (inherited)


def expected_pairs(records: int, keys: int, window_ms: int) -> int:
    """Pairs of the join over the two sides: per key and window, the left side's records times the right's."""
    left = Counter((k, ts - ts % window_ms) for k, ts in side_records(records, keys, LEFT_HASH))
    right = Counter((k, ts - ts % window_ms) for k, ts in side_records(records, keys, RIGHT_HASH))
    return sum(n * right[cell] for cell, n in left.items())


# -- the Sluice jobs (built in the cluster's processes from ENV) --------------------------------------------------


def _pair(left: Any, right: Any) -> tuple[str, int, int]:
    return left[0], left[1], right[1]


def build(job: Job) -> None:
    """The DataStream job (module docstring)."""
    _build(job, join_group=None)


def build_grouped(job: Job) -> None:
    """The DataStream job with the join and its sink in a slot sharing group of their own."""
    _build(job, join_group="join")


def _build(job: Job, *, join_group: str | None) -> None:
    s = job_settings(ENV)
    left, right = file_sides(job, s)
    first = itemgetter(0)
    joined = (left.join(right).where(first).equal_to(first).window(TumblingEventTimeWindows(s["window_ms"]))
              .apply(_pair, parallelism=s["parallelism"], name="window-join"))
    if join_group is not None:
        joined.slot_sharing_group(join_group)
    joined.sink(DiscardSink(), parallelism=s["parallelism"], name="discard")


def build_sql(job: Job) -> None:
    """The SQL job: the same files and join as Flink's (flink_interval_join_sql_job.py --window-ms)."""
    s = job_settings(ENV)
    size = f"INTERVAL '{s['window_ms']}' MILLISECOND"
    job.sql(f"""
        SET 'parallelism.default' = '{s['parallelism']}';
        {sql_tables(s)}
        CREATE TABLE out_rows (k STRING, lseq BIGINT, rseq BIGINT) WITH ('connector' = 'blackhole');
        INSERT INTO out_rows SELECT L.k, L.seq, R.seq
            FROM TABLE(TUMBLE(TABLE l, DESCRIPTOR(ts), {size})) L
            JOIN TABLE(TUMBLE(TABLE r, DESCRIPTOR(ts), {size})) R
            ON L.k = R.k AND L.window_start = R.window_start AND L.window_end = R.window_end;
    """)


ENTRIES = {"sluice": "bench_window_join:build", "sluice-grouped": "bench_window_join:build_grouped",
           "sluice-sql": "bench_window_join:build_sql"}


def chain_cpu(records: int, keys: int, window_ms: int, grain_ms: int, batch: int, lead: int = 0) -> tuple[float, int]:
    """CPU seconds of the DataStream join's chain over `records` per side (module docstring), and its pairs. `lead`:
    the left side's records that many ahead of the right side's (a source that runs ahead of the other one)."""
    from runtime.api import GeneratorSource
    from runtime.execution.operators import Chain

    job = Job("bench")
    os.environ[ENV] = json.dumps({"left": "", "right": "", "window_ms": window_ms, "grain_ms": grain_ms,
                                  "parallelism": 1})
    sides = [job.source(GeneratorSource(count=1), name=side, watermarks=BoundedOutOfOrderness(
        max_delay_ms=0, timestamp=itemgetter(2))) for side in ("left", "right")]
    first = itemgetter(0)
    joined = (sides[0].join(sides[1]).where(first).equal_to(first).window(TumblingEventTimeWindows(window_ms))
              .apply(_pair, name="window-join"))
    joined.sink(DiscardSink(), name="discard")
    join_node = job.nodes[joined.node_id]
    tags = [job.nodes[inp.node].payload for inp in join_node.inputs]  # the job graph's own tag maps
    chain = Chain(job, [joined.node_id, joined.node_id + 1], subtask_index=0, parallelism=1, attempt=0, outputs=[])
    chain.open()
    rows = [[(ts, tag((k, ts - T0, ts))) for k, ts in side_records(records, keys, hashing)]
            for tag, hashing in zip(tags, (LEFT_HASH, RIGHT_HASH), strict=True)]
    timers = chain.timers
    assert timers is not None
    watermark = -1
    start = time.process_time()
    for i in range(0, records + lead, batch):
        chain.process_batch(rows[0][i:i + batch])
        if i >= lead:
            chain.process_batch(rows[1][i - lead:i - lead + batch])
        if i < lead or i - lead >= records:
            continue
        reached = rows[1][min(i - lead + batch, records) - 1][0] // grain_ms * grain_ms - 1
        if reached > watermark:
            watermark = reached
            timers.set_watermark(watermark)
            while timers.fire_event(watermark, 64):
                pass
            chain.forward_watermark(watermark)
    end = 2**62
    timers.set_watermark(end)
    while timers.fire_event(end, 64):
        pass
    return time.process_time() - start, chain.records_out


# -- runs ------------------------------------------------------------------------------------------------------


def one_run(args: argparse.Namespace, engine: str, p: int, records: int, data: str) -> dict[str, Any]:
    left, right = os.path.join(data, "left"), os.path.join(data, "right")
    if engine in ENTRIES:
        return sluice_run(engine, ENTRIES[engine], ENV, {"left": left, "right": right, "window_ms": args.window_ms,
                                                         "parallelism": p, "grain_ms": args.grain_ms},
                          records, args.timeout)
    if engine == "flink-sql":
        return flink_run(args.flink_python, "flink_interval_join_sql_job.py",
                         ["--left", left, "--right", right, "--window-ms", str(args.window_ms),
                          "--records", str(records), "--parallelism", str(p)], args.timeout)
    return flink_run(args.flink_python, "flink_interval_join_job.py",
                     ["--mode", "throughput", "--records", str(records), "--keys", str(args.keys),
                      "--window-ms", str(args.window_ms), "--parallelism", str(p)], args.timeout)


def flink_count(args: argparse.Namespace, data: str) -> dict[str, Any]:
    return flink_run(args.flink_python, "flink_interval_join_sql_job.py",
                     ["--left", os.path.join(data, "left"), "--right", os.path.join(data, "right"), "--window-ms",
                      str(args.window_ms), "--records", str(args.records), "--count"], args.timeout)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_session_arguments(parser, "sluice,sluice-grouped,sluice-sql,flink-sql")
    parser.add_argument("--window-ms", type=int, default=100, help="the tumbling window's size (default 100)")
    parser.add_argument("--grain-ms", type=int, default=100,
                        help="event time between two watermarks of a Sluice DataStream source (default 100)")
    parser.add_argument("--chain-records", type=int, default=0,
                        help="> 0: the join's chain alone in this process over this many records per side")
    parser.add_argument("--chain-batch", type=int, default=100, help="records per batch (--chain-records)")
    parser.add_argument("--chain-lead", type=int, default=0,
                        help="records the left side runs ahead of the right one (--chain-records)")
    args = parser.parse_args(argv)
    if args.chain_records:
        pairs = expected_pairs(args.chain_records, args.keys, args.window_ms)
        for _ in range(args.repeat):
            cpu, out = chain_cpu(args.chain_records, args.keys, args.window_ms, args.grain_ms, args.chain_batch,
                                 args.chain_lead)
            verdict = "" if out == pairs else f" (NOT the expected {pairs:,})"
            print(f"window join chain: {cpu * 1e6 / (2 * args.chain_records):.2f} CPU us per record, {out:,} "
                  f"records out{verdict}", flush=True)
        return 0
    pairs = expected_pairs(args.records, args.keys, args.window_ms)
    return session(args, parser, f"window join, tumbling {args.window_ms} ms; Sluice grain {args.grain_ms} ms",
                   pairs, lambda engine, p, records, data: one_run(args, engine, p, records, data),
                   lambda data: flink_count(args, data))


if __name__ == "__main__":
    sys.exit(main())
