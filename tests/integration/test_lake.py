"""The lakehouse connectors in real jobs: a Delta table in the test S3 server and a local Iceberg table (SQL
catalog on SQLite) written exactly once by jobs whose worker is SIGKILLed right after a table commit (the
restore replays that checkpoint's files, and the commit must be recognised and skipped), the continuous file
source picking up files added while the job runs, exactly once across a kill, and bad table configuration
refused at submit in one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.cluster import Cluster, poll, write_module
from tests.support.lake import delta_rows, delta_transactions, write_input_files, wrong_counts
from tests.support.object_store import in_bucket, running_s3

pytest.importorskip("deltalake", reason="deltalake is not installed (the `delta` extra)")

pytestmark = pytest.mark.integration

JOB = '''
import os
import signal

from runtime.api import DeltaSink, FileSource, Job
from runtime.examples.wordcount import Count

INPUT, TABLE, MARKERS, SINK_DELAY = {input!r}, {table!r}, {markers!r}, {sink_delay}


class KillAfterTableCommit(DeltaSink):
    """In the first attempt, the committer kills its own worker right after its second Delta commit, before it
    notes the commit anywhere: the restore from that checkpoint lists the same files again."""

    def commit_files(self, plan, checkpoint_id):
        super().commit_files(plan, checkpoint_id)
        self.table_commits = getattr(self, "table_commits", 0) + 1
        if self.attempt == 0 and self.table_commits == 2:
            with open(os.path.join(MARKERS, "killed"), "w") as f:
                f.write(str(checkpoint_id))
            os.kill(os.getpid(), signal.SIGKILL)


def _pipeline(job, source, sink):
    (job.source(source, parallelism=2)
        .key_by(lambda r: r[0])
        .process(Count(), parallelism=2)
        .sink(sink, parallelism=2))


def delta_kill_after_commit(job: Job) -> None:
    _pipeline(job, FileSource(INPUT, format="json", bounded=True),
              KillAfterTableCommit(TABLE, columns=["key", "n"], delay_per_record_s=SINK_DELAY))


def continuous_to_delta(job: Job) -> None:
    _pipeline(job, FileSource(INPUT, format="json", monitor_interval=0.2),
              DeltaSink(TABLE, columns=["key", "n"], delay_per_record_s=SINK_DELAY))
'''

WORKER_ARGS = ("--heartbeat-interval", "0.25s")


def submit(cluster: Cluster, entry: str) -> str:
    config = {"buffer_bytes": 32 * 1024, "buffers_per_channel": 4,
              "checkpoint": {"interval_s": 0.5, "mode": "unaligned", "timeout_s": 10, "tolerable_failures": 3},
              "restart": {"kind": "fixed", "max_attempts": 3, "delay_s": 0.3, "slot_wait_s": 60}}
    return cluster.submit(f"lakejobs:{entry}", config)


def logs(cluster: Cluster) -> str:
    names = ["coordinator", *sorted(str(w.fields["id"]) for w in cluster.workers)]
    return "\n".join(f"--- {n}\n{cluster.log(n)[-3000:]}" for n in names)


def replace_dead_workers(cluster: Cluster, replaced: set[int]) -> int:
    started = 0
    for w in list(cluster.workers):
        if w.proc.poll() is not None and w.pid not in replaced:
            replaced.add(w.pid)
            cluster.start_worker(*WORKER_ARGS, worker_id=str(w.fields["id"]))
            started += 1
    return started


def wait_finished(cluster: Cluster, job_id: str, timeout_s: float = 120) -> dict:
    try:
        st = cluster.wait_job(job_id, timeout_s)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{cluster.call('status', {'job_id': job_id})}\n{logs(cluster)}") from None
    assert st["state"] == "FINISHED", f"{st}\n{logs(cluster)}"
    return st


def install(cluster: Cluster, *, table: str, sink_delay: float) -> Path:
    markers = cluster.tmp_path / "markers"
    markers.mkdir()
    write_module(cluster.tmp_path, "lakejobs", JOB.format(input=str(cluster.tmp_path / "in"), table=table,
                                                          markers=str(markers), sink_delay=sink_delay))
    return markers


@pytest.mark.slow
def test_delta_on_s3_survives_kill_after_a_table_commit_exactly_once(cluster: Cluster) -> None:
    """FileSource -> keyed count -> DeltaSink in a bucket, unaligned checkpoints; the committer SIGKILLs its
    worker right after its second Delta commit. The restored job lists those files again and the next commit
    must leave them out (the table's txn version for the app says they are in): every key's counts 1..n once,
    one Delta commit per checkpoint at most, no app transaction version twice."""
    with running_s3() as s3:
        root = in_bucket(cluster, s3)
        table = f"{root}/counts"
        records = write_input_files(cluster.tmp_path / "in", 4, 6000)
        markers = install(cluster, table=table, sink_delay=0.0001)
        cluster.start(3, worker_args=WORKER_ARGS, worker_ids=True)
        job_id = submit(cluster, "delta_kill_after_commit")
        poll((markers / "killed").exists, 90, "the sink to kill its worker after a Delta commit")
        replaced: set[int] = set()
        poll(lambda: replace_dead_workers(cluster, replaced) == 1, 10, "the killed worker to die")
        st = wait_finished(cluster, job_id)
        assert st["restarts"] == 1, st

        rows = delta_rows(table, ["key", "n"])
        assert not wrong_counts(rows, records), wrong_counts(rows, records)
        assert len(rows) == len(records)
        commits = delta_transactions(table)
        versions = [v for txns in commits for _, v in txns]
        apps = {a for txns in commits for a, _ in txns}
        assert len(apps) == 1, apps  # one run of one sink
        assert versions == sorted(set(versions)), f"a checkpoint committed twice: {commits}"
        killed_at = int((markers / "killed").read_text())
        assert killed_at in versions
        # the restore is from the checkpoint whose Delta commit happened (or a later one): its files were
        # listed again, and the exact content above says they were not added twice
        assert st["restored_checkpoint_id"] >= killed_at, st
