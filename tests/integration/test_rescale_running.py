"""`sluice rescale` of a running job on a real cluster (two workers, two slots each).

A backpressured keyed count with unaligned checkpoints every 500 ms is rescaled 2 -> 3 -> 1 -> 2 with the
command while it runs: each rescale takes an unaligned checkpoint (data in flight, no draining), stops the
attempt and redeploys the same job at the new parallelism from it. The committed output is exact. A rescale
that needs more slots than the cluster has is refused in one line and the job goes on to an exact end."""

from __future__ import annotations

import pytest

from runtime.graph.enums import JobState
from tests.support.cluster import Cluster, assert_running_counts, generator_counts, logs, sluice
from tests.support.faulty_coordinator import launcher
from tests.support.releasable_sink import release
from tests.support.rescale import (
    CONFIG,
    KEYS,
    ONE_RESCALE_WORDS,
    SEED,
    WORDS,
    rescale,
    submit,
    wait_backpressured,
)


@pytest.mark.integration
@pytest.mark.timeout(600)
def test_impossible_rescales_are_refused_then_2_3_1_2_with_the_cli_gives_exact_output(running_cluster: Cluster) -> None:
    cluster = running_cluster
    job_id, out = submit(cluster)
    # first, rescales that cannot be done are refused in one line and change nothing
    wait_backpressured(cluster, job_id, 4)
    proc = sluice(cluster, "rescale", job_id, "--parallelism", "5")
    assert proc.returncode == 2 and proc.stdout == "", (proc.stdout, proc.stderr)  # refused as invalid
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "needs 5 slots" in lines[0] and "4" in lines[0], proc.stderr
    proc = sluice(cluster, "rescale", job_id, "--parallelism", "Nope=2")
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1 and "Nope" in proc.stderr, proc
    st = cluster.call("status", {"job_id": job_id})
    assert st["state"] == JobState.RUNNING and st["attempt"] == 0 and st["restarts"] == 0, st
    assert [v["parallelism"] for v in st["vertices"]] == [2, 2], st

    downtimes = []
    for before, after in ((2, 3), (3, 1), (1, 2)):
        wait_backpressured(cluster, job_id, 2 * before)
        downtimes.append(rescale(cluster, job_id, after))
    print(f"rescale downtimes (stop -> running): {', '.join(f'{d:.3f}s' for d in downtimes)}")
    # a cancelled task that waited for its outputs to drain used to run on for the worker's 10 s cancel limit
    assert max(downtimes) < 5.0, (downtimes, logs(cluster))
    release(cluster)  # the rest of the input at full speed
    final = cluster.wait_job(job_id, timeout_s=240)
    assert final["state"] == JobState.FINISHED, (final, logs(cluster))
    assert final["attempt"] == 3 and final["restarts"] == 0 and len(final["rescale_s"]) == 3, final
    assert_running_counts(out, generator_counts(WORDS, KEYS, SEED))
    # a job that is no longer running is refused in one line too
    proc = sluice(cluster, "rescale", job_id, "--parallelism", "1")
    assert proc.returncode == 1 and proc.stderr.strip().count("\n") == 0 and "not RUNNING" in proc.stderr, proc


@pytest.mark.integration
@pytest.mark.timeout(600)
def test_rescale_whose_checkpoint_fails_is_refused_and_the_job_goes_on(cluster: Cluster) -> None:
    """The coordinator's first `_metadata` write fails as on a full disk (its fault hook): the rescale's
    checkpoint does not complete, so nothing is stopped; the next rescale works and the output is exact."""
    cluster.start_coordinator(prefix=launcher(metadata_fails=1))
    cluster.start_worker()
    cluster.start_worker()
    cluster.wait_workers(2)
    manual_only = {**CONFIG, "checkpoint": {**CONFIG["checkpoint"], "interval_s": None}}  # the fault hits ours
    job_id, out = submit(cluster, manual_only, words=ONE_RESCALE_WORDS)
    wait_backpressured(cluster, job_id, 4)
    proc = sluice(cluster, "rescale", job_id, "--parallelism", "3")
    assert proc.returncode == 1 and proc.stdout == "", (proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "checkpoint 1 did not complete" in lines[0] and "unchanged" in lines[0], lines
    st = cluster.call("status", {"job_id": job_id})
    assert st["state"] == JobState.RUNNING and st["attempt"] == 0, st
    assert [v["parallelism"] for v in st["vertices"]] == [2, 2], st
    rescale(cluster, job_id, 3)
    release(cluster)
    final = cluster.wait_job(job_id, timeout_s=240)
    assert final["state"] == JobState.FINISHED and final["attempt"] == 1, (final, logs(cluster))
    assert_running_counts(out, generator_counts(ONE_RESCALE_WORDS, KEYS, SEED))
