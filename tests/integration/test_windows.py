"""Windows on a real cluster, exact across kill -9 under unaligned checkpoints and backpressure.

A tumbling (and a sliding) event-time count with allowed lateness over out-of-order input, its late records on a
side output with a sink of their own. One source subtask feeds both window subtasks over a hash edge, so each window
subtask has one input channel and the output is a pure function of the input (tests/unit/test_windows.py
window_model computes it from the records and the watermarks the pure generator emits). A worker running a window
subtask is killed with SIGKILL after a checkpoint completed while a slow sink keeps the channels full: the restored
window state, timers and watermark must give the same windows, late firings and late records as a run without
failure.
The batch loop changes accumulators in place between snapshots (copy on write): each checkpoint here is taken while
the windows keep changing, and the restore shows it kept the values at its barrier.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest

from runtime.api import BoundedOutOfOrderness, SlidingEventTimeWindows, TumblingEventTimeWindows
from runtime.api.windows import WindowAssigner
from runtime.connectors.generator import BLOCK, generate_block, key_names
from runtime.execution.watermarks import WatermarkGenerator
from tests.support.cluster import Cluster, write_module
from tests.support.event_time_kill import assert_committed_exactly, run_killed
from tests.support.models import jittered, window_model

pytestmark = pytest.mark.integration

WORDS, KEYS, SEED = 30_000, 40, 5
MAX_DELAY_MS, GRANULARITY_MS, WINDOW_MS, LATENESS_MS = 150, 10, 500, 100

JOB = '''
from runtime.api import (LATE_DATA, BoundedOutOfOrderness, FileSink, GeneratorSource, Job, SlidingEventTimeWindows,
                         TumblingEventTimeWindows)

WORDS, KEYS, SEED = {words}, {keys}, {seed}


def jittered(record):
    return record[2] + (record[1] * 7919) % 400  # out of order by up to 400 ms, deterministically


def build(job: Job) -> None:
    watermarks = BoundedOutOfOrderness(max_delay_ms={delay}, timestamp=jittered, granularity_ms={granularity})
    counts = (job.source(GeneratorSource(count=WORDS, keys=KEYS, seed=SEED), parallelism=1, watermarks=watermarks)
              .key_by(lambda r: r[0])
              .window({assigner}, allowed_lateness_ms={lateness})
              .count(parallelism=2))
    counts.sink(FileSink({out!r}, delay_per_record_s={sink_delay}), parallelism=2)
    counts.side_output(LATE_DATA).sink(FileSink({late!r}), parallelism=1, name="late-sink")
'''


ASSIGNERS: dict[str, WindowAssigner] = {
    "tumbling": TumblingEventTimeWindows(WINDOW_MS), "sliding": SlidingEventTimeWindows(WINDOW_MS, WINDOW_MS // 2)}


def expected_windows(assigner: WindowAssigner) -> tuple[Counter[str], Counter[str]]:
    gen = WatermarkGenerator(BoundedOutOfOrderness(MAX_DELAY_MS, jittered, granularity_ms=GRANULARITY_MS))
    names = key_names(KEYS)
    events: list[tuple[Any, ...]] = []
    for block in range(-(-WORDS // BLOCK)):
        for record in generate_block(block, seed=SEED, keys=names, cum_weights=None, count=WORDS):
            ts = jittered(record)
            events.append(("r", record[0], ts, list(record)))
            w = gen.on_timestamp(ts)
            if w is not None:
                events.append(("w", w))
    rows, late = window_model(events, assigner, LATENESS_MS)
    if isinstance(assigner, TumblingEventTimeWindows):  # a sliding window's newest window outlasts the delays here
        assert len(late) > WORDS // 50, "the input must have late records for the test to mean anything"
    assert sum(rows.values()) > len({r[:3] for r in rows}), "and late firings"

    def line(value: Any) -> str:
        return json.dumps(value, separators=(",", ":"))

    return (Counter({line(list(r)): n for r, n in rows.items()}), Counter(line(r) for r in late))


@pytest.mark.parametrize("kind", sorted(ASSIGNERS))
def test_windows_late_firings_and_late_records_are_exact_across_kill_9(cluster: Cluster, kind: str) -> None:
    assigner = ASSIGNERS[kind]
    out, late = cluster.tmp_path / "out", cluster.tmp_path / "late"
    write_module(cluster.tmp_path, "winjob", JOB.format(
        out=str(out), late=str(late), words=WORDS, keys=KEYS, seed=SEED, delay=MAX_DELAY_MS,
        granularity=GRANULARITY_MS, assigner=repr(assigner), lateness=LATENESS_MS, sink_delay=0.002))
    expected_rows, expected_late = expected_windows(assigner)

    def checkpointed_with_inflight_data(job_id: str, st: dict[str, Any]) -> bool:
        history = cluster.call("checkpoints", {"job_id": job_id})["history"]
        return any(h["status"] == "COMPLETED" and h["inflight_bytes"] > 0 for h in history)

    run_killed(cluster, "winjob:build", 4 * 1024, checkpointed_with_inflight_data, "window-count",
               what="a completed checkpoint holding in-flight data", timeout_s=300)
    assert_committed_exactly({"window rows": (out, expected_rows), "late records": (late, expected_late)})
