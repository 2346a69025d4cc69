"""The lakehouse connectors in real jobs: a Delta table and an Iceberg table (SQL catalog on SQLite, warehouse in
the bucket) in the test S3 server, written exactly once by jobs whose worker is SIGKILLed right after a table
commit (the restore replays that checkpoint's files, and the commit must be recognised and skipped), the
continuous file source picking up files added while the job runs, exactly once across a kill, and bad table
configuration refused at submit in one line."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from netstack.errors import RpcError
from runtime.common import objectstore
from tests.support.cluster import Cluster, logs, poll, replace_dead_workers, sluice, write_module
from tests.support.lake import delta_rows, delta_transactions, write_input_files, wrong_counts
from tests.support.object_store import in_bucket, running_s3
from tests.support.s3_server import S3Server

pytest.importorskip("deltalake", reason="deltalake is not installed (the `delta` extra)")

pytestmark = pytest.mark.integration

JOB = '''
import os
import signal

from runtime.api import DeltaSink, FileSource, IcebergSink, Job
from runtime.examples.wordcount import Count

INPUT, TABLE, MARKERS, SINK_DELAY = {input!r}, {table!r}, {markers!r}, {sink_delay}
CATALOG = {catalog!r}


def kill_after_second_commit(sink, checkpoint_id):
    """Once per test (the marker file), the committer kills its own worker right after its second table commit
    of an attempt, before it notes the commit anywhere: the restore from that checkpoint lists the same files
    again. (Not "in attempt 0": a busy machine may restart the job once before, for a late heartbeat.)"""
    sink.table_commits = getattr(sink, "table_commits", 0) + 1
    marker = os.path.join(MARKERS, "killed")
    if sink.table_commits == 2 and not os.path.exists(marker):
        with open(marker, "w") as f:
            f.write(str(checkpoint_id))
        os.kill(os.getpid(), signal.SIGKILL)


class KillAfterTableCommit(DeltaSink):
    def commit_files(self, plan, checkpoint_id):
        super().commit_files(plan, checkpoint_id)
        kill_after_second_commit(self, checkpoint_id)


class KillAfterSnapshot(IcebergSink):
    def commit_files(self, plan, checkpoint_id):
        super().commit_files(plan, checkpoint_id)
        kill_after_second_commit(self, checkpoint_id)


def _pipeline(job, source, sink):
    (job.source(source, parallelism=2)
        .key_by(lambda r: r[0])
        .process(Count(), parallelism=2)
        .sink(sink, parallelism=2).uid({uid!r}))


def files_to_iceberg(job: Job) -> None:
    _pipeline(job, FileSource(INPUT, format="json", monitor_interval=0.2),
              KillAfterSnapshot(CATALOG, "db.counts", columns=["key", "n"], delay_per_record_s=SINK_DELAY))


def unwritable_delta(job: Job) -> None:
    _pipeline(job, FileSource(INPUT, format="json"), DeltaSink(MARKERS + "/blocker/table", columns=["key", "n"]))


def missing_iceberg_table(job: Job) -> None:
    _pipeline(job, FileSource(INPUT, format="json"), IcebergSink(CATALOG, "db.missing", columns=["key", "n"]))


def continuous_to_delta(job: Job) -> None:
    _pipeline(job, FileSource(INPUT, format="json", monitor_interval=0.2),
              KillAfterTableCommit(TABLE, columns=["key", "n"], delay_per_record_s=SINK_DELAY))
'''

WORKER_ARGS = ("--heartbeat-interval", "0.25s")
KILLING_SINK_UID = "counts-table"
STORE_STALL_S = 2.0


def submit(cluster: Cluster, entry: str) -> str:
    config = {"buffer_bytes": 32 * 1024, "buffers_per_channel": 4,
              "checkpoint": {"interval_s": 0.5, "mode": "unaligned", "timeout_s": 10, "tolerable_failures": 3},
              "restart": {"kind": "fixed", "max_attempts": 3, "delay_s": 0.3, "slot_wait_s": 60}}
    return cluster.submit(f"lakejobs:{entry}", config)


def wait_killed(cluster: Cluster, job_id: str, markers: Path, what: str) -> None:
    """Until the sink has killed its worker (the marker); fails at once if the job ended first."""

    def killed() -> bool:
        if (markers / "killed").exists():
            return True
        st = cluster.call("status", {"job_id": job_id})
        assert st["state"] not in ("FINISHED", "FAILED", "CANCELLED"), f"ended before {what}: {st}\n{logs(cluster)}"
        return False

    poll(killed, 90, what, interval_s=0.25)


def install(cluster: Cluster, *, table: str = "", sink_delay: float, catalog: dict[str, str] | None = None) -> Path:
    markers = cluster.tmp_path / "markers"
    markers.mkdir()
    write_module(cluster.tmp_path, "lakejobs", JOB.format(input=str(cluster.tmp_path / "in"), table=table,
                                                          uid=KILLING_SINK_UID, markers=str(markers),
                                                          catalog=catalog or {},
                                                          sink_delay=sink_delay))
    return markers


def delta_rows_now(table: str) -> int:
    return len(delta_rows(table, ["key"])) if objectstore.list_children(f"{table}/_delta_log") else 0


@pytest.mark.slow
def test_continuous_files_to_delta_on_s3_exactly_once_across_a_kill_after_a_table_commit(cluster: Cluster) -> None:
    """FileSource over a directory, unbounded -> keyed count -> DeltaSink in a bucket of the test S3 server,
    unaligned checkpoints. Files are there at the start, added while the job runs and after the committer
    SIGKILLed its worker right after its second Delta commit, before noting it anywhere: the restored job
    lists that commit's files again and must leave them out (the table's txn version for the app says they
    are in). The S3 server then stalls (stopped, continued) for a few checkpoint intervals. Then the job is
    rescaled 2 -> 3 from a checkpoint and more files come. The table ends with every key's counts 1..n once, and
    no checkpoint committed twice."""
    with running_s3() as s3:
        table = f"{in_bucket(cluster, s3)}/counts"
        in_dir = cluster.tmp_path / "in"
        records = write_input_files(in_dir, 2, 3000)
        markers = install(cluster, table=table, sink_delay=0.0001)
        cluster.start(2, worker_args=WORKER_ARGS, worker_ids=True)
        job_id = submit(cluster, "continuous_to_delta")
        poll(lambda: delta_rows_now(table) > 0, 60, "the first Delta commit", interval_s=0.5)
        records += write_input_files(in_dir, 2, 3000, first=2)  # discovered while running
        wait_killed(cluster, job_id, markers, "the sink to kill its worker after a Delta commit")
        replaced: set[int] = set()
        poll(lambda: replace_dead_workers(cluster, replaced, WORKER_ARGS) == 1, 10, "the killed worker to die")
        # the object store stalls mid-run (its process stopped, then continued) while files come: data files and
        # commits wait on it, and the job rides it out
        os.kill(s3.proc.pid, signal.SIGSTOP)
        try:
            records += write_input_files(in_dir, 2, 3000, first=4)  # after the restart
            time.sleep(STORE_STALL_S)  # the fault's length: four checkpoint intervals
        finally:
            os.kill(s3.proc.pid, signal.SIGCONT)
        poll(lambda: delta_rows_now(table) >= len(records), 120, "every record in the table", interval_s=0.5)
        st = cluster.call("status", {"job_id": job_id})
        assert st["restarts"] >= 1 and st["state"] == "RUNNING", f"{st}\n{logs(cluster)}"

        # rescaled 2 -> 3 from a checkpoint: the sink's pending entries are dealt to three subtasks, the new
        # subtask 0 commits; files added after it are read once and every row is still in the table once
        proc = sluice(cluster, "rescale", job_id, "--parallelism", "3")
        assert proc.returncode == 0, (proc.stdout, proc.stderr, logs(cluster))
        records += write_input_files(in_dir, 2, 3000, first=6)
        poll(lambda: delta_rows_now(table) >= len(records), 120, "every record in the rescaled table", interval_s=0.5)
        rescaled = cluster.call("status", {"job_id": job_id})
        assert rescaled["state"] == "RUNNING" and {v["parallelism"] for v in rescaled["vertices"]} == {3}, rescaled
        cluster.call("cancel", {"job_id": job_id})

        rows = delta_rows(table, ["key", "n"])
        assert not wrong_counts(rows, records), wrong_counts(rows, records)
        assert len(rows) == len(records)
        commits = delta_transactions(table)
        assert {a for txns in commits for a, _ in txns} == {f"sluice-{job_id}-{KILLING_SINK_UID}"}
        versions = [v for txns in commits for _, v in txns]
        assert versions == sorted(set(versions)), f"a checkpoint committed twice: {commits}"
        killed_at = int((markers / "killed").read_text())
        assert killed_at in versions
        # the restore is from the checkpoint whose Delta commit happened (or a later one): its files were listed
        # again, and the exact content above says they were not added twice
        assert st["restored_checkpoint_id"] >= killed_at, st


@pytest.mark.slow
def test_iceberg_exactly_once_across_a_kill_after_a_snapshot_and_bad_tables_refused_at_submit(
        cluster: Cluster) -> None:
    """FileSource -> keyed count -> IcebergSink (SQL catalog on SQLite, the warehouse in a bucket of the test S3
    server), unaligned checkpoints; the committer SIGKILLs its worker right after the table's second snapshot,
    and the S3 server then stalls (stopped, continued) while the job restores; then the job is rescaled 2 -> 3
    and more files come. The restore lists that snapshot's files again; the summaries say they are in, so no
    snapshot repeats a checkpoint and every key's counts are 1..n once. Before it, jobs with an unwritable Delta
    path and a missing Iceberg table are refused at submit, each in one line, and nothing is deployed."""
    pytest.importorskip("pyiceberg", reason="pyiceberg is not installed (the `iceberg` extra)")
    with running_s3() as s3:
        iceberg_in_s3(cluster, s3)


def iceberg_in_s3(cluster: Cluster, s3: S3Server) -> None:
    from runtime.connectors.iceberg import load_catalog
    from tests.support.iceberg_tables import iceberg_rows, iceberg_summaries, make_counts_table, sqlite_catalog

    # the catalog on SQLite, the warehouse (metadata and data files) in the bucket: the workers reach it through
    # the object store's environment, which the catalog's FileIO takes too
    catalog = {**sqlite_catalog(cluster.tmp_path / "iceberg"), "warehouse": f"{in_bucket(cluster, s3)}/warehouse"}
    make_counts_table(catalog)
    in_dir = cluster.tmp_path / "in"
    records = write_input_files(in_dir, 4, 3000)
    markers = install(cluster, sink_delay=0.0003, catalog=catalog)  # a few checkpoints long
    cluster.start(2, worker_args=WORKER_ARGS, worker_ids=True)
    (markers / "blocker").write_text("a file where the table's parent directory should be")
    for entry, expected in [("unwritable_delta", f"{markers}/blocker/table is not writable"),
                            ("missing_iceberg_table", "no table 'db.missing' in the catalog")]:
        with pytest.raises(RpcError) as refused:
            submit(cluster, entry)
        assert refused.value.remote_type == "BadConnectorConfig", refused.value
        assert expected in str(refused.value) and "\n" not in str(refused.value), refused.value
    assert cluster.call("status")["jobs"] == [], "nothing was deployed"

    job_id = submit(cluster, "files_to_iceberg")
    wait_killed(cluster, job_id, markers, "the sink to kill its worker after an Iceberg snapshot")
    replaced: set[int] = set()
    poll(lambda: replace_dead_workers(cluster, replaced, WORKER_ARGS) == 1, 10, "the killed worker to die")
    # the warehouse's store stalls while the job restores and goes on: data files and snapshots wait on it
    os.kill(s3.proc.pid, signal.SIGSTOP)
    try:
        time.sleep(STORE_STALL_S)  # the fault's length
    finally:
        os.kill(s3.proc.pid, signal.SIGCONT)
    poll(lambda: len(iceberg_rows(catalog)) >= len(records), 120, "every record in the table", interval_s=0.5)
    st = cluster.call("status", {"job_id": job_id})
    assert st["restarts"] >= 1 and st["state"] == "RUNNING", f"{st}\n{logs(cluster)}"
    # rescaled 2 -> 3 from a checkpoint: the sink's pending snapshot entries are dealt to three subtasks, the new
    # subtask 0 commits; files added after it are read once and every row is still in the table once
    proc = sluice(cluster, "rescale", job_id, "--parallelism", "3")
    assert proc.returncode == 0, (proc.stdout, proc.stderr, logs(cluster))
    records += write_input_files(in_dir, 2, 3000, first=4)
    poll(lambda: len(iceberg_rows(catalog)) >= len(records), 120, "every record in the rescaled table",
         interval_s=0.5)
    rescaled = cluster.call("status", {"job_id": job_id})
    assert rescaled["state"] == "RUNNING" and {v["parallelism"] for v in rescaled["vertices"]} == {3}, rescaled
    cluster.call("cancel", {"job_id": job_id})
    rows = iceberg_rows(catalog)
    assert not wrong_counts(rows, records), wrong_counts(rows, records)
    assert len(rows) == len(records)
    checkpoints = [int(s["sluice.checkpoint"]) for s in iceberg_summaries(catalog)]
    assert checkpoints == sorted(set(checkpoints)), f"a checkpoint committed twice: {checkpoints}"
    killed_at = int((markers / "killed").read_text())
    assert killed_at in checkpoints and st["restored_checkpoint_id"] >= killed_at, (checkpoints, st)
    location = load_catalog(catalog).load_table("db.counts").location()
    assert location.startswith("s3://") and objectstore.list_children(f"{location}/data"), location
