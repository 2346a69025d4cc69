"""An upgrade and a rescale are one step in the job lifecycle whoever leads (issue 31): the leader coordinator is
killed at each point of them (at the exact step, through tests/support/faulty_coordinator.py's `--die-at`) and
started again on the same state directory; the next leader finishes the step or rolls it back from the job
records, and the committed output of the whole line of versions is exact.

One job line, one cluster, one kill per step (each next coordinator is started to die at the next step):

- upgrade, killed once the savepoint is taken: nothing recorded yet, the old version is recovered (rolled back);
- upgrade, killed once the new version's record is written: the next leader cancels the old version and starts
  the new one from the savepoint (rolled forward);
- upgrade, killed once the old version is cancelled (the reported case: the standby recovered 0 jobs and the old
  record pointed at a job never written): the new one starts from the savepoint;
- rescale, killed once its checkpoint is taken: the job runs on at its old parallelism;
- rescale, killed once the attempt is stopped: the job runs at the new parallelism;
- stop with a savepoint, killed once the savepoint is taken: the job is recovered and runs on;
- stop with a savepoint, killed once the job is stopped: it stays CANCELLED, naming its savepoint, from which
  the line is resubmitted and runs to its end.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from netstack.errors import Conflict, NetstackError, RpcError
from runtime.cli.client import call_coordinator
from tests.support.cluster import Cluster, assert_running_counts, generator_counts, logs, poll, write_module
from tests.support.faulty_coordinator import DIED_EXIT, launcher
from tests.support.releasable_sink import RELEASABLE_SINK, release, release_path

pytestmark = pytest.mark.integration

# enough input that the slow sink is still busy at step 7 however slowly the machine runs the kills and restarts
# (each version resumes where the last stopped: 40,000 words once ran out during step 6 on a loaded machine); the
# last version, released, writes the rest at full speed
WORDS, KEYS, SEED = 160_000, 30, 3
JOBS = '''
from runtime.api import FileSink, GeneratorSource, Job
from runtime.examples.wordcount import Count

RELEASE = {release!r}
''' + RELEASABLE_SINK + f'''

def _line(job: Job) -> None:
    (job.source(GeneratorSource(count={WORDS}, keys={KEYS}, seed={SEED}), parallelism=2).uid("src")
        .key_by(lambda r: r[0])
        .process(Count(), parallelism=2).uid("count")
        .sink(ReleasableSink({{out!r}}, delay_per_record_s=0.0003)).uid("out"))


v1 = v2 = v3 = _line  # versions of one job: the same operators by uid
'''
CONFIG = {"buffer_bytes": 4096, "buffers_per_channel": 2,
          "checkpoint": {"interval_s": 0.3, "mode": "aligned", "timeout_s": 60.0, "tolerable_failures": 3},
          "restart": {"kind": "fixed", "max_attempts": 3, "delay_s": 0.2}}
# the default lease timeout (5 s): a dead leader on the same host is taken over at once anyway, and a 1 s lease
# was not renewed in time on a loaded machine (the leader stepped down before any kill)
COORDINATOR_ARGS: tuple[str, ...] = ()
WORKER_ARGS = ("--heartbeat-interval", "0.25s")


def call(cluster: Cluster, method: str, args: dict[str, Any], timeout_s: float = 60.0) -> Any:
    host, port = cluster.rpc
    return asyncio.run(call_coordinator(host, port, cluster.token, method, args, timeout_s=timeout_s))


def started(cluster: Cluster, port: int, die_at: str) -> None:
    """A coordinator on the state directory and `port` (the workers find it again), dying at `die_at`."""
    cluster.start_coordinator("--port", str(port), *COORDINATOR_ARGS,
                              prefix=launcher(die_at=die_at) if die_at else None)
    cluster.wait_workers(2, timeout_s=60)


def dies_during(cluster: Cluster, method: str, args: dict[str, Any], step: str) -> None:
    """Ask for `method`; the coordinator dies at `step` of it and the call's connection breaks."""
    coordinator = cluster.coordinator
    assert coordinator is not None
    for _ in range(3):
        try:
            call(cluster, method, args)
        except Conflict as exc:  # e.g. the savepoint was declined (a checkpoint failed): the job runs on, ask again
            print(f"{method} answered {exc.code}: {exc}; asking again")
            continue
        except RpcError as exc:
            pytest.fail(f"{method} refused ({exc.code}: {exc}) instead of reaching {step}\n{logs(cluster)}")
        except NetstackError:
            break  # the connection broke: the coordinator died
        else:
            pytest.fail(f"{method} answered instead of dying at {step}\n{logs(cluster)}")
    else:
        pytest.fail(f"{method} refused three times instead of reaching {step}\n{logs(cluster)}")
    assert coordinator.wait(30) == DIED_EXIT, logs(cluster)  # and its log complete
    assert f"step {step} reached: dying" in cluster.log("coordinator"), logs(cluster)


def running(cluster: Cluster, job_id: str, after_checkpoint: int = 0) -> dict[str, Any]:
    """Wait until the job runs, with a checkpoint completed after `after_checkpoint` (the one the previous
    coordinator had completed last: a new one proves the attempt of this coordinator runs)."""
    seen: dict[str, Any] = {}

    def ready() -> bool:
        seen.update(cluster.call("status", {"job_id": job_id}))
        assert seen["state"] not in ("FAILED", "CANCELLED", "FINISHED"), (seen, logs(cluster))
        return seen["state"] == "RUNNING" and (seen["last_checkpoint"] or {}).get("checkpoint_id", 0) > after_checkpoint

    poll(ready, 90, f"job {job_id} running with a new checkpoint", interval_s=0.1)
    return seen


def parallelism(status: dict[str, Any]) -> set[int]:
    return {v["parallelism"] for v in status["vertices"]}


def test_a_leader_killed_at_each_step_of_an_upgrade_and_a_rescale(cluster: Cluster) -> None:
    out: Path = cluster.tmp_path / "out"
    write_module(cluster.tmp_path, "linejobs", JOBS.format(out=str(out), release=release_path(cluster)))
    cluster.start_coordinator(*COORDINATOR_ARGS, prefix=launcher(die_at="upgrade:savepoint-taken"))
    port = cluster.rpc[1]
    for i in range(2):
        cluster.start_worker(*WORKER_ARGS, worker_id=f"worker-{i + 1}")
    cluster.wait_workers(2)
    v1 = call(cluster, "submit", {"entry": "linejobs:v1", "sys_path": str(cluster.tmp_path), "config": CONFIG})
    job = str(v1["job_id"])
    before = running(cluster, job)

    def upgrade(entry: str) -> dict[str, Any]:
        return {"job_id": job, "entry": entry, "sys_path": str(cluster.tmp_path)}

    # 1. the savepoint is taken, nothing recorded: the old version runs on, alone
    dies_during(cluster, "upgrade", upgrade("linejobs:v2"), "upgrade:savepoint-taken")
    started(cluster, port, "upgrade:successor-recorded")
    st = running(cluster, job, before["last_checkpoint"]["checkpoint_id"])
    assert [j["job_id"] for j in cluster.call("status")["jobs"]] == [job]
    assert "coordinator failover" in st["failures"], st

    # 2. the new version is recorded: the next leader cancels the old one and starts the new from the savepoint
    dies_during(cluster, "upgrade", upgrade("linejobs:v2"), "upgrade:successor-recorded")
    started(cluster, port, "upgrade:predecessor-cancelled")
    jobs = {j["job_id"]: j for j in cluster.call("status")["jobs"]}
    assert len(jobs) == 2 and jobs[job]["state"] == "CANCELLED", jobs
    (v2,) = set(jobs) - {job}
    assert jobs[job]["error"].startswith(f"upgraded to {v2}"), jobs[job]
    st = running(cluster, v2)
    assert st["entry"] == "linejobs:v2" and st["restored_from"] and st["restored_checkpoint_id"], st
    job = v2

    # 3. the old version is cancelled, the new one not yet submitted: the new one starts from the savepoint
    dies_during(cluster, "upgrade", upgrade("linejobs:v3"), "upgrade:predecessor-cancelled")
    started(cluster, port, "rescale:checkpoint-taken")
    jobs = {j["job_id"]: j for j in cluster.call("status")["jobs"]}
    assert len(jobs) == 3 and jobs[job]["state"] == "CANCELLED", jobs
    (v3,) = set(jobs) - {v1["job_id"], job}
    st = running(cluster, v3)
    assert st["entry"] == "linejobs:v3" and st["restored_from"], st
    job = v3
    assert parallelism(st) == {2}, st

    # 4. the rescale's checkpoint is taken, the attempt not stopped: the job runs on as it ran
    dies_during(cluster, "rescale", {"job_id": job, "parallelism": {"*": 1}}, "rescale:checkpoint-taken")
    started(cluster, port, "rescale:stopped")
    st = running(cluster, job, st["last_checkpoint"]["checkpoint_id"])
    assert parallelism(st) == {2}, st

    # 5. the attempt is stopped for the rescale: the next leader runs the job at the new parallelism
    dies_during(cluster, "rescale", {"job_id": job, "parallelism": {"*": 1}}, "rescale:stopped")
    started(cluster, port, "stop:savepoint-taken")
    st = running(cluster, job, st["last_checkpoint"]["checkpoint_id"])
    assert parallelism(st) == {1}, st

    # 6. stop with a savepoint, the savepoint taken but the job not stopped: it runs on
    dies_during(cluster, "cancel", {"job_id": job, "savepoint": True}, "stop:savepoint-taken")
    started(cluster, port, "stop:stopped")
    st = running(cluster, job, st["last_checkpoint"]["checkpoint_id"])

    # 7. stopped: the next leader shows it so, and the line goes on from the savepoint it names
    dies_during(cluster, "cancel", {"job_id": job, "savepoint": True}, "stop:stopped")
    started(cluster, port, "")
    st = cluster.call("status", {"job_id": job})
    assert st["state"] == "CANCELLED" and st["error"].startswith("stopped with savepoint "), st
    savepoint = st["error"].split("stopped with savepoint ", 1)[1]
    assert Path(savepoint, "_metadata").exists(), savepoint
    job = cluster.call("submit", {"entry": "linejobs:v3", "sys_path": str(cluster.tmp_path), "config": CONFIG,
                                  "restore": savepoint})["job_id"]
    release(cluster)
    final = cluster.wait_job(job, timeout_s=120)
    assert final["state"] == "FINISHED", (final, logs(cluster))
    assert_running_counts(out, generator_counts(WORDS, KEYS, SEED))  # every key's counts 1..n once, over 3 versions
