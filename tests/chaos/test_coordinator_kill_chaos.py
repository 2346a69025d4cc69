"""Kill -9 the coordinator of a backpressured word count twice: a new coordinator on the same state directory
recovers the job from its records and restarts it from its latest complete checkpoint (nothing resubmitted),
and Spark must find the output exact.

The small variant of the coordinator-kill runs of scripts/chaos.sh. Requires Java 17 (Spark verifies).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from runtime.cli.chaos import ChaosSettings, run_chaos

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_coordinator_kills_leave_committed_output_exact(tmp_path: Path) -> None:
    if shutil.which("java") is None:
        pytest.fail("the chaos tests need Java 17 for Spark (apt-get install openjdk-17-jre-headless)")
    settings = ChaosSettings(workdir=str(tmp_path), rows=300_000, keys=500, partitions=4, mode="unaligned",
                             interval_s=0.5, kills=0, coordinator_kills=2, workers=3, parallelism=2,
                             sink_delay_s=0.0001, job_timeout_s=240.0)
    lines: list[str] = []
    result = run_chaos(settings, log=lines.append, seed=5)
    report = "\n".join(lines)
    assert result.state == "FINISHED", f"{result.error}\n{report}"
    kills = [k for k in result.kills if k["kind"] == "coordinator"]
    assert len(kills) == 2, report
    assert all(k["restored_checkpoint"] is not None for k in kills), report
    assert result.ok, f"{result.verify.get('summary')}\n{result.verify}\n{report}"
    assert result.verify["missing"] == 0 and result.verify["duplicate"] == 0 and result.verify["wrong"] == 0
    assert result.verify["expected_rows"] == 300_000
