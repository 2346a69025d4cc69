"""The checkpoint tests' job module (`cpjobs`: an endless backpressured count, a throttled one, a bounded word
count into a slow file sink), their checkpoint configuration, and reading the checkpoints a job left."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from tests.support.cluster import Cluster, generator_counts, poll, write_module
from tests.support.releasable_sink import RELEASABLE_SINK, release_path

# Count is chained with its sink. The slow sink costs 200 us a record: ~5k records/s per subtask, against a
# source that makes several hundred thousand a second when unhindered. What sits in front of one Count
# subtask (two sender queues of 4 buffers plus its input credits, ~20 buffers of ~1600 records) needs
# several seconds to drain, so an in-band barrier waits behind it that long.
JOBS = '''
from runtime.api import DiscardSink, FileSink, GeneratorSource, Job, KeyedProcessFunction

OUT = {out!r}
WORDS = {words}
KEYS = {keys}
SEED = {seed}


from runtime.examples.wordcount import Count  # the README's keyed word count

RELEASE = {release!r}
''' + RELEASABLE_SINK + '''


def slow(job: Job) -> None:
    (job.source(GeneratorSource(count=None, keys=1000, seed=3), parallelism=2)
        .key_by(lambda r: r[0])
        .process(Count(), parallelism=2)
        .sink(DiscardSink(delay_per_record_s=0.0002)))


def fast(job: Job) -> None:
    (job.source(GeneratorSource(count=None, keys=1000, seed=3, records_per_second=2000), parallelism=2)
        .key_by(lambda r: r[0])
        .process(Count(), parallelism=2)
        .sink(DiscardSink()))


def steady_files(job: Job) -> None:
    # unbounded and throttled: only the checkpoints asked for publish its files (no source ever finishes)
    (job.source(GeneratorSource(count=None, keys=KEYS, seed=SEED, records_per_second=2000), parallelism=2)
        .key_by(lambda r: r[0])
        .process(Count(), parallelism=2)
        .sink(FileSink(OUT)))


def wordcount(job: Job) -> None:
    (job.source(GeneratorSource(count=WORDS, keys=KEYS, seed=SEED), parallelism=2)
        .key_by(lambda r: r[0])
        .process(Count(), parallelism=2)
        .sink(ReleasableSink(OUT, delay_per_record_s=0.0002)))
'''

# Fixed-size buffers (no in-flight bound): these tests need an aligned barrier to wait seconds behind the
# queued data; test_aligned_inflight.py checks the bound that shortens that wait.
CHANNELS = {"buffer_bytes": 32 * 1024, "buffers_per_channel": 4, "inflight_target_s": 0}
WORDS, KEYS, SEED = 100_000, 200, 7


def checkpoint_config(mode: str, **overrides: Any) -> dict[str, Any]:
    cp = {"interval_s": None, "mode": mode, "timeout_s": 60.0, "min_pause_s": 0, "tolerable_failures": 3,
          "retain": 3}
    if mode == "aligned_timeout":
        cp["aligned_timeout_s"] = 0.1
    cp.update(overrides)
    return {"checkpoint": cp, **CHANNELS}


def install_jobs(cluster: Cluster) -> Path:
    out = cluster.tmp_path / "out"
    write_module(cluster.tmp_path, "cpjobs",
                 JOBS.format(out=str(out), words=WORDS, keys=KEYS, seed=SEED, release=release_path(cluster)))
    return out


def submit(cluster: Cluster, entry: str, config: dict[str, Any], restore: str | None = None) -> str:
    args: dict[str, Any] = {"entry": entry, "config": config, "sys_path": str(cluster.tmp_path)}
    if restore is not None:
        args["restore"] = restore
    return str(cluster.call("submit", args)["job_id"])


def start_backpressured(cluster: Cluster, entry: str, config: dict[str, Any], *, blocked_s: float = 1.0) -> str:
    """Submit, wait until every task reports, then until the queues are full: the job's tasks have spent
    `blocked_s` backpressured between them."""
    job_id = submit(cluster, entry, config)
    wait_running(cluster, job_id)
    poll(lambda: sum(t["backpressured_s"] for t in cluster.call("status", {"job_id": job_id})["tasks"]) >= blocked_s,
         60, f"job {job_id} to be backpressured for {blocked_s}s")
    return job_id


def wait_flowing(cluster: Cluster, job_id: str) -> None:
    """Until every task of the job has taken in or emitted records."""
    poll(lambda: all(t["records_in"] + t["records_out"] > 0
                     for t in cluster.call("status", {"job_id": job_id})["tasks"]), 60, f"job {job_id} to flow")


def wait_running(cluster: Cluster, job_id: str) -> None:
    def running() -> bool:
        st = cluster.call("status", {"job_id": job_id})
        assert st["state"] in ("DEPLOYING", "CREATED", "RUNNING"), st
        return st["state"] == "RUNNING" and len(st["tasks"]) == 4

    poll(running, 60, f"job {job_id} to run with task statistics")


def history_entry(cluster: Cluster, job_id: str, checkpoint_id: int) -> dict[str, Any]:
    history = cluster.call("checkpoints", {"job_id": job_id})["history"]
    found = [h for h in history if h["checkpoint_id"] == checkpoint_id]
    assert len(found) == 1, history
    return found[0]


def checkpoint_dir(cluster: Cluster, job_id: str, checkpoint_id: int) -> Path:
    return cluster.tmp_path / "state" / "checkpoints" / job_id / f"chk-{checkpoint_id}"


def read_metadata(path: str | Path) -> dict[str, Any]:
    return json.loads((Path(path) / "_metadata").read_text())


def cancel(cluster: Cluster, job_id: str) -> None:
    assert cluster.call("cancel", {"job_id": job_id})["state"] == "CANCELLED"


def expected_counts() -> Counter[str]:
    return generator_counts(WORDS, KEYS, SEED)


def checkpoint_metadata(cluster: Cluster, job_id: str) -> list[dict[str, Any]]:
    """The `_metadata` of every complete checkpoint of the job in the cluster's state directory, oldest first."""
    job_dir = cluster.tmp_path / "state" / "checkpoints" / job_id
    return [json.loads((d / "_metadata").read_text()) for d in sorted(job_dir.glob("chk-*"))
            if (d / "_metadata").exists()]


def backend_handles(metadata: dict[str, Any]) -> list[dict[str, Any]]:
    """The state backend handles the tasks acknowledged in one checkpoint's metadata."""
    return [ack["state"]["backend"] for ack in metadata["acks"].values() if (ack.get("state") or {}).get("backend")]


def taken_while_running(retained: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The checkpoints no task acknowledged as finished: a bounded job's last checkpoints (FLIP-147) hold no
    state of the tasks that had ended, so per-task state assertions read only the others."""
    return [m for m in retained if not any((a.get("state") or {}).get("finished") for a in m["acks"].values())]
