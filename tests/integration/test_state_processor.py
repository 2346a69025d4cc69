"""The state processor on Spark (issue 21) against real jobs: a savepoint bootstrapped from Parquet starts a
keyed count that survives a kill -9 exactly, and `state read` lists an unaligned checkpoint's in-flight
records as the checkpoint accounted them; bad input to the CLI is one line and writes nothing.

Spark takes about ten seconds to start, so the module shares one local SparkSession."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from runtime.checkpointing.snapshots import read_channel_state
from runtime.common.retention import segment_writer
from runtime.connectors.generator import key_names
from runtime.data.checkpoint_state import (
    graph_of_job,
    open_checkpoint,
    savepoint_from_entries,
    split_records,
    state_rows,
    target_in,
)
from runtime.data.state_processor import bootstrap, read_state
from tests.support.checkpoints import checkpoint_config, checkpoint_dir, install_jobs, start_backpressured
from tests.support.cluster import Cluster, generator_counts, write_module
from tests.support.failover import (
    Setup,
    assert_recovered,
    kill_worker_running,
    restart_worker,
    start,
    wait_first_checkpoint,
)

pytestmark = pytest.mark.integration

BOOTSTRAPPED_KEYS = 1_000_000  # the figure: about 6 s of the test's time (bootstrap, restore)
WORDS, KEYS, SEED = 120_000, 200, 7

JOB = '''
from runtime.api import FileSink, GeneratorSource, Job
from runtime.examples.wordcount import Count


def counts(job: Job) -> None:
    (job.source(GeneratorSource(count={words}, keys={keys}, seed={seed}), parallelism=2).uid("words")
        .key_by(lambda r: r[0])
        .process(Count(), parallelism=2).uid("counts")
        .sink(FileSink({out!r}, delay_per_record_s=0.00005), parallelism=2))
'''


def initial_counts() -> dict[str, int]:
    """A million keys: the generator's, then others the job never sees; each with a count to continue from."""
    names = key_names(KEYS)
    names += [f"x{i:07d}" for i in range(BOOTSTRAPPED_KEYS - len(names))]
    return {k: (i * 7919) % 100_000 for i, k in enumerate(names)}


def test_bootstrapped_counts_continue_exactly_through_a_kill(spark: Any, cluster: Cluster,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    setup = Setup(cluster, WORDS)
    write_module(cluster.tmp_path, "spjobs", JOB.format(words=WORDS, keys=KEYS, seed=SEED, out=str(setup.out)))
    monkeypatch.syspath_prepend(str(cluster.tmp_path))
    initial = initial_counts()
    data = cluster.tmp_path / "initial.parquet"
    pq.write_table(pa.table({"word": list(initial), "n": list(initial.values())}), data)
    savepoint = cluster.tmp_path / "bootstrapped"
    written = bootstrap(spark, str(data), str(savepoint), uid="counts", job="spjobs:counts", key_col="word",
                        state_name="count", value_col="n")
    assert written == {"keys": BOOTSTRAPPED_KEYS, "subtasks": 2}

    start(cluster)
    config = {"checkpoint": {"interval_s": 1.0, "mode": "unaligned", "timeout_s": 30, "tolerable_failures": 3},
              "restart": {"kind": "fixed", "max_attempts": 3, "delay_s": 0.5, "slot_wait_s": 60}}
    job_id = cluster.call("submit", {"entry": "spjobs:counts", "config": config, "sys_path": str(cluster.tmp_path),
                                     "restore": str(savepoint)})["job_id"]
    st = wait_first_checkpoint(setup, job_id)
    victim = kill_worker_running(cluster, st, 0)
    restart_worker(cluster, victim)
    st = setup.wait_finished(job_id, timeout_s=120)
    assert_recovered(st, 1)

    seen: dict[str, list[int]] = defaultdict(list)
    files = sorted(setup.out.iterdir())
    assert not [p.name for p in files if p.name.startswith((".", "_"))], "uncommitted files left behind"
    for path in files:
        for line in path.read_text().splitlines():
            key, n = json.loads(line)
            seen[key].append(n)
    expected = generator_counts(WORDS, KEYS, SEED)
    assert set(seen) == set(expected)
    wrong = {k: (initial[k], n, len(seen[k])) for k, n in expected.items()
             if sorted(seen[k]) != list(range(initial[k] + 1, initial[k] + n + 1))}
    assert not wrong, f"{len(wrong)} keys did not continue exactly from their bootstrapped count: " \
                      f"{dict(list(wrong.items())[:3])}"


def test_read_lists_the_in_flight_records_of_an_unaligned_checkpoint_and_round_trips_its_state(
        spark: Any, cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    install_jobs(cluster)
    monkeypatch.syspath_prepend(str(cluster.tmp_path))
    cluster.start(2)
    job_id = start_backpressured(cluster, "cpjobs:slow", checkpoint_config("unaligned"))
    result = cluster.call("checkpoint", {"job_id": job_id})
    assert result["status"] == "COMPLETED", result
    cluster.call("cancel", {"job_id": job_id})
    path = str(checkpoint_dir(cluster, job_id, result["checkpoint_id"]))
    cp = open_checkpoint(path)
    figures = sum(int(a["figures"]["inflight_bytes"]) for a in cp.metadata.acks.values())
    assert figures > 0, "the checkpoint persisted no in-flight data: not taken under backpressure"
    listed = records = stream_bytes = file_bytes = 0
    # one operator per task: channel state belongs to tasks, and a chain's operators share theirs
    heads = [op for op in cp.metadata.operators if op["node"] == cp.vertex(op["vertex"])["nodes"][0]]
    for op in heads:
        frame = read_state(spark, path, op["uid"], "channels")
        rows = frame.select("size").toArrow().column("size").to_pylist()
        listed += len(rows)
        for _, files in cp.task_files(int(op["vertex"])):
            for name in (files.inputs, files.outputs):
                if name:
                    file_bytes += len((Path(cp.directory) / name).read_bytes())
                    # with its shared segments
                    for stream in read_channel_state(cp.directory, name, cp.expected(name)).values():
                        records += sum(1 for _ in split_records(stream))
                        stream_bytes += len(stream)
        assert sum(rows) <= stream_bytes
    # every persisted record is listed once, and the files holding them (and the segments this checkpoint
    # wrote) are what the checkpoint accounted
    file_bytes += sum(int(seg[1]) for a in cp.metadata.acks.values() for seg in a["state"].get("segments") or ()
                      if segment_writer(seg[0]) == result["checkpoint_id"])
    assert listed == records > 0
    assert file_bytes == figures

    # read -> Parquet -> bootstrap: the new savepoint holds exactly the keyed state that was read
    count = next(op["uid"] for op in cp.metadata.operators if op["name"] == "Count")
    rows = cluster.tmp_path / "rows"
    read_state(spark, path, count).write.parquet(str(rows))
    again = cluster.tmp_path / "again"
    bootstrap(spark, str(rows), str(again), uid=count, job="cpjobs:slow", key_col="key")
    original = sorted(map(repr, state_rows(cp, count, "value")))
    assert len(original) > 100
    assert sorted(map(repr, state_rows(open_checkpoint(str(again)), count, "value"))) == original


def sluice_state(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "runtime.cli", "data", "state", *args], cwd=cwd,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}, capture_output=True,
                          text=True, timeout=60)


def test_bad_input_is_one_line_exit_2_and_nothing_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "jobs.py").write_text(JOB.format(words=10, keys=2, seed=1, out=str(tmp_path / "o")))
    (tmp_path / "other.py").write_text(JOB.replace('.uid("counts")', '.uid("tallies")').format(
        words=10, keys=2, seed=1, out=str(tmp_path / "o")))
    (tmp_path / "fixes.py").write_text("def double(key, state, value):\n    return 2 * value\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    graph, mp = graph_of_job("jobs:counts")
    savepoint_from_entries(str(tmp_path / "base"), [("count", f"k{i}", i) for i in range(20)],
                           target_in(graph, "counts", mp, "job"), graph, entry="jobs:counts", name="jobs")
    base = {p: p.read_bytes() for p in (tmp_path / "base").iterdir()}
    pq.write_table(pa.table({"word": ["a"], "n": [1]}), tmp_path / "d.parquet")
    common = ["--from", "d.parquet", "--state-name", "count", "--value-col", "n", "-o", "sp"]
    cases = {
        "no column 'key'": ["bootstrap", "--uid", "counts", "--job", "jobs:counts", "--key-col", "key", *common],
        "job other:counts has no operator with uid 'counts'": [
            "bootstrap", "--uid", "counts", "--job", "other:counts", "--key-col", "word", *common],
        "did you mean 'counts'": ["bootstrap", "--uid", "count", "--job", "jobs:counts", "--key-col", "word",
                                  *common],
        "not a completed checkpoint": ["read", str(tmp_path), "--uid", "counts", "-o", "rows"],
        "has no operator with uid 'tallies'": ["read", "base", "--uid", "tallies", "-o", "rows"],
        "did you mean 'counts'?": ["transform", "base", "--drop", "countz", "-o", "t"],
        "--rewrite takes A=B": ["transform", "base", "--rewrite", "counts", "-o", "t"],
        "base exists": ["transform", "base", "--drop", "counts", "-o", "base"],
    }
    for message, args in cases.items():
        proc = sluice_state(tmp_path, *args)
        assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and message in lines[0] and lines[0].startswith("sluice data state"), proc.stderr
    assert not (tmp_path / "sp").exists() and not (tmp_path / "rows").exists() and not (tmp_path / "t").exists()
    proc = sluice_state(tmp_path, "transform", "base", "--rewrite", "counts=fixes:double", "-o", "t2")
    assert proc.returncode == 0 and "20 rewritten" in proc.stdout, proc.stderr
    assert {k: v for k, _, _, v in state_rows(open_checkpoint(str(tmp_path / "t2")), "counts", "value")} == {
        f"k{i}": 2 * i for i in range(20)}
    assert {p: p.read_bytes() for p in (tmp_path / "base").iterdir()} == base  # the input is only read
