"""Restoring at another parallelism on a real cluster: a backpressured keyed count takes an unaligned
checkpoint with data in flight, stops, is restored at parallelism 3 (keyed state split by key group, channel
state sent to the owners of its keys, generator blocks dealt out again, pending part files committed once),
takes another unaligned checkpoint with data in flight, stops, and is restored from that one at parallelism 1.
The committed output is exact: every key's counts 1..N, each once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from netstack.errors import RpcError
from tests.integration.conftest import (
    Cluster,
    assert_running_counts,
    committed_output,
    generator_counts,
    poll,
    write_module,
)
from tests.integration.test_checkpoints import cancel, checkpoint_config, history_entry, logs, read_metadata

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
    poll(lambda: sum(t["backpressured_s"] for t in cluster.call("status", {"job_id": job_id})["tasks"]) >= 0.5,
         60, f"job {job_id} to be backpressured")


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
@pytest.mark.parametrize("entry,expected", [("rescalejobs:ticks", "source Ticks"),
                                            ("rescalejobs:fanout", "broadcast edge GeneratorSource -> map")])
def test_what_cannot_be_rescaled_yet_is_refused_naming_it(running_cluster: Cluster, entry: str,
                                                          expected: str) -> None:
    cluster = running_cluster
    install_jobs(cluster)
    config = checkpoint_config("unaligned", timeout_s=30.0)
    job_id = submit(cluster, config, entry=entry)
    poll(lambda: cluster.call("status", {"job_id": job_id})["state"] == "RUNNING", 60, f"job {job_id} to run")
    result = cluster.call("checkpoint", {"job_id": job_id})
    assert result["status"] == "COMPLETED", (result, logs(cluster))
    cancel(cluster, job_id)
    with pytest.raises(RpcError) as err:
        submit(cluster, config, restore=result["path"], parallelism=3, entry=entry)
    assert expected in str(err.value) and "\n" not in str(err.value), err.value
    # the same checkpoint at its own parallelism still restores
    again = submit(cluster, config, restore=result["path"], entry=entry)
    poll(lambda: cluster.call("status", {"job_id": again})["state"] == "RUNNING", 60, f"job {again} to run")
    cancel(cluster, again)
