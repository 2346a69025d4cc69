"""The rescale tests' job (`runningjobs`: a keyed count into a slow file sink, long enough to be rescaled while it
runs), its unaligned checkpoint configuration, and `sluice rescale` with what it must print and leave."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from runtime.graph.enums import JobState
from tests.support.checkpoints import history_entry
from tests.support.cluster import Cluster, logs, poll, sluice, write_module
from tests.support.releasable_sink import RELEASABLE_SINK, release_path

JOBS = """
from runtime.api import FileSink, GeneratorSource, Job
from runtime.examples.wordcount import Count

RELEASE = {release!r}
""" + RELEASABLE_SINK + """

def wordcount(job: Job) -> None:
    (job.source(GeneratorSource(count={words}, keys={keys}, seed={seed}), parallelism=2)
        .key_by(lambda r: r[0])
        .process(Count(), parallelism=2)
        .sink(ReleasableSink({out!r}, delay_per_record_s=0.0002)))
"""
WORDS, KEYS, SEED = 300_000, 200, 13  # long enough that no source subtask finishes before the last rescale
ONE_RESCALE_WORDS = 200_000  # a test that rescales once, early, ends sooner
CHANNELS = {"buffer_bytes": 32 * 1024, "buffers_per_channel": 4, "inflight_target_s": 0}
CONFIG = {"checkpoint": {"interval_s": 0.5, "mode": "unaligned", "timeout_s": 30.0, "min_pause_s": 0,
                         "tolerable_failures": 3, "retain": 3}, **CHANNELS}


def submit(cluster: Cluster, config: dict[str, Any] = CONFIG, words: int = WORDS) -> tuple[str, Path]:
    out = cluster.tmp_path / "out"
    write_module(cluster.tmp_path, "runningjobs", JOBS.format(out=str(out), words=words, keys=KEYS, seed=SEED,
                                                              release=release_path(cluster)))
    result = cluster.call("submit", {"entry": "runningjobs:wordcount", "name": "wordcount", "config": config,
                                     "sys_path": str(cluster.tmp_path)})
    return str(result["job_id"]), out


def wait_backpressured(cluster: Cluster, job_id: str, tasks: int) -> None:
    def running() -> bool:
        st = cluster.call("status", {"job_id": job_id})
        assert st["state"] in (JobState.DEPLOYING, JobState.RESTARTING, JobState.RUNNING), (st, logs(cluster))
        return st["state"] == JobState.RUNNING and len(st["tasks"]) == tasks

    poll(running, 60, f"job {job_id} to run its {tasks} tasks")
    poll(lambda: sum(t["backpressured_s"] for t in cluster.call("status", {"job_id": job_id})["tasks"]) >= 0.5,
         60, f"job {job_id} to be backpressured")


def rescale(cluster: Cluster, job_id: str, parallelism: int) -> float:
    """`sluice rescale` to `parallelism`; checks what it printed and that the checkpoint it used had data in
    flight; returns the downtime it printed."""
    before = cluster.call("status", {"job_id": job_id})["attempt"]
    proc = sluice(cluster, "rescale", job_id, "--parallelism", str(parallelism))
    assert proc.returncode == 0, (proc.stdout, proc.stderr, logs(cluster))
    m = re.search(r"rescaled to (.*) \(attempt (\d+)\) from checkpoint (\d+).*downtime ([\d.]+)s", proc.stdout)
    assert m is not None, proc.stdout
    assert m.group(1) == f"GeneratorSource={parallelism}, Count -> FileSink={parallelism}", proc.stdout
    assert int(m.group(2)) == before + 1, (proc.stdout, before)
    used = history_entry(cluster, job_id, int(m.group(3)))
    assert used["status"] == "COMPLETED" and used["mode"] == "unaligned" and used["inflight_bytes"] > 0, used
    st = cluster.call("status", {"job_id": job_id})
    assert st["state"] == JobState.RUNNING and st["attempt"] == before + 1, st
    assert [v["parallelism"] for v in st["vertices"]] == [parallelism, parallelism], st
    assert st["restored_checkpoint_id"] == int(m.group(3)) and st["restarts"] == 0, st  # no failure counted
    shown = sluice(cluster, "status", job_id)
    assert re.search(rf"Count -> FileSink\s+parallelism {parallelism}", shown.stdout), shown.stdout
    return float(m.group(4))
