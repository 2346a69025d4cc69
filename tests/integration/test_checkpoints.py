"""Checkpoints on a real cluster: aligned barriers stall behind backpressure and time out, unaligned ones
overtake the queued data and persist it, aligned_timeout switches only when it has to, a restore from a
checkpoint taken under backpressure (with in-flight data) reproduces the exact output, aborted and incomplete
checkpoints leave nothing usable behind, and savepoints are self-contained."""

from __future__ import annotations

import json
import shutil
import time
from collections import Counter
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


def wordcount(job: Job) -> None:
    (job.source(GeneratorSource(count=WORDS, keys=KEYS, seed=SEED), parallelism=2)
        .key_by(lambda r: r[0])
        .process(Count(), parallelism=2)
        .sink(FileSink(OUT, delay_per_record_s=0.0002)))
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
                 JOBS.format(out=str(out), words=WORDS, keys=KEYS, seed=SEED))
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


def logs(cluster: Cluster) -> str:
    return "\n".join(f"--- {n}\n{cluster.log(n)[-3000:]}" for n in ("coordinator", "worker-1", "worker-2"))


def expected_counts() -> Counter[str]:
    return generator_counts(WORDS, KEYS, SEED)


# -- 1: aligned vs unaligned under backpressure --------------------------------------------------------------


@pytest.mark.integration
def test_aligned_times_out_under_backpressure_unaligned_completes_fast(running_cluster: Cluster) -> None:
    cluster = running_cluster
    install_jobs(cluster)

    aligned = start_backpressured(cluster, "cpjobs:slow", checkpoint_config("aligned", timeout_s=3.0))
    t0 = time.monotonic()
    result = cluster.call("checkpoint", {"job_id": aligned})
    waited = time.monotonic() - t0
    assert result["status"] == "ABORTED", (result, logs(cluster))
    assert "timeout" in result["reason"], result
    assert 2.5 < waited < 10, waited  # it was the 3 s timeout that ended it, not something else
    entry = history_entry(cluster, aligned, result["checkpoint_id"])
    assert entry["status"] == "FAILED" and "timeout" in entry["failure_reason"], entry
    status = cluster.call("status", {"job_id": aligned})
    assert status["state"] == "RUNNING", status  # one failure is tolerated
    assert status["checkpoints_failed"] == 1 and status["checkpoints_completed"] == 0, status
    cancel(cluster, aligned)

    unaligned = start_backpressured(cluster, "cpjobs:slow", checkpoint_config("unaligned", timeout_s=3.0))
    for _ in range(2):  # a second one, right after, behaves the same
        result = cluster.call("checkpoint", {"job_id": unaligned})
        assert result["status"] == "COMPLETED", (result, logs(cluster))
        entry = history_entry(cluster, unaligned, result["checkpoint_id"])
        assert entry["status"] == "COMPLETED" and entry["mode"] == "unaligned", entry
        assert entry["duration_s"] < 1.5, entry
        assert entry["inflight_bytes"] > 0, entry
        meta = read_metadata(result["path"])
        assert meta["checkpoint_id"] == result["checkpoint_id"] and meta["mode"] == "unaligned", meta
        assert len(meta["acks"]) == 4, meta["acks"].keys()
        figures = [a["figures"] for a in meta["acks"].values()]
        assert sum(f["inflight_bytes"] for f in figures) == entry["inflight_bytes"], figures
        assert all(f["unaligned"] for f in figures), figures
        # the persisted in-flight data is really there: channel-state files beside the state files
        files = {name for a in meta["acks"].values() for kind, name in a["state"].items() if kind != "checksums"}
        assert any(name.endswith((".in", ".out")) for name in files), files
        for name in files:
            assert (Path(result["path"]) / name).is_file(), name
    status = cluster.call("status", {"job_id": unaligned})
    assert status["state"] == "RUNNING" and status["checkpoints_completed"] == 2, status
    assert status["last_checkpoint"]["checkpoint_id"] == result["checkpoint_id"], status
    cancel(cluster, unaligned)


# -- 2: aligned_timeout switches only under backpressure ------------------------------------------------------


@pytest.mark.integration
def test_aligned_timeout_switches_to_unaligned_only_when_it_has_to(running_cluster: Cluster) -> None:
    cluster = running_cluster
    install_jobs(cluster)

    slow = start_backpressured(cluster, "cpjobs:slow", checkpoint_config("aligned_timeout", timeout_s=3.0))
    result = cluster.call("checkpoint", {"job_id": slow})
    assert result["status"] == "COMPLETED", (result, logs(cluster))
    entry = history_entry(cluster, slow, result["checkpoint_id"])
    assert entry["mode"] == "aligned_timeout" and entry["duration_s"] < 2.0, entry
    assert entry["inflight_bytes"] > 0, entry
    figures = [a["figures"] for a in read_metadata(result["path"])["acks"].values()]
    assert any(f["unaligned"] for f in figures), figures
    assert sum(f["inflight_bytes"] for f in figures) == entry["inflight_bytes"], figures
    cancel(cluster, slow)

    fast = submit(cluster, "cpjobs:fast", checkpoint_config("aligned_timeout", timeout_s=10.0))
    wait_running(cluster, fast)
    wait_flowing(cluster, fast)
    for _ in range(3):
        result = cluster.call("checkpoint", {"job_id": fast})
        assert result["status"] == "COMPLETED", (result, logs(cluster))
        entry = history_entry(cluster, fast, result["checkpoint_id"])
        assert entry["inflight_bytes"] == 0, entry
        assert entry["duration_s"] < 2.0, entry
        figures = [a["figures"] for a in read_metadata(result["path"])["acks"].values()]
        assert len(figures) == 4, figures
        assert not any(f["unaligned"] for f in figures), figures
        assert all(f["inflight_bytes"] == 0 for f in figures), figures
    cancel(cluster, fast)


# -- 3: restore from a checkpoint taken under backpressure, with in-flight data, is exact ------------------------


@pytest.mark.integration
@pytest.mark.parametrize("mode", ["unaligned", "aligned_timeout"])
def test_restore_from_checkpoint_with_inflight_data_gives_exact_output(running_cluster: Cluster, mode: str) -> None:
    cluster = running_cluster
    out = install_jobs(cluster)
    expected = expected_counts()
    config = checkpoint_config(mode, timeout_s=30.0)

    first = start_backpressured(cluster, "cpjobs:wordcount", config, blocked_s=0.5)
    result = cluster.call("checkpoint", {"job_id": first})
    assert result["status"] == "COMPLETED", (result, logs(cluster))
    entry = history_entry(cluster, first, result["checkpoint_id"])
    assert entry["inflight_bytes"] > 0, entry  # it was taken under backpressure, with data in flight

    # the sinks commit what they pre-committed for it once it completes
    poll(lambda: committed_output(out)[0], 15, "the completed checkpoint's part files to be committed")
    status = cluster.call("status", {"job_id": first})
    assert status["state"] == "RUNNING", status  # the input is not used up yet
    cancel(cluster, first)
    before, _ = committed_output(out)
    committed_before = sum(len(v) for v in before.values())
    assert 0 < committed_before < WORDS, committed_before

    second = submit(cluster, "cpjobs:wordcount", config, restore=result["path"])
    final = cluster.wait_job(second, timeout_s=120)
    assert final["state"] == "FINISHED", (final, logs(cluster))
    assert final["restored_from"] == result["path"], final

    assert_running_counts(out, expected)


# -- 4: aborted and incomplete checkpoints leave nothing usable ---------------------------------------------------


@pytest.mark.integration
def test_aborted_checkpoint_is_deleted_and_incomplete_one_is_ignored(running_cluster: Cluster) -> None:
    cluster = running_cluster
    install_jobs(cluster)

    job_id = start_backpressured(cluster, "cpjobs:slow", checkpoint_config("aligned", timeout_s=1.0))
    triggered = time.monotonic()
    result = cluster.call("checkpoint", {"job_id": job_id})
    assert result["status"] == "ABORTED" and "timeout" in result["reason"], result
    aborted = checkpoint_dir(cluster, job_id, result["checkpoint_id"])
    poll(lambda: not aborted.exists(), 15, f"{aborted} to be deleted")
    # the aborted checkpoint's barriers are still queued behind data (several seconds of it); once they have
    # drained, still nothing of it comes back
    ok = cluster.call("checkpoint", {"job_id": job_id, "mode": "unaligned"})
    assert ok["status"] == "COMPLETED", (ok, logs(cluster))
    time.sleep(max(0.0, triggered + 8.0 - time.monotonic()))
    assert not aborted.exists(), sorted(p.name for p in aborted.iterdir())
    retained = cluster.call("checkpoints", {"job_id": job_id})["retained"]
    assert [r["checkpoint_id"] for r in retained] == [ok["checkpoint_id"]], retained

    # a chk directory without _metadata (what a crash mid-checkpoint leaves) is not a checkpoint
    junk = checkpoint_dir(cluster, job_id, 999)
    junk.mkdir(parents=True)
    (junk / "0-0.state").write_bytes(b"\x00garbage")
    (junk / "_metadata.tmp").write_text("{")
    retained = cluster.call("checkpoints", {"job_id": job_id})["retained"]
    assert 999 not in [r["checkpoint_id"] for r in retained], retained
    cancel(cluster, job_id)

    with pytest.raises(RpcError) as err:
        submit(cluster, "cpjobs:slow", checkpoint_config("aligned"), restore=str(junk))
    assert str(junk) in str(err.value) and "not a completed checkpoint" in str(err.value), err.value
    # the coordinator keeps serving, and the good checkpoint still restores
    assert len(cluster.call("status")["workers"]) == 2
    restored = submit(cluster, "cpjobs:slow", checkpoint_config("aligned"), restore=ok["path"])
    wait_running(cluster, restored)
    cancel(cluster, restored)


# -- 5: savepoints ----------------------------------------------------------------------------------------------


@pytest.mark.integration
def test_savepoint_is_self_contained(running_cluster: Cluster) -> None:
    cluster = running_cluster
    install_jobs(cluster)
    job_id = submit(cluster, "cpjobs:fast", checkpoint_config("unaligned"))
    wait_running(cluster, job_id)
    wait_flowing(cluster, job_id)

    sp_root = cluster.tmp_path / "state" / "savepoints"  # the default --savepoint-root
    result = cluster.call("checkpoint", {"job_id": job_id, "savepoint": True, "directory": str(sp_root)})
    assert result["status"] == "COMPLETED", (result, logs(cluster))
    path = Path(result["path"])
    assert path.parent == sp_root, path
    entry = history_entry(cluster, job_id, result["checkpoint_id"])
    assert entry["savepoint"] and entry["mode"] == "aligned", entry  # savepoints are always aligned
    meta = read_metadata(path)
    assert meta["savepoint"] is True and meta["checkpoint_id"] == result["checkpoint_id"], meta
    assert len(meta["acks"]) == 4, meta["acks"]
    files = {name for a in meta["acks"].values() for kind, name in a["state"].items() if kind != "checksums"}
    assert files, meta["acks"]
    for name in files:
        assert (path / name).is_file(), (name, sorted(p.name for p in path.iterdir()))
    # nothing of it lives in the job's checkpoint storage
    retained = cluster.call("checkpoints", {"job_id": job_id})["retained"]
    assert retained == [], retained
    cancel(cluster, job_id)

    # self-contained: moved elsewhere, it still restores
    moved = cluster.tmp_path / "elsewhere" / path.name
    moved.parent.mkdir()
    shutil.move(str(path), str(moved))
    restored = submit(cluster, "cpjobs:fast", checkpoint_config("unaligned"), restore=str(moved))
    wait_running(cluster, restored)
    wait_flowing(cluster, restored)  # it restored and processes records
    status = cluster.call("status", {"job_id": restored})
    assert status["state"] == "RUNNING", (status, logs(cluster))
    cancel(cluster, restored)
