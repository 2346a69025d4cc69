"""The load autoscaler on a real cluster (a coordinator and one worker with two slots): load up, the
expensive vertex scales up; load down, it scales down; the decisions and their reasons are in the REST job
document, the metrics count them, and the output is exact across both rescales.

The job: a source asked for 100 records/s -> `work`, a map whose cost per record the test sets through a
control file -> a file sink, with explicit rebalances so `work` is a vertex of its own. The cost is a sleep
(what busy time measures is the task's wall time in the operator, so a sleep is a cost to it, and the busy
machine is spared a spinning core): at 20 ms per record `work` can take 50 records/s at parallelism 1, half
what it must, so it scales up (3 needed, 2 the most allowed); at 0 it is idle and scales back down to 1.
Once both are seen the control file lifts the source's throttle and the job runs to its end."""

from __future__ import annotations

import json
import re
import time
import urllib.request
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from coordinator.rest import UI_DIR
from runtime.graph.enums import JobState
from tests.support.cluster import Cluster, committed_rows, logs, poll, sluice, write_module

COUNT, RATE = 6_000, 100.0  # the source reads 100/s: 60 s of input, so it cannot run out before the test lifts it
JOB = '''
import json
import time

from runtime.api import FileSink, GeneratorSource, Job

CONTROL = {control!r}


class Control:
    """The test's settings, read at most every 0.2 s: cost_ms (work's sleep per record), fast (no throttle)."""

    def __init__(self):
        self.read_at = 0.0
        self.value = {{"cost_ms": 0.0, "fast": False}}

    def get(self):
        now = time.monotonic()
        if now - self.read_at >= 0.2:
            self.read_at = now
            try:
                with open(CONTROL) as f:
                    self.value = json.load(f)
            except (OSError, ValueError):  # being replaced: the last value stands
                pass
        return self.value


CONTROLLED = Control()


class Throttled(GeneratorSource):
    def read_batch(self, max_records):
        if CONTROLLED.get()["fast"]:
            self._rate = None
        return super().read_batch(max_records)


def work(record):
    cost_ms = CONTROLLED.get()["cost_ms"]
    if cost_ms:
        time.sleep(cost_ms / 1000)
    return record


def build(job: Job) -> None:
    (job.source(Throttled(count={count}, keys=50, seed=3, records_per_second={rate}), parallelism=1)
        .rebalance()
        .map(work, parallelism=1, name="work")
        .rebalance()
        .sink(FileSink({out!r}), parallelism=1))
'''
CONFIG = {"checkpoint": {"interval_s": 1.0, "mode": "unaligned", "timeout_s": 30.0, "min_pause_s": 0},
          "autoscaler": {"enabled": True, "window_s": 3, "stabilization_s": 3, "max_parallelism": 2}}


def control(path: Path, **values: Any) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"cost_ms": 0.0, "fast": False, **values}))
    tmp.replace(path)  # whole or not at all: the job never reads half a file


def get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=30) as resp:
        return json.loads(resp.read())


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_load_scales_the_expensive_vertex_up_and_down_with_exact_output(cluster: Cluster) -> None:
    cluster.start(1)
    assert cluster.coordinator is not None
    rest = f"http://{cluster.coordinator.fields['http']}"
    switch, out = cluster.tmp_path / "control.json", cluster.tmp_path / "out"
    control(switch, cost_ms=20.0)
    write_module(cluster.tmp_path, "loadjob", JOB.format(control=str(switch), count=COUNT, rate=RATE, out=str(out)))
    job_id = cluster.submit("loadjob:build", CONFIG)
    submitted = time.monotonic()
    openapi = json.loads((UI_DIR / "openapi.json").read_text())
    seen: dict[str, Any] = {}

    def decided(direction: str) -> dict[str, Any] | None:
        doc = get(f"{rest}/api/v1/jobs/{job_id}")
        assert doc["state"] in (JobState.CREATED, JobState.DEPLOYING, JobState.RUNNING, JobState.RESTARTING), (
            doc, logs(cluster))
        seen.update(doc)
        return next((d for d in doc["autoscaler"]["decisions"] if d["direction"] == direction), None)

    def work_parallelism() -> int:
        graph = get(f"{rest}/api/v1/jobs/{job_id}/graph")
        return next(v["parallelism"] for v in graph["vertices"] if v["name"] == "work")

    # -- load up: work can take 50/s of the 100/s it must: it scales up to the most allowed
    poll(lambda: decided("up") is not None, 90, "a scale-up decision", interval_s=0.25)
    control(switch, cost_ms=0.0)  # load down at once: the next attempt finds work idle
    up = decided("up")
    assert up is not None and (up["vertex"], up["from"], up["to"]) == ("work", 1, 2), seen["autoscaler"]
    assert up["target_rate"] == RATE and up["true_rate"] <= 51 and up["utilization"] >= 1.9, up  # 20 ms a record
    assert up["reason"].startswith("bottleneck: load ") and "target rate 100.0 records/s" in up["reason"], up
    poll(lambda: (decided("up") or {}).get("outcome") == "applied", 90, "the scale-up applied", interval_s=0.25)
    assert work_parallelism() == 2
    up_at = time.monotonic() - submitted

    # -- load down: idle over a whole window, it scales back to 1
    poll(lambda: decided("down") is not None, 90, "a scale-down decision", interval_s=0.25)
    down = decided("down")
    assert down is not None and (down["vertex"], down["from"], down["to"]) == ("work", 2, 1), seen["autoscaler"]
    assert down["reason"].startswith("idle: load ") and down["utilization"] < 0.5, down
    poll(lambda: (decided("down") or {}).get("outcome") == "applied", 90, "the scale-down applied", interval_s=0.25)
    assert work_parallelism() == 1
    print(f"scaled up at {up_at:.1f}s (load {up['utilization']:.2f}, true rate {up['true_rate']:.1f}/s), down at "
          f"{time.monotonic() - submitted:.1f}s after submit (load {down['utilization']:.3f})")
    jsonschema.validate(seen, {"$ref": "#/components/schemas/Job", "components": openapi["components"]})
    assert [(d["direction"], d["outcome"]) for d in seen["autoscaler"]["decisions"]] == [("up", "applied"),
                                                                                        ("down", "applied")]
    shown = sluice(cluster, "status", job_id).stdout
    assert "autoscaler: " in shown and "last decision work 2 -> 1 (applied): idle: load " in shown, shown
    host, port = cluster.coordinator.address("metrics")
    metrics = urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=30).read().decode()
    for direction in ("up", "down"):
        assert re.search(rf'^sluice_autoscaler_decisions_total{{direction="{direction}",job_id="{job_id}",'
                         rf'vertex="work"}} 1\.0$', metrics, re.MULTILINE), metrics[-3000:]  # labels sorted

    # -- the rest of the input at full speed: every record once across both rescales
    control(switch, fast=True)
    final = cluster.wait_job(job_id, timeout_s=120)
    assert final["state"] == JobState.FINISHED, (final, logs(cluster))
    poll(lambda: not committed_rows(out)[1], 15, "the final commit (no in-progress files left)")
    rows, _ = committed_rows(out)
    seqs = sorted(json.loads(line)[1] for line, n in rows.items() for _ in range(n))
    assert seqs == list(range(COUNT)), (len(seqs), len(set(seqs)))
