"""Event time on a real cluster, exact across kill -9 under unaligned checkpoints and backpressure.

The job drops records at or behind `ctx.current_watermark` (counting them per key), emits the others, and
registers an event-time timer at the end of each record's second; `on_timer` emits the key's late count so
far. Its output therefore depends on exactly which watermark each record and each timer saw. One source
subtask feeds both keyed subtasks over a hash edge, so each keyed subtask has one input channel and the
result is a pure function of the input: the test computes it with the pure watermark generator and compares
the committed output exactly. A worker running a keyed subtask is killed with SIGKILL after a checkpoint has
completed, while its input channels hold in-flight data (a slow sink keeps them full): restored, the task's
watermark must be back before that data is replayed, or replayed records would be judged against the
watermark of the start of the job.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest

from runtime.api.time import MAX_WATERMARK, MIN_WATERMARK, BoundedOutOfOrderness
from runtime.connectors.generator import BLOCK, generate_block, key_names
from runtime.execution.watermarks import WatermarkGenerator
from tests.support.cluster import Cluster, committed_rows, logs, poll, write_module
from tests.support.event_time_kill import assert_committed_exactly, run_killed
from tests.support.failover import WORKER_ARGS
from tests.support.models import jittered

pytestmark = pytest.mark.integration

WORDS, KEYS, SEED = 30_000, 50, 11
MAX_DELAY_MS, GRANULARITY_MS = 150, 10

JOB = '''
from runtime.api import BoundedOutOfOrderness, FileSink, GeneratorSource, Job, KeyedProcessFunction

OUT = {out!r}
WORDS, KEYS, SEED = {words}, {keys}, {seed}


def jittered(record):
    # out of order by up to 400 ms, deterministically
    return record[2] + (record[1] * 7919) % 400


class DropLate(KeyedProcessFunction):
    def process(self, record, ctx):
        if ctx.timestamp <= ctx.current_watermark:
            late = ctx.value_state("late", 0)
            late.update(late.value() + 1)
            return
        ctx.emit(["kept", record[0], record[1]])
        ctx.timers.register_event_time(ctx.timestamp // 1000 * 1000 + 999)

    def on_timer(self, timestamp, ctx):
        ctx.emit(["timer", ctx.current_key, timestamp, ctx.value_state("late", 0).value()])


def build(job: Job) -> None:
    watermarks = BoundedOutOfOrderness(max_delay_ms={delay}, timestamp=jittered, granularity_ms={granularity})
    (job.source(GeneratorSource(count=WORDS, keys=KEYS, seed=SEED), parallelism=1, watermarks=watermarks)
        .key_by(lambda r: r[0])
        .process(DropLate(), parallelism=2)
        .sink(FileSink(OUT, delay_per_record_s={sink_delay})))
'''


def expected_output(words: int) -> Counter[str]:
    """What DropLate commits without failures, from the records in source order (one source subtask)."""
    gen = WatermarkGenerator(BoundedOutOfOrderness(MAX_DELAY_MS, jittered, granularity_ms=GRANULARITY_MS))
    names = key_names(KEYS)
    watermark = MIN_WATERMARK
    timers: set[tuple[int, str]] = set()
    late: Counter[str] = Counter()
    out: list[Any] = []

    def fire(upto: int) -> None:
        for ts, key in sorted(t for t in timers if t[0] <= upto):
            out.append(["timer", key, ts, late[key]])
            timers.discard((ts, key))

    for block in range(-(-words // BLOCK)):
        for record in generate_block(block, seed=SEED, keys=names, cum_weights=None, count=words):
            ts = jittered(record)
            if ts <= watermark:
                late[record[0]] += 1
            else:
                out.append(["kept", record[0], record[1]])
                timers.add((ts // 1000 * 1000 + 999, record[0]))
            w = gen.on_timestamp(ts)
            if w is not None:
                watermark = w
                fire(w)
    fire(MAX_WATERMARK)
    assert sum(late.values()) > words // 20, "the input must have late records for the test to mean anything"
    return Counter(json.dumps(row, separators=(",", ":")) for row in out)


def test_watermarks_and_timers_are_exact_across_kill_9_with_unaligned_checkpoints(cluster: Cluster) -> None:
    out = cluster.tmp_path / "out"
    write_module(cluster.tmp_path, "etjob", JOB.format(out=str(out), words=WORDS, keys=KEYS, seed=SEED,
                                                       delay=MAX_DELAY_MS, granularity=GRANULARITY_MS,
                                                       sink_delay=0.0002))
    expected = expected_output(WORDS)
    run_killed(cluster, "etjob:build", 8 * 1024, lambda _, st: st["last_checkpoint"] is not None, "DropLate",
               what="a completed checkpoint")
    assert_committed_exactly({"rows": (out, expected)})


# -- a timer storm: the mailbox is served between timers, and a checkpoint can be taken in the middle --------

STORM_JOB = '''
import json
import os
import signal
import time

from runtime.api import BoundedOutOfOrderness, FileSink, GeneratorSource, Job, KeyedProcessFunction

OUT, MARKERS = {out!r}, {markers!r}
TIMERS, AFTER = {timers}, {after}
FIRE_AT = 1_700_000_000_000 + TIMERS + 10  # the watermark passes it a few records after the last registration
FIRED = [0]
FIRED_AT_SNAPSHOT = {{}}


def once(name, content):
    try:
        fd = os.open(os.path.join(MARKERS, name), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as f:
        f.write(content)
    return True


class Storm(KeyedProcessFunction):
    """Every one of the first TIMERS records (each its own key) sets a timer at FIRE_AT: all due at once."""

    def process(self, record, ctx):
        if record[1] < TIMERS:
            ctx.timers.register_event_time(FIRE_AT)
        else:
            ctx.emit(["r", record[1]])

    def on_timer(self, timestamp, ctx):
        FIRED[0] += 1
        end = time.perf_counter() + 0.00005  # a little work per timer, so that the storm lasts
        while time.perf_counter() < end:
            pass
        ctx.emit(["t", ctx.current_key, timestamp])


class KillAfterMidStormCheckpoint(FileSink):
    """Kills its worker (first attempt only) when a checkpoint whose snapshot was taken in the middle of the
    storm completes: that checkpoint holds some timers fired (their output pre-committed) and the rest not."""

    def snapshot_state(self, checkpoint_id):
        FIRED_AT_SNAPSHOT[checkpoint_id] = FIRED[0]
        return super().snapshot_state(checkpoint_id)

    def commit(self, checkpoint_id):
        fired = FIRED_AT_SNAPSHOT.get(checkpoint_id, 0)
        if self.attempt == 0 and 0 < fired < TIMERS and once("killed", json.dumps([checkpoint_id, fired])):
            os.kill(os.getpid(), signal.SIGKILL)
        super().commit(checkpoint_id)


def build(job: Job) -> None:
    watermarks = BoundedOutOfOrderness(max_delay_ms=0, timestamp=lambda r: r[2], granularity_ms=1)
    # throttled, so that the source is still running (and checkpoint barriers flowing) during the storm
    source = GeneratorSource(count=TIMERS + AFTER, keys=10, seed=1, records_per_second=20_000)
    (job.source(source, parallelism=1, watermarks=watermarks)
        .key_by(lambda r: r[1])
        .process(Storm(), parallelism=1)
        .sink(KillAfterMidStormCheckpoint(OUT)))
'''


def test_a_checkpoint_is_taken_in_the_middle_of_a_timer_storm_and_the_rest_fire_after_restore(
        cluster: Cluster) -> None:
    timers, after = 20_000, 40_000
    out, markers = cluster.tmp_path / "out", cluster.tmp_path / "markers"
    markers.mkdir()
    write_module(cluster.tmp_path, "stormjob", STORM_JOB.format(out=str(out), markers=str(markers),
                                                                timers=timers, after=after))
    cluster.start(2, worker_args=WORKER_ARGS, worker_ids=True)
    job_id = cluster.submit("stormjob:build", {
        "checkpoint": {"interval_s": 0.2, "mode": "unaligned", "timeout_s": 20, "tolerable_failures": 3},
        "restart": {"kind": "fixed", "max_attempts": 3, "delay_s": 0.5, "slot_wait_s": 60}})
    poll(lambda: (markers / "killed").exists()
         or cluster.call("status", {"job_id": job_id})["state"] in ("FINISHED", "FAILED"), 120,
         "the kill after a checkpoint taken mid-storm")
    assert (markers / "killed").exists(), f"no checkpoint completed in the middle of the storm\n{logs(cluster)}"
    checkpoint_id, fired = json.loads((markers / "killed").read_text())
    assert 0 < fired < timers
    for w in cluster.workers:
        if w.proc.poll() is not None:
            cluster.start_worker("--heartbeat-interval", "0.25s", worker_id=str(w.fields["id"]))
            break
    st = cluster.wait_job(job_id, 240)
    assert st["state"] == "FINISHED", f"{st}\n{logs(cluster)}"
    assert st["restarts"] == 1, st
    poll(lambda: not committed_rows(out)[1], 15, "the final commit (no in-progress files left)")
    rows, _ = committed_rows(out)
    fire_at = 1_700_000_000_000 + timers + 10
    expected = Counter([json.dumps(["t", k, fire_at], separators=(",", ":")) for k in range(timers)]
                       + [json.dumps(["r", s], separators=(",", ":")) for s in range(timers, timers + after)])
    missing, extra = expected - rows, rows - expected
    assert not missing and not extra, (f"checkpoint {checkpoint_id} taken after {fired} timers: "
                                       f"{sum(missing.values())} rows missing, e.g. {list(missing)[:5]}; "
                                       f"{sum(extra.values())} extra, e.g. {list(extra)[:5]}")


# -- idleness: a source subtask without records does not hold the watermark back ------------------------------

IDLE_JOB = '''
import os

from runtime.api import BoundedOutOfOrderness, DiscardSink, Job, KeyedProcessFunction, Source

MARKERS = {markers!r}


class OneSidedSource(Source):
    """Subtask 0 emits 200 records (timestamps 0, 10, .., 1990); subtask 1 none. Both end once the test
    creates the file "release"."""

    def open(self, subtask_index, parallelism):
        super().open(subtask_index, parallelism)
        self.n = 0

    def read_batch(self, max_records):
        if self.subtask_index == 0 and self.n < 200:
            batch = [("k", i, i * 10) for i in range(self.n, min(200, self.n + max_records))]
            self.n += len(batch)
            return batch
        return None if os.path.exists(os.path.join(MARKERS, "release")) else []

    def position(self):
        return self.n

    def restore(self, position):
        self.n = position


class FireAt1000(KeyedProcessFunction):
    def process(self, record, ctx):
        ctx.timers.register_event_time(1000)

    def on_timer(self, timestamp, ctx):
        with open(os.path.join(MARKERS, "fired"), "w") as f:
            f.write(str(ctx.current_watermark))


def build(job: Job) -> None:
    watermarks = BoundedOutOfOrderness(max_delay_ms=0, timestamp=lambda r: r[2], idle_timeout_ms=300)
    (job.source(OneSidedSource(), parallelism=2, watermarks=watermarks)
        .key_by(lambda r: r[0])
        .process(FireAt1000(), parallelism=1)
        .sink(DiscardSink()))
'''


def test_an_idle_source_subtask_does_not_hold_event_time_timers_back(running_cluster: Cluster) -> None:
    cluster = running_cluster
    markers = cluster.tmp_path / "markers"
    markers.mkdir()
    write_module(cluster.tmp_path, "idlejob", IDLE_JOB.format(markers=str(markers)))
    job_id = cluster.submit("idlejob:build")
    # subtask 1 never sends a record (nor, until the release, its end): only its idleness lets the watermark
    # of subtask 0 through, so the timer fires while the job still runs
    poll(lambda: (markers / "fired").exists(), 60, "the event-time timer to fire while a source subtask idles")
    assert cluster.call("status", {"job_id": job_id})["state"] == "RUNNING"
    assert int((markers / "fired").read_text()) == 1989  # subtask 0's watermark: 1990 - 0 - 1
    (markers / "release").write_text("")
    st = cluster.wait_job(job_id, 60)
    assert st["state"] == "FINISHED", f"{st}\n{logs(cluster)}"
    assert all(t["current_watermark"] == MAX_WATERMARK for t in st["tasks"]), st["tasks"]
    # records_in counts the 200 records only; the watermarks and idle/active markers have their own count
    keyed = [t for t in st["tasks"] if t["name"].startswith("FireAt1000")]
    assert sum(t["records_in"] for t in keyed) == 200, keyed
    assert sum(t["watermarks_in"] for t in keyed) > 0, keyed
