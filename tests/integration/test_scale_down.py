"""Scale-down when a worker is lost for good, scale-up when one registers again (three workers, one slot each).

A backpressured keyed count at parallelism 3 with unaligned checkpoints every 500 ms loses a worker to kill -9
with nothing to start it again: after the job's `scale_down_after_s` the coordinator restarts it at parallelism
2 from the latest checkpoint, and `status` says why it runs below its ask. A new worker registers: once it has
stayed for the coordinator's `--scale-up-after`, the job is rescaled back to 3 through a checkpoint, as
`sluice rescale` does. The committed output is exact throughout."""

from __future__ import annotations

import os
import re
import signal
import urllib.request

import pytest

from runtime.graph.enums import JobState
from tests.support.checkpoints import history_entry
from tests.support.cluster import Cluster, assert_running_counts, generator_counts, poll, sluice, write_module
from tests.support.releasable_sink import release, release_path
from tests.support.rescale import CONFIG, JOBS, wait_backpressured

# The sink bounds the sources: they run ahead of it by what the channels hold, which 8 KiB buffers keep to
# ~40k records at parallelism 3. 350k records (~25 s of the sink) leave the sources reading until the scale-up.
WORDS, KEYS, SEED = 350_000, 200, 29
BUFFER_BYTES = 8 * 1024
SCALE_DOWN_AFTER_S = 3.0


def logs(cluster: Cluster) -> str:
    names = ("coordinator", "worker-1", "worker-2", "worker-3", "worker-4")
    return "\n".join(f"--- {n}\n{cluster.log(n)[-3000:]}" for n in names)


def metric(cluster: Cluster, name: str, job_id: str) -> float:
    assert cluster.coordinator is not None
    host, port = cluster.coordinator.address("metrics")
    text = urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=10).read().decode()
    m = re.search(rf'^{name}{{job_id="{job_id}"}} ([\d.e+-]+)$', text, re.MULTILINE)
    assert m is not None, (name, text[-2000:])
    return float(m.group(1))


@pytest.mark.integration
@pytest.mark.timeout(600)
def test_lost_worker_scales_the_job_down_and_a_new_one_scales_it_back_up(cluster: Cluster) -> None:
    cluster.start_coordinator("--scale-up-after", "2s")
    cluster.local.slots = 1
    for _ in range(3):
        cluster.start_worker()
    cluster.wait_workers(3)
    out = cluster.tmp_path / "out"
    job_module = JOBS.replace("parallelism=2", "parallelism=3")
    write_module(cluster.tmp_path, "scaledjobs", job_module.format(out=str(out), words=WORDS, keys=KEYS, seed=SEED,
                                                                    release=release_path(cluster)))
    job_id = cluster.call("submit", {"entry": "scaledjobs:wordcount", "name": "wordcount",
                                     "config": {**CONFIG, "buffer_bytes": BUFFER_BYTES,
                                                "scale_down_after_s": SCALE_DOWN_AFTER_S},
                                     "sys_path": str(cluster.tmp_path)})["job_id"]
    wait_backpressured(cluster, job_id, 6)
    poll(lambda: cluster.call("status", {"job_id": job_id})["last_checkpoint"] is not None, 60, "a checkpoint")

    # -- scale-down: worker-3 dies for good; 2 slots free of the 3 the job asks for
    lost = cluster.workers[2]
    os.kill(lost.pid, signal.SIGKILL)
    lost.proc.wait(timeout=30)
    scaled: dict = {}

    def scaled_down() -> bool:
        scaled.update(cluster.call("status", {"job_id": job_id}))
        assert scaled["state"] not in (JobState.FAILED, JobState.CANCELLED, JobState.FINISHED), (scaled, logs(cluster))
        return scaled["state"] == JobState.RUNNING and [v["parallelism"] for v in scaled["vertices"]] == [2, 2] \
            and scaled["last_restart_s"] is not None  # RUNNING comes before the tasks report they started

    poll(scaled_down, 120, "the job to run again at parallelism 2", interval_s=0.25)
    assert [v["asked_parallelism"] for v in scaled["vertices"]] == [3, 3], scaled
    assert scaled["scaling"]["reason"].startswith("scaled down: 2 slots free of 3 needed since "), scaled["scaling"]
    assert scaled["scaling"]["scale_downs"] == 1 and scaled["restarts"] == 1, scaled
    assert all(w != "worker-3" for w in scaled["placement"].values()), scaled["placement"]
    used = history_entry(cluster, job_id, scaled["restored_checkpoint_id"])
    assert used["status"] == "COMPLETED" and used["mode"] == "unaligned", used
    print(f"scaled down from checkpoint {used['checkpoint_id']} ({used['inflight_bytes']:,} bytes in flight), "
          f"restart took {scaled['last_restart_s']:.2f}s")
    shown = sluice(cluster, "status", job_id)
    assert re.search(r"Count -> FileSink\s+parallelism 2 \(asked 3\)", shown.stdout), shown.stdout
    assert "scaled down: 2 slots free of 3 needed since" in shown.stdout, shown.stdout
    assert metric(cluster, "sluice_job_scale_downs_total", job_id) == 1
    assert metric(cluster, "sluice_job_scaled_down", job_id) == 1

    # -- scale-up: a new worker registers and stays; the job goes back to its ask through a checkpoint
    cluster.start_worker()
    back: dict = {}

    def scaled_up() -> bool:
        back.update(cluster.call("status", {"job_id": job_id}))
        assert back["state"] not in (JobState.FAILED, JobState.CANCELLED, JobState.FINISHED), (back, logs(cluster))
        return back["state"] == JobState.RUNNING and [v["parallelism"] for v in back["vertices"]] == [3, 3]

    poll(scaled_up, 120, "the job to run again at parallelism 3", interval_s=0.25)
    assert back["scaling"]["reason"] == "" and back["scaling"]["scale_ups"] == 1, back["scaling"]
    assert back["restarts"] == 1 and len(back["rescale_s"]) == 1, back  # a rescale, not a failure
    assert "worker-4" in back["placement"].values(), back["placement"]
    print(f"scaled up: down {back['rescale_s'][0]:.3f}s")
    assert metric(cluster, "sluice_job_scale_ups_total", job_id) == 1
    assert metric(cluster, "sluice_job_scaled_down", job_id) == 0

    release(cluster)  # the rest of the input at full speed
    final = cluster.wait_job(job_id, timeout_s=300)
    assert final["state"] == JobState.FINISHED, (final, logs(cluster))
    assert_running_counts(out, generator_counts(WORDS, KEYS, SEED))
