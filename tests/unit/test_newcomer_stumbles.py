"""The stumbles a newcomer hit porting a job from the README (issue 31): the state processor imports job
modules from the working directory as `sluice local` does, `--kind value` lists value state only, a state-schema
error fails the job at once, and a job an upgrade cancelled lists no running task."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from coordinator.jobs import JobRecord
from runtime.api.schema import StateSchemaError
from runtime.data.checkpoint_state import graph_of_job, open_checkpoint, savepoint_from_entries, state_rows, target_in
from runtime.graph.enums import JobState
from runtime.graph.job_config import JobConfig

ROOT = str(Path(__file__).resolve().parents[2])
JOB = '''
from runtime.api import DiscardSink, GeneratorSource, Job, KeyedProcessFunction


class Orders(KeyedProcessFunction):
    def open(self, ctx):
        self.count = ctx.value_state("count", default=0)
        self.by_day = ctx.map_state("by_day")
        self.seen = ctx.list_state("seen")

    def process(self, record, ctx):
        self.count.update(self.count.value() + 1)


def build(job: Job) -> None:
    (job.source(GeneratorSource(count=10, keys=5, seed=1), parallelism=1).uid("src")
        .key_by(lambda r: r[0])
        .process(Orders(), parallelism=2).uid("orders")
        .sink(DiscardSink(), parallelism=1))
'''


def console_sluice(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`sluice ...` as the console script runs it: the working directory is not on sys.path by itself."""
    code = ("import sys; sys.path[:] = [p for p in sys.path if p not in ('', '.')]; "
            "from runtime.cli.main import main; sys.exit(main())")
    return subprocess.run([sys.executable, "-c", code, *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": ROOT})


@pytest.fixture
def job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    name = f"orders_v1_{os.getpid()}_{abs(hash(str(tmp_path))) % 10**8}"
    (tmp_path / f"{name}.py").write_text(JOB)
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def test_state_commands_import_job_modules_from_the_working_directory(tmp_path: Path, job: str) -> None:
    graph, mp = graph_of_job(f"{job}:build")
    savepoint_from_entries(str(tmp_path / "sp"), [("count", f"k{i}", i) for i in range(5)],
                           target_in(graph, "orders", mp, "job"), graph, entry=f"{job}:build", name="job")
    (tmp_path / f"fix_{job}.py").write_text("def double(key, state, value):\n    return 2 * value\n")
    proc = console_sluice(tmp_path, "data", "state", "transform", "sp", "--rewrite", f"orders=fix_{job}:double",
                          "-o", "t")
    assert proc.returncode == 0 and "5 rewritten" in proc.stdout, proc.stderr
    # bootstrap imports --job from here too: past the import, the next check (the Parquet input) speaks
    proc = console_sluice(tmp_path, "data", "state", "bootstrap", "--uid", "orders", "--job", f"{job}:build",
                          "--from", "missing.parquet", "--key-col", "key", "-o", "sp2")
    assert proc.returncode == 2 and "missing.parquet: no such file" in proc.stderr, proc.stderr


def test_kind_value_lists_value_state_only_and_map_state_under_map(tmp_path: Path, job: str) -> None:
    graph, mp = graph_of_job(f"{job}:build")
    entries = [("count", "a", 3), ("by_day", "a", {"mon": 1}), ("seen", "a", [1, 2]), ("count", "b", 1)]
    savepoint_from_entries(str(tmp_path / "sp"), entries, target_in(graph, "orders", mp, "job"), graph,
                           entry=f"{job}:build", name="job")
    cp = open_checkpoint(str(tmp_path / "sp"))
    assert sorted((k, s, v) for k, _, s, v in state_rows(cp, "orders", "value")) == [
        ("a", "count", 3), ("b", "count", 1)]
    assert [(r[0], r[2], r[3], r[4]) for r in state_rows(cp, "orders", "map")] == [("a", "by_day", "mon", 1)]
    assert [(r[0], r[2], r[3], r[4]) for r in state_rows(cp, "orders", "list")] == [
        ("a", "seen", 0, 1), ("a", "seen", 1, 2)]


def test_a_state_schema_error_is_unrecoverable() -> None:
    assert getattr(StateSchemaError("value state 'x': ..."), "unrecoverable", False) is True


def test_an_ended_job_lists_no_running_task() -> None:
    job = JobRecord("job-1", "mod:build", "wm", "", JobConfig(parallelism={"*": 1}))
    job.task_stats = {"job-1/1:0": {"task": "job-1/1:0", "state": "running"},
                      "job-1/2:0": {"task": "job-1/2:0", "state": "finished"}}
    job.state = JobState.RUNNING
    assert [t["state"] for t in job.summary()["tasks"]] == ["running", "finished"]
    job.state = JobState.CANCELLED  # as an upgrade leaves the old version
    assert [t["state"] for t in job.summary()["tasks"]] == ["cancelled", "finished"]
    job.state = JobState.FAILED
    assert [t["state"] for t in job.summary()["tasks"]] == ["failed", "finished"]


def test_a_spark_connect_master_needs_the_connect_client_not_java(monkeypatch: pytest.MonkeyPatch) -> None:
    from runtime.data import spark

    monkeypatch.setenv("JAVA_HOME", "/nonexistent-java-home")  # the server has the JVM: no Java needed here
    spark.check_environment("sc://localhost:15002")  # the client is installed (the `spark-connect` extra)
    monkeypatch.setitem(sys.modules, "grpc", None)  # as if it were not: find_spec("grpc") is None
    with pytest.raises(spark.DataError, match=r"sc://localhost:15002 needs the Spark Connect client \(grpc "
                                              r"missing\): pip install 'sluice-dataflow\[spark-connect\]'"):
        spark.check_environment("sc://localhost:15002")
    with pytest.raises(spark.DataError, match="Java 17"):
        spark.check_environment("local[2]")
