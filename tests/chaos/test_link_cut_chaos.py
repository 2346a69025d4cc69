"""Cut worker-to-worker links of a backpressured word count in network namespaces; Spark must find the output
exact. The small variant of the link-cut runs of scripts/chaos.sh: 300 k rows, two cuts, link timeout 2 s.
Needs root (network namespaces) and Java 17 (Spark verifies the output); skips without namespaces.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from runtime.cli.chaos import ChaosSettings, run_chaos
from runtime.cli.netns import NetnsLab, NetnsUnavailable

pytestmark = [pytest.mark.integration, pytest.mark.slow]

LINK_TIMEOUT_S = 2.0


def test_link_cuts_are_detected_and_committed_output_is_exact(chaos_workdir: Path) -> None:
    try:
        NetnsLab(workers=1).create().teardown()
    except NetnsUnavailable as exc:
        pytest.skip(f"network namespaces unavailable: {exc}")
    settings = ChaosSettings(workdir=str(chaos_workdir), rows=300_000, keys=500, partitions=4, mode="unaligned",
                             interval_s=0.5, kills=0, workers=3, parallelism=2, sink_delay_s=0.00005,
                             job_timeout_s=240.0, link_cuts=2, link_timeout_s=LINK_TIMEOUT_S)
    lines: list[str] = []
    result = run_chaos(settings, log=lines.append, seed=11)
    report = "\n".join(lines)
    assert result.state == "FINISHED", f"{result.error}\n{report}"
    assert len(result.link_cuts) == 2, report
    for cut in result.link_cuts:
        # noticed by the job within the link timeout plus the restart's first steps, never by luck
        assert cut["detected_s"] is not None and cut["detected_s"] < LINK_TIMEOUT_S + 3, report
    assert result.restarts >= 2, (result.restarts, report)
    assert result.ok, f"{result.verify.get('summary')}\n{result.verify}\n{report}"
    assert result.verify["missing"] == 0 and result.verify["duplicate"] == 0 and result.verify["wrong"] == 0
    assert result.verify["expected_rows"] == 300_000
