"""Kill -9 workers and the coordinator of a backpressured word count, and rescale it to a random parallelism
between the kills, under unaligned checkpoints; Spark must find the output exact.

The small variant of scripts/chaos.sh's word-count runs, all fault kinds in one run: 300 k rows instead of 2 M,
the same worker kills (one while a checkpoint is in flight, one of a worker hosting the sink, a random one),
a coordinator kill, after which a new coordinator on the same state directory recovers the job from its
records and restarts it from its latest complete checkpoint (nothing resubmitted), a rescale after the first
kill, through an unaligned checkpoint taken while data is in flight, and the job's checkpoint store wiped
before a worker kill (the restart restores a checkpoint taken after the wipe). A second run cuts a worker
off from the others for 30 s (network namespaces), which the default restart strategy outlasts.
Aligned-with-timeout checkpoints meet the same kills in scripts/chaos.sh (every mode, 2 M rows); in the
suite, restores of aligned_timeout checkpoints with data in flight are exact in
tests/integration/test_checkpoints.py. Requires Java 17 (Spark generates the input and verifies the output, in the
session's shared SparkSession: its JVM starts once).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from runtime.cli.chaos import ChaosSettings, run_chaos
from runtime.cli.netns import NetnsUnavailable

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_worker_and_coordinator_kills_and_rescales_leave_committed_output_exact(chaos_workdir: Path,
                                                                              spark: Any) -> None:
    settings = ChaosSettings(workdir=str(chaos_workdir), rows=300_000, keys=500, partitions=4, mode="unaligned",
                             interval_s=0.5, kills=3, coordinator_kills=1, rescales=1, wipes=1, workers=3,
                             parallelism=2,
                             sink_delay_s=0.0002, job_timeout_s=300.0)  # the schedule (3 kills) must fit the run
    lines: list[str] = []
    result = run_chaos(settings, log=lines.append, seed=3, spark=spark)
    report = "\n".join(lines)
    assert result.state == "FINISHED", f"{result.error}\n{report}"
    worker_kills = [k for k in result.kills if k["kind"] != "coordinator"]
    coordinator_kills = [k for k in result.kills if k["kind"] == "coordinator"]
    assert sorted(k["kind"] for k in worker_kills) == ["in-flight", "random", "sink"], report
    assert len(coordinator_kills) == 1, report
    # the checkpoint store was wiped before a worker kill, whose restart restored a checkpoint taken after it
    [wipe] = result.wipes
    assert wipe["deleted"], report
    after = next(k for k in result.kills if k["kind"] != "coordinator" and k["at_s"] >= wipe["at_s"])
    assert after["last_checkpoint"] > wipe["last_checkpoint"] + 1, report
    assert all(k["restored_checkpoint"] is not None for k in coordinator_kills), report
    # the plan puts the rescale right after the first kill (a rescale is refused once a source subtask has read
    # all its input, which at a higher parallelism comes early: one rescale, early, leaves the later faults room)
    assert len(result.rescales) == 1 and result.rescales[0]["at_s"] > result.kills[0]["at_s"], report
    for r in result.rescales:
        assert r["to"] != r["from"] and 1 <= r["to"] <= settings.max_rescale_parallelism, report
        assert r["mode"] == "unaligned", report
    assert result.restarts >= 3, (result.restarts, report)  # the worker kills; rescales count no restart
    assert result.checkpoints_completed > 0
    assert result.ok, f"{result.verify.get('summary')}\n{result.verify}\n{report}"
    assert result.verify["missing"] == 0 and result.verify["duplicate"] == 0 and result.verify["wrong"] == 0
    assert result.verify["expected_rows"] == 300_000
    # what `sluice data verify` prints (without --json) is this summary line
    assert result.verify["summary"].startswith("verify wordcount: 300,000 expected rows, 300,000 output rows: "
                                               "0 missing, 0 duplicate, 0 wrong -> OK"), result.verify["summary"]


def test_a_30s_partition_is_outlasted_by_the_default_restart_strategy_with_exact_output(
        chaos_workdir: Path, spark: Any) -> None:
    """A worker hosting the job is cut off from every other worker for 30 s (network namespaces): the attempts
    meanwhile fail (restarts after 1, 2, 4, 8, 16 s), and the default restart strategy (exponential, counted in a
    5 min window) outlasts the partition, as README's restart section says it does; the job then finishes with
    exact output. Same input as the test above (generated once); a quick sink, since the partition, not the
    data, is what takes the time (the job is still running when the partition starts, about 2 s in)."""
    settings = ChaosSettings(workdir=str(chaos_workdir), rows=300_000, keys=500, partitions=4, mode="unaligned",
                             interval_s=0.5, kills=0, partition_s=30.0, workers=3, parallelism=2,
                             sink_delay_s=0.00002, job_timeout_s=300.0)
    lines: list[str] = []
    try:
        result = run_chaos(settings, log=lines.append, seed=5, spark=spark)
    except NetnsUnavailable as exc:
        pytest.skip(f"the 30 s partition needs network namespaces: {exc}")
    report = "\n".join(lines)
    assert result.state == "FINISHED", f"{result.error}\n{report}"
    [partition] = result.partitions
    assert partition["duration_s"] == 30.0 and partition["restarts_during"] >= 1, report
    assert result.verify["missing"] == 0 and result.verify["duplicate"] == 0 and result.verify["wrong"] == 0, (
        f"{result.verify.get('summary')}\n{report}")
    assert result.ok and result.verify["expected_rows"] == 300_000, report
