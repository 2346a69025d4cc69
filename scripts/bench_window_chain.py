#!/usr/bin/env python
"""The window operator's CPU per record in one process, without the network: records through a real Chain.

GeneratorSource records (1000 keys, uniform or in bursts (--keys), event time 1 ms apart) as (timestamp,
record) elements through key_by -> {keyed count | TumblingEventTimeWindows(10 s).count() |
SlidingEventTimeWindows(60 s, 10 s).count() | EventTimeSessionWindows(1 s).count()} -> DiscardSink, in
batches of --step records with a watermark after each (as the cluster job's 10 ms watermark granularity gives
about one per ten records), firing the due timers as the task does. CPU time per record.

    .venv/bin/python scripts/bench_window_chain.py --records 200000 --step 10
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from runtime.api import (  # noqa: E402
    BoundedOutOfOrderness,
    DiscardSink,
    EventTimeSessionWindows,
    GeneratorSource,
    Job,
    SlidingEventTimeWindows,
    TumblingEventTimeWindows,
)
from runtime.examples.windowcount import SESSION_GAP_MS  # noqa: E402
from runtime.examples.wordcount import Count  # noqa: E402
from runtime.execution.operators import Chain  # noqa: E402

FAR = 2**62


def chain_for(kind: str) -> Chain:
    job = Job("bench")
    keyed = job.source(GeneratorSource(count=0), parallelism=1,
                       watermarks=BoundedOutOfOrderness(max_delay_ms=0, timestamp=lambda r: r[2])
                       ).key_by(lambda r: r[0])
    if kind == "keyed":
        keyed.process(Count()).sink(DiscardSink())
    elif kind == "tumbling":
        keyed.window(TumblingEventTimeWindows(10_000)).count().sink(DiscardSink())
    elif kind == "session":
        keyed.window(EventTimeSessionWindows(SESSION_GAP_MS)).count().sink(DiscardSink())
    else:
        keyed.window(SlidingEventTimeWindows(60_000, 10_000)).count().sink(DiscardSink())
    chain = Chain(job, [n.id for n in job.nodes[1:]], subtask_index=0, parallelism=1, attempt=0, outputs=[])
    chain.open()
    return chain


def _read(source: GeneratorSource) -> list[Any]:
    elements: list[Any] = []
    while (batch := source.read_batch(512)) is not None:
        elements += [(r[2], r) for r in batch]
    return elements


def run(kind: str, records: int, step: int, sources: int, lag: int = 0,
        watermark_every: int = 0, keys: str = "uniform") -> tuple[float, int]:
    """`sources` > 1: the subtasks of a source of that parallelism (each its own blocks of event time, so one
    runs a block ahead of the other), `step` records of each in turn, as a task reading both channels sees
    them; each subtask's watermark follows its records (10 ms granularity), the task's is their minimum. `lag`:
    every subtask but the first starts that many of its records late (one runs windows behind the other, as
    the cluster's do at Flink's watermark cadence, and a key holds several open windows). `watermark_every`: the
    task's watermark moves only once that many records have passed since it last did (periodic watermarks)."""
    streams = []
    for i in range(sources):
        source = GeneratorSource(count=records, keys=1000, seed=7, distribution=keys)
        source.open(i, sources)
        streams.append(_read(source))
    events: list[tuple[list[Any], int | None]] = []
    marks = [-1] * sources
    watermark = -1
    since = 0  # records since the watermark last moved
    for i in range(0, max(map(len, streams)) + lag, step):
        for j, stream in enumerate(streams):
            at = i - (lag if j else 0)
            part = stream[at:at + step] if at >= 0 else []
            if not part:
                continue
            marks[j] = part[-1][0] // 10 * 10 - 1
            since += len(part)
            low = min(marks)
            advanced = low if low > watermark and since >= watermark_every else None
            if advanced is not None:
                watermark, since = advanced, 0
            events.append((part, advanced))
    chain = chain_for(kind)
    timers = chain.timers
    t0 = time.process_time()
    for part, w in events:
        chain.process_batch(part)
        if w is not None:
            if timers is not None:
                timers.set_watermark(w)
                while timers.fire_event(w, 64):
                    pass
            chain.forward_watermark(w)
    if timers is not None:
        timers.set_watermark(FAR)
        while timers.fire_event(FAR, 64):
            pass
    return time.process_time() - t0, chain.records_out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--step", type=int, default=10, help="records between two watermarks (default 10)")
    parser.add_argument("--jobs", default="keyed,tumbling,sliding")
    parser.add_argument("--sources", type=int, default=1, help="source subtasks interleaved (default 1)")
    parser.add_argument("--lag-records", type=int, default=0,
                        help="records every source subtask but the first starts late (default 0)")
    parser.add_argument("--watermark-every", type=int, default=0,
                        help="records between two moves of the task's watermark (default 0: whenever it can)")
    parser.add_argument("--keys", choices=("uniform", "bursts"), default="uniform",
                        help="the generator's keys (default uniform; bench_windows.py runs bursts)")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each job; the cheapest is printed (default 1)")
    args = parser.parse_args(argv)
    for kind in args.jobs.split(","):
        runs = [run(kind, args.records, args.step, args.sources, args.lag_records, args.watermark_every, args.keys)
                for _ in range(args.repeat)]
        cpu, out = min(runs)
        print(f"{kind:>9}: {cpu * 1e6 / args.records:.2f} CPU us/record ({out:,} rows out; the cheapest of "
              f"{args.repeat})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
