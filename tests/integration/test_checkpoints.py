"""Checkpoints on a real cluster: aligned barriers stall behind backpressure and time out, unaligned ones
overtake the queued data and persist it, aligned_timeout switches only when it has to, a restore from a
checkpoint taken under backpressure (with in-flight data) reproduces the exact output, aborted and incomplete
checkpoints leave nothing usable behind, savepoints are self-contained, and two checkpoints forced to overlap
both complete, in order."""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from netstack.errors import RpcError
from tests.support.checkpoints import (
    WORDS,
    cancel,
    checkpoint_config,
    checkpoint_dir,
    expected_counts,
    history_entry,
    install_jobs,
    read_metadata,
    start_backpressured,
    submit,
    wait_flowing,
    wait_running,
)
from tests.support.cluster import Cluster, assert_running_counts, committed_output, holds_for, logs, poll
from tests.support.failover import CHANNELS, WORKER_ARGS, assert_exact_output, install
from tests.support.faulty_coordinator import launcher
from tests.support.releasable_sink import release

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
        files = {name for a in meta["acks"].values() for kind, name in a["state"].items()
                 if kind in ("state", "in", "out")}
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
@pytest.mark.parametrize("mode", ["unaligned", "aligned_timeout", "switch"])
def test_restore_from_checkpoint_with_inflight_data_gives_exact_output(running_cluster: Cluster, mode: str) -> None:
    """"switch": an aligned checkpoint whose channels switch to unaligned one by one (a mixed checkpoint)."""
    cluster = running_cluster
    out = install_jobs(cluster)
    expected = expected_counts()
    if mode == "switch":
        config = checkpoint_config("aligned", timeout_s=30.0, channel_timeout_s=0.01, max_inflight_bytes=8 << 20)
    else:
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

    release(cluster)  # the restored job at full speed: the restore, not the data, is under test
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
    # the aborted checkpoint's barriers are still queued behind data (several seconds of it): until they have
    # drained (8 s after the trigger is ample), nothing of it comes back
    ok = cluster.call("checkpoint", {"job_id": job_id, "mode": "unaligned"})
    assert ok["status"] == "COMPLETED", (ok, logs(cluster))
    holds_for(lambda: not aborted.exists(), triggered + 8.0 - time.monotonic(), f"{aborted} staying deleted")
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
    files = {name for a in meta["acks"].values() for kind, name in a["state"].items()
             if kind in ("state", "in", "out")}
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


@pytest.mark.integration
def test_a_savepoint_commits_nothing_and_the_next_checkpoint_publishes_its_output(running_cluster: Cluster) -> None:
    """A savepoint of a running job commits no side effects (Flink 1.15's rule): recovery restores checkpoints,
    never savepoints, so output a savepoint published would be produced again by a failover to the checkpoint
    before it, in a sink that cannot take output back (Kafka, PostgreSQL). Here, with no periodic checkpoints:
    the file sink's part files stay as the first checkpoint published them while the savepoint completes and
    after, and the next checkpoint publishes the savepoint's files with its own."""
    cluster = running_cluster
    out = install_jobs(cluster)
    job_id = submit(cluster, "cpjobs:steady_files", checkpoint_config("aligned"))
    wait_running(cluster, job_id)
    wait_flowing(cluster, job_id)

    def published() -> set[str]:
        return {p.name for p in out.iterdir() if p.name.startswith("part-")} if out.exists() else set()

    def labels(names: set[str]) -> set[int]:
        return {int(name.split("-")[2]) for name in names}  # part-<subtask>-<checkpoint>-<attempt>-<n>.<ext>

    first = cluster.call("checkpoint", {"job_id": job_id})
    assert first["status"] == "COMPLETED", (first, logs(cluster))

    def subtasks_published(checkpoint_id: int) -> set[int]:
        return {int(name.split("-")[1]) for name in published() if int(name.split("-")[2]) == checkpoint_id}

    poll(lambda: subtasks_published(first["checkpoint_id"]) == {0, 1}, 30, "the first checkpoint's files published")
    time.sleep(0.5)  # a subtask publishes its files one after another in one commit
    before = published()
    sp_root = cluster.tmp_path / "state" / "savepoints"
    savepoint = cluster.call("checkpoint", {"job_id": job_id, "savepoint": True, "directory": str(sp_root)})
    assert savepoint["status"] == "COMPLETED", (savepoint, logs(cluster))
    holds_for(lambda: published() == before, 2.0, "nothing published after the savepoint")
    second = cluster.call("checkpoint", {"job_id": job_id})
    assert second["status"] == "COMPLETED", (second, logs(cluster))
    for label in (savepoint["checkpoint_id"], second["checkpoint_id"]):
        poll(lambda n=label: subtasks_published(n) == {0, 1}, 30, f"checkpoint {label}'s files published")
    assert labels(published()) == {first["checkpoint_id"], savepoint["checkpoint_id"], second["checkpoint_id"]}
    cancel(cluster, job_id)


# -- 6: concurrent checkpoints ------------------------------------------------------------------------------------


@pytest.mark.integration
def test_savepoints_and_concurrent_unaligned_checkpoints_complete_in_order(running_cluster: Cluster) -> None:
    """Whether two really overlap depends on timing here (they take a few ms on this job); the next test forces an
    overlap, and the pure coordinator and barrier handler tests pin the overlapping cases down exactly."""
    cluster = running_cluster
    install_jobs(cluster)
    config = checkpoint_config("unaligned", interval_s=0.02, max_concurrent=2, tolerable_failures=0)
    job_id = submit(cluster, "cpjobs:fast", config)
    wait_running(cluster, job_id)
    wait_flowing(cluster, job_id)
    poll(lambda: cluster.call("status", {"job_id": job_id})["checkpoints_completed"] >= 3, 30, "periodic checkpoints")

    sp_root = cluster.tmp_path / "state" / "savepoints"
    for _ in range(2):  # a savepoint starts beside the periodic checkpoints in flight, not behind them
        result = cluster.call("checkpoint", {"job_id": job_id, "savepoint": True, "directory": str(sp_root)})
        assert result["status"] == "COMPLETED", (result, logs(cluster))
        assert read_metadata(result["path"])["savepoint"] is True
    history = cluster.call("checkpoints", {"job_id": job_id})["history"]
    status = cluster.call("status", {"job_id": job_id})
    assert status["state"] == "RUNNING", (status, logs(cluster))  # tolerable_failures=0: nothing failed for real
    ended = [h for h in history if h["status"] != "IN_PROGRESS"]
    assert all(h["status"] == "COMPLETED" or h["failure_reason"].startswith("subsumed by checkpoint") for h in ended), \
        ended
    # completion in id order: the latest completed checkpoint is the newest completed one
    completed = [h["checkpoint_id"] for h in ended if h["status"] == "COMPLETED" and not h["savepoint"]]
    assert status["last_checkpoint"]["checkpoint_id"] >= max(completed), (status, completed)
    cancel(cluster, job_id)


@pytest.mark.integration
def test_a_savepoint_overlaps_aligned_periodic_checkpoints_in_a_bounded_time_and_output_is_exact(
        cluster: Cluster) -> None:
    """Aligned periodic checkpoints every 0.2 s of a backpressured job, and savepoints asked for meanwhile: a
    savepoint starts at once beside the periodic checkpoint in flight (its barriers go in-band behind that one's),
    a periodic checkpoint starts while the savepoint aligns, each completes within a bound a busy machine keeps
    (the 1 s in-flight target, twice, and more), savepoints asked for up to the job's end complete or end with
    it, nothing fails (no checkpoint waits for a task that ended), and every count is committed exactly once."""
    # backpressured (about 40 s at the slow sink) for longer than the savepoints below take on a busy machine (a busy
    # run finished 200,000 words before its sixth); the sink is released after them, so the rest drains at once
    setup = install(cluster, words=400_000)
    cluster.start_coordinator()
    for i in range(2):
        cluster.start_worker(*WORKER_ARGS, worker_id=f"worker-{i + 1}")
    cluster.wait_workers(2)
    job_id = setup.submit("wordcount", checkpoint={"interval_s": 0.2, "mode": "aligned", "min_pause_s": 0,
                                                   "tolerable_failures": 0, "timeout_s": 30})
    poll(lambda: setup.status(job_id)["checkpoints_completed"] >= 1, 60, "a periodic checkpoint")
    sp_root = cluster.tmp_path / "state" / "savepoints"
    beside: set[int] = set()  # savepoints triggered while a periodic checkpoint was in flight
    overlapped: set[int] = set()  # savepoints a periodic checkpoint started beside
    def periodic_in_flight() -> bool:
        return any(h["status"] == "IN_PROGRESS" and not h["savepoint"]
                   for h in cluster.call("checkpoints", {"job_id": job_id})["history"])

    for i in range(10):  # until both kinds were seen: on a busy machine an RPC can outlast a checkpoint interval
        # asked for while a periodic checkpoint is in flight (each takes a large part of a second here), it starts
        # beside it and ends right after it; asked for between two, it aligns alone and a periodic one starts
        if i % 2 == 0:
            poll(periodic_in_flight, 30, "a periodic checkpoint in flight")
        else:
            poll(lambda: not periodic_in_flight(), 30, "no periodic checkpoint in flight")
        asked = time.monotonic()
        result = cluster.call("checkpoint", {"job_id": job_id, "savepoint": True, "directory": str(sp_root)})
        latency_s = time.monotonic() - asked
        assert result["status"] == "COMPLETED", (result, setup.logs())
        assert latency_s < 8.0, (latency_s, setup.logs())
        history = {h["checkpoint_id"]: h for h in cluster.call("checkpoints", {"job_id": job_id})["history"]}
        sp = history[result["checkpoint_id"]]
        aligned_until = sp["started_at"] + sp["duration_s"]
        for h in history.values():
            if h["savepoint"]:
                continue
            ended = None if h["duration_s"] is None else h["started_at"] + h["duration_s"]
            if h["started_at"] < sp["started_at"] and (ended is None or ended > sp["started_at"]):
                beside.add(sp["checkpoint_id"])
            if sp["started_at"] < h["started_at"] < aligned_until:
                overlapped.add(sp["checkpoint_id"])
        if beside and overlapped:
            break
    assert beside and overlapped, (beside, overlapped, history)
    release(cluster)
    # savepoints up to the job's end: the count tasks whose inputs all ended take every checkpoint still
    # triggered beside another at their end of input (the last periodic one and a savepoint), not the latest only
    ended: list[Any] = []
    while setup.status(job_id)["state"] == "RUNNING":
        try:
            ended.append(cluster.call("checkpoint", {"job_id": job_id, "savepoint": True,
                                                     "directory": str(sp_root)}))
        except RpcError as exc:  # the job finished between the status and the request
            ended.append(str(exc))
    st = setup.wait_finished(job_id, 120)
    assert st["restarts"] == 0, st
    # one asked for as the last tasks finished ends with the job, counted failed through no fault of its own
    failed = [h for h in cluster.call("checkpoints", {"job_id": job_id})["history"] if h["status"] == "FAILED"]
    assert not [h for h in failed if h["failure_reason"].startswith(("timeout", "declined"))], (failed, ended)
    assert_exact_output(setup)


@pytest.mark.integration
def test_two_checkpoints_forced_to_overlap_both_complete_in_order_and_output_is_exact(cluster: Cluster) -> None:
    """The overlap forced at an exact point: the coordinator holds the first `_metadata` write (every task has
    acknowledged that checkpoint, it is not complete, no sink has committed it) until the next checkpoint has been
    triggered and acknowledged by every task beside it; then both complete, in id order, and the sinks commit
    both (two pending pre-commits each) with every count exactly once."""
    setup = install(cluster, words=100_000)
    held = cluster.tmp_path / "release-metadata"
    cluster.start_coordinator(prefix=launcher(hold_first_metadata=str(held)))
    for i in range(2):
        cluster.start_worker(*WORKER_ARGS, worker_id=f"worker-{i + 1}")
    cluster.wait_workers(2)
    job_id = setup.submit("wordcount", checkpoint={"interval_s": 0.2, "min_pause_s": 0, "max_concurrent": 2,
                                                   "tolerable_failures": 0, "timeout_s": 60})

    def entries() -> dict[int, dict[str, Any]]:
        st = setup.status(job_id)
        assert st["state"] in ("CREATED", "DEPLOYING", "RUNNING"), f"{st}\n{setup.logs()}"
        return {h["checkpoint_id"]: h for h in cluster.call("checkpoints", {"job_id": job_id})["history"]}

    def acked_not_complete(h: dict[str, Any]) -> bool:  # READY or WRITING: every ack in, no `_metadata` yet
        return h["status"] == "IN_PROGRESS" and h["duration_s"] is not None

    overlap: dict[int, dict[str, Any]] = {}

    def both_acked() -> bool:
        overlap.clear()
        overlap.update({n: h for n, h in entries().items() if acked_not_complete(h)})
        return len(overlap) == 2

    poll(both_acked, 60, "a second checkpoint acknowledged by every task beside the held one")
    first, second = sorted(overlap)
    assert overlap[second]["started_at"] > overlap[first]["started_at"], overlap
    history = entries()
    assert all(h["status"] != "COMPLETED" for h in history.values()), history  # nothing completed yet
    assert setup.status(job_id)["last_checkpoint"] is None
    visible, pending = committed_output(setup.out)
    assert not visible and pending, ("a sink committed before any checkpoint completed", visible, pending)
    held.touch()
    poll(lambda: all(entries()[n]["status"] == "COMPLETED" for n in (first, second)), 60, "both to complete")
    assert setup.status(job_id)["last_checkpoint"]["checkpoint_id"] >= second  # the newer one completed last
    release(cluster)  # the rest of the input at full speed
    st = setup.wait_finished(job_id, 120)
    assert st["restarts"] == 0 and st["checkpoints_failed"] == 0, st
    assert "holding the _metadata write" in cluster.log("coordinator")
    assert_exact_output(setup)
    # both pre-commits were published: part-<subtask>-<checkpoint>-<attempt>-<n>, files of each checkpoint
    published = {int(p.name.split("-")[2]) for p in setup.out.iterdir() if p.name.startswith("part-")}
    assert {first, second} <= published, (first, second, sorted(published))


@pytest.mark.integration
def test_periodic_unaligned_checkpoints_start_and_complete_while_a_savepoint_aligns_and_both_restore_exactly(
        cluster: Cluster) -> None:
    """A backpressured word count (a slow sink: the savepoint's in-band barriers wait behind the queued data) with
    unaligned checkpoints every 0.1 s. While a savepoint aligns, periodic checkpoints start and complete (seen
    COMPLETED in the coordinator's history while the savepoint is IN_PROGRESS): their barriers stop behind the
    savepoint's in each output queue, and a task aligning the savepoint takes them beside it. Where one overtook
    the savepoint, the sink pre-committed the savepoint's output under the id kept free after it (a part file
    named by an id no checkpoint has). Then the job is cancelled, and a restore from the savepoint and one from an
    overlapping unaligned checkpoint (each from the output as it was at the cancel) both count every word once."""
    setup = install(cluster, words=300_000, sink_delay=0.0001)  # about 30 s at the slow sink, released below
    cluster.start_coordinator()
    for i in range(2):
        cluster.start_worker(*WORKER_ARGS, worker_id=f"worker-{i + 1}")
    cluster.wait_workers(2)
    checkpoint = {"interval_s": 0.1, "mode": "unaligned", "min_pause_s": 0, "tolerable_failures": 0,
                  "timeout_s": 30, "retain": 1000}
    job_id = setup.submit("wordcount", checkpoint=checkpoint)
    poll(lambda: setup.status(job_id)["checkpoints_completed"] >= 2, 60, "periodic checkpoints")
    poll(lambda: sum(t["backpressured_s"] for t in setup.status(job_id)["tasks"]) >= 1.0, 60, "backpressure")
    sp_root = cluster.tmp_path / "state" / "savepoints"

    def history() -> dict[int, dict[str, Any]]:
        return {h["checkpoint_id"]: h for h in cluster.call("checkpoints", {"job_id": job_id})["history"]}

    savepoint: dict[str, Any] = {}
    overlapping: list[int] = []  # periodic checkpoints seen COMPLETED, started after the savepoint, while it aligned
    for _ in range(5):  # a savepoint that aligns for less than a checkpoint's time on a busy machine: try again
        asked = threading.Thread(target=lambda: savepoint.update(cluster.call(
            "checkpoint", {"job_id": job_id, "savepoint": True, "directory": str(sp_root)})))
        before = max(history())
        asked.start()
        deadline = time.monotonic() + 60
        while asked.is_alive() and time.monotonic() < deadline:
            seen = history()
            sp = next((h for n, h in seen.items() if n > before and h["savepoint"]), None)
            if sp is not None and sp["status"] == "IN_PROGRESS":
                overlapping += [n for n, h in seen.items() if n > sp["checkpoint_id"] and not h["savepoint"]
                                and h["status"] == "COMPLETED" and n not in overlapping]
            time.sleep(0.02)
        asked.join(timeout=max(0.0, deadline - time.monotonic()))
        assert savepoint.get("status") == "COMPLETED", (savepoint, setup.logs())
        if overlapping:
            break
    assert overlapping, (history(), setup.logs())
    seen = history()
    sp = seen[savepoint["checkpoint_id"]]
    aligned_until = sp["started_at"] + sp["duration_s"]
    for n in overlapping:  # from the history's own clock: started after the savepoint, all acks in before its last
        assert sp["started_at"] < seen[n]["started_at"] < seen[n]["started_at"] + seen[n]["duration_s"] < \
            aligned_until, (sp, seen[n])
    assert all(h["status"] == "COMPLETED" or h["failure_reason"].startswith("subsumed")
               for h in seen.values() if h["status"] != "IN_PROGRESS"), seen
    # the periodic checkpoints go on after the savepoint until one has published the savepoint's own output
    poll(lambda: setup.status(job_id)["last_checkpoint"]["checkpoint_id"] > max(seen) + 1, 30, "a later checkpoint")
    cancel(cluster, job_id)
    ids = set(history())
    labels = {int(p.name.split("-")[2]) for p in setup.out.iterdir() if p.name.startswith("part-")}
    assert labels - ids, ("no sink pre-committed the savepoint out of id order", sorted(labels - ids), sorted(ids))

    at_cancel = cluster.tmp_path / "out-at-cancel"
    shutil.copytree(setup.out, at_cancel)
    release(cluster)  # the restored jobs at full speed
    config = {**CHANNELS, "checkpoint": {**checkpoint, "interval_s": 0.5}}
    for restore in (savepoint["path"], str(checkpoint_dir(cluster, job_id, overlapping[0]))):
        shutil.rmtree(setup.out)
        shutil.copytree(at_cancel, setup.out)
        restored = submit(cluster, "failjobs:wordcount", config, restore=restore)
        st = setup.wait_finished(restored, 120)
        assert st["restored_from"] == restore and st["restarts"] == 0, st
        assert_exact_output(setup)
