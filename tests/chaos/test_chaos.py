"""Kill -9 workers of a backpressured word count with checkpoints; Spark must find the output exact.

The small variant of scripts/chaos.sh: 300 k rows instead of 2 M, same schedule (a kill while a
checkpoint is in flight, a kill of a worker hosting the sink, a random one), with unaligned
checkpoints and with aligned-with-timeout ones. Requires Java 17 (Spark verifies the output).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from runtime.cli.chaos import ChaosSettings, run_chaos

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("java") is None:
        pytest.fail("the chaos tests need Java 17 for Spark (apt-get install openjdk-17-jre-headless)")
    return tmp_path_factory.mktemp("chaos")


@pytest.mark.parametrize("mode", ["unaligned", "aligned_timeout"])
def test_kills_leave_committed_output_exact(workdir: Path, mode: str) -> None:
    settings = ChaosSettings(workdir=str(workdir), rows=300_000, keys=500, partitions=4, mode=mode,
                             interval_s=0.5, kills=3, workers=3, parallelism=2, sink_delay_s=0.00005,
                             job_timeout_s=240.0)
    lines: list[str] = []
    result = run_chaos(settings, log=lines.append, seed=11)
    report = "\n".join(lines)
    assert result.state == "FINISHED", f"{result.error}\n{report}"
    assert len(result.kills) == 3, report
    assert {k["kind"] for k in result.kills} == {"in-flight", "sink", "random"}, report
    assert result.restarts >= 3, (result.restarts, report)
    assert result.checkpoints_completed > 0
    assert result.ok, f"{result.verify.get('summary')}\n{result.verify}\n{report}"
    assert result.verify["missing"] == 0 and result.verify["duplicate"] == 0 and result.verify["wrong"] == 0
    assert result.verify["expected_rows"] == 300_000
