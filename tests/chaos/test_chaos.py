"""Kill -9 workers and the coordinator of a backpressured word count with aligned-with-timeout checkpoints;
Spark must find the output exact.

The small variant of scripts/chaos.sh: 300 k rows instead of 2 M, the same worker kills (one while a
checkpoint is in flight, one of a worker hosting the sink, a random one) and two coordinator kills, after
each of which a new coordinator on the same state directory recovers the job from its records and restarts
it from its latest complete checkpoint (nothing resubmitted). Unaligned checkpoints meet the same worker
kills in test_rescale_chaos.py, between rescales. Requires Java 17 (Spark verifies the output).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from runtime.cli.chaos import ChaosSettings, run_chaos

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_worker_and_coordinator_kills_leave_committed_output_exact(chaos_workdir: Path) -> None:
    settings = ChaosSettings(workdir=str(chaos_workdir), rows=300_000, keys=500, partitions=4,
                             mode="aligned_timeout", interval_s=0.5, kills=3, coordinator_kills=2, workers=3,
                             parallelism=2, sink_delay_s=0.0001, job_timeout_s=300.0)
    lines: list[str] = []
    result = run_chaos(settings, log=lines.append, seed=11)
    report = "\n".join(lines)
    assert result.state == "FINISHED", f"{result.error}\n{report}"
    worker_kills = [k for k in result.kills if k["kind"] != "coordinator"]
    coordinator_kills = [k for k in result.kills if k["kind"] == "coordinator"]
    assert sorted(k["kind"] for k in worker_kills) == ["in-flight", "random", "sink"], report
    assert len(coordinator_kills) == 2, report
    assert all(k["restored_checkpoint"] is not None for k in coordinator_kills), report
    assert result.restarts >= 3, (result.restarts, report)
    assert result.checkpoints_completed > 0
    assert result.ok, f"{result.verify.get('summary')}\n{result.verify}\n{report}"
    assert result.verify["missing"] == 0 and result.verify["duplicate"] == 0 and result.verify["wrong"] == 0
    assert result.verify["expected_rows"] == 300_000
