"""`sluice data state` against a running Spark Connect server (issue 31): the README's own `bootstrap` and `read`
commands with `--master sc://127.0.0.1:PORT`, against the server tests/support/spark_connect.py starts once per
run (the `spark_connect` fixture). The rows must be exactly those the local Spark gives, and the commands run
with no Java at all (JAVA_HOME names a directory without one, and no `java` is on PATH): a command that tried to
start a JVM of its own would fail, so passing proves it did not, however busy the machine."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from runtime.data.checkpoint_state import open_checkpoint, state_rows
from runtime.data.state_processor import read_state
from tests.support.readme import readme_example
from tests.support.spark_connect import SparkConnectServer

KEYS = 40


def without_java(tmp_path: Path) -> dict[str, str]:
    """The environment of a client machine with no Java: Spark's launcher would find none."""
    empty = tmp_path / "no-java"
    empty.mkdir(exist_ok=True)
    return {**os.environ, "JAVA_HOME": str(empty), "PATH": str(empty),
            "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}


def sluice_data(cwd: Path, env: dict[str, str], *args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "runtime.cli", "data", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=240)
    return proc, time.monotonic() - started


def test_readme_state_commands_run_on_a_spark_connect_server_without_a_jvm_of_their_own(
        spark: Any, spark_connect: SparkConnectServer, tmp_path: Path) -> None:
    (tmp_path / "wordcount.py").write_text(readme_example("wordcount"))
    (tmp_path / "counts.py").write_text(readme_example("counts"))
    counts = {f"w{i:02d}": 3 * i + 1 for i in range(KEYS)}
    pq.write_table(pa.table({"key": list(counts), "state": ["count"] * KEYS, "value": list(counts.values())}),
                   tmp_path / "count.parquet")
    env = without_java(tmp_path)
    master = ("--master", spark_connect.url)

    # the README's commands, relative paths and all (the server's working directory is elsewhere)
    boot, boot_s = sluice_data(tmp_path, env, "state", "bootstrap", "--uid", "count", "--job", "counts:build",
                               "--from", "count.parquet", "--key-col", "key", "-o", "initial", *master)
    assert boot.returncode == 0, boot.stdout + boot.stderr
    assert boot.stdout == (f"sluice data state bootstrap: {KEYS} keys of count in 2 subtasks -> "
                           f"{tmp_path / 'initial'}\n"), boot.stdout
    read, read_s = sluice_data(tmp_path, env, "state", "read", "initial", "--uid", "count", "-o", "count-2.parquet",
                               *master)
    assert read.returncode == 0, read.stdout + read.stderr
    assert read.stdout == f"sluice data state read: {KEYS} value rows of count -> {tmp_path / 'count-2.parquet'}\n"
    assert "Traceback" not in boot.stderr + read.stderr and " INFO " not in boot.stderr + read.stderr

    # exactly the rows the local Spark reads from the same savepoint, which hold exactly the bootstrapped counts
    over_connect = sorted(tuple(r.values()) for r in pq.read_table(tmp_path / "count-2.parquet").to_pylist())
    local = sorted(tuple(r) for r in read_state(spark, str(tmp_path / "initial"), "count").collect())
    assert over_connect == local
    assert local == sorted(state_rows(open_checkpoint(str(tmp_path / "initial")), "count", "value"))
    assert {key: value for key, _, state, value in local if state == "count"} == counts
    assert len(local) == KEYS
    print(f"spark connect: server start {spark_connect.start_s:.1f} s, bootstrap {boot_s:.1f} s, "
          f"read {read_s:.1f} s")
