"""Kill -9 the workers of a backpressured windowed count over out-of-order input under unaligned checkpoints;
Spark must find the windows, their late firings and the late records exact.

The small variant of the windowed runs of scripts/chaos.sh: tumbling 500 ms event-time windows with 100 ms of
allowed lateness, the input out of order by up to 400 ms and the watermark 150 ms behind, so a good share of
the records are late for their window or fire it again. One source subtask, so that lateness is a function of
the input (what `sluice data verify --query window-count` recomputes, here in the session's SparkSession).
Requires Java 17.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from runtime.cli.chaos import ChaosSettings, run_chaos

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_windowed_count_with_late_data_is_exact_across_worker_kills(chaos_workdir: Path, spark: Any) -> None:
    settings = ChaosSettings(workdir=str(chaos_workdir), rows=100_000, keys=50, partitions=2, mode="unaligned",
                             interval_s=0.5, kills=2, workers=3, parallelism=2, sink_delay_s=0.001,
                             job_timeout_s=300.0, window_ms=500, jitter_ms=400, max_delay_ms=150,
                             allowed_lateness_ms=100)
    lines: list[str] = []
    result = run_chaos(settings, log=lines.append, seed=5, spark=spark)
    report = "\n".join(lines)
    assert result.state == "FINISHED", f"{result.error}\n{report}"
    assert len(result.kills) == 2 and result.restarts >= 2, (result.kills, result.restarts, report)
    assert result.checkpoints_completed > 0 and max(result.inflight_bytes or [0]) > 0, report
    verify = result.verify
    assert result.ok, f"{verify.get('summary')}\n{verify}\n{report}"
    assert verify["missing"] == 0 and verify["duplicate"] == 0 and verify["wrong"] == 0, verify
    late = verify["late"]
    print(verify.get("summary"), {k: late[k] for k in ("expected_rows", "output_rows") if k in late})
    assert late["ok"] and late["expected_rows"] > 1000, late  # the input really had late records
