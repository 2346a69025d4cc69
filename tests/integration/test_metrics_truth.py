"""What users see must be true: a backpressured job's REST and Prometheus figures against ground truth.

The source measures its own time producing (a fixed CPU cost per record, written to a file) and the sink
writes one fixed-width line per record; the test derives from them the source's time blocked (wall time
minus time producing) and the rows the sink wrote per second, and asserts the API's figures within 10 %.
The task's busy time also holds what the source's chain costs after `read_batch` (partitioning, serialising:
some 70 us a record here), which the source cannot see; the sink's pace (500 rows/s) keeps that a few per cent.
"""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.support.cluster import Cluster, poll, write_module
from tests.support.scrape import scrape

JOB = '''
import os
import time
from runtime.api import Job, Sink
from runtime.connectors.source import Source
from runtime.examples.wordcount import Count

DIR = %(dir)r
COST_S = 0.00025  # CPU per record: the source's time producing, measured as it spends it


class TimedSource(Source):
    bounded = False

    def open(self, subtask_index, parallelism):
        super().open(subtask_index, parallelism)
        self.n = 0
        self.producing_s = 0.0
        self.reported = 0.0

    def read_batch(self, max_records):
        t0 = time.perf_counter()
        out = []
        for _ in range(32):
            end = time.perf_counter() + COST_S
            while time.perf_counter() < end:
                pass
            out.append((str(self.n %% 50), self.n))
            self.n += 1
        now = time.perf_counter()
        self.producing_s += now - t0
        if now - self.reported > 0.2:
            self.reported = now
            with open(os.path.join(DIR, "producing.tmp"), "w") as f:
                f.write(repr(self.producing_s))
            os.replace(os.path.join(DIR, "producing.tmp"), os.path.join(DIR, "producing"))
        return out


class LineSink(Sink):
    def open(self, subtask_index, parallelism, attempt):
        super().open(subtask_index, parallelism, attempt)
        self.f = open(os.path.join(DIR, "rows"), "a", buffering=1)

    def write(self, record):
        self.f.write("%%15d\\n" %% record[1])

    def close(self):
        self.f.close()


def build(job: Job) -> None:
    (job.source(TimedSource(), parallelism=1)
        .key_by(lambda r: r[0])
        .process(Count(), parallelism=1)
        .sink(LineSink(delay_per_record_s=0.002)))
'''
ROW_BYTES = 16


def graph(http: str, job_id: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://{http}/api/v1/jobs/{job_id}/graph", timeout=10) as resp:
        body: dict[str, Any] = json.loads(resp.read())
    return body


def metric(metrics: dict[str, float], name: str, task: str) -> float:
    return sum(v for k, v in metrics.items() if k.startswith(name + "{") and f'task="{task}' in k)


def observe(cluster: Cluster, out: Path) -> dict[str, float]:
    metrics: dict[str, float] = {}
    for w in cluster.workers:
        metrics.update(scrape(w.fields["metrics"]))
    return {"at": time.monotonic(), "rows": (out / "rows").stat().st_size / ROW_BYTES,
            "producing": float((out / "producing").read_text()),
            "bp": metric(metrics, "sluice_task_backpressured_seconds_total", "TimedSource"),
            "sink_out": metric(metrics, "sluice_task_records_out_total", "Count -> LineSink")}


def near(got: float, want: float, what: str) -> None:
    assert abs(got - want) <= 0.1 * want, f"{what}: shown {got:.3f}, measured {want:.3f}"


@pytest.mark.integration
def test_backpressure_and_rates_match_ground_truth(running_cluster: Cluster) -> None:
    cluster = running_cluster
    out = cluster.tmp_path / "out"
    out.mkdir()
    write_module(cluster.tmp_path, "truthjob", JOB % {"dir": str(out)})
    job_id = cluster.submit("truthjob:build", {"buffer_bytes": 4096, "buffers_per_channel": 2})
    assert cluster.coordinator is not None
    http = cluster.coordinator.fields["http"]
    poll(lambda: (out / "producing").exists() and (out / "rows").exists(), 60, "the job to produce")
    poll(lambda: graph(http, job_id)["vertices"][1]["records_out_per_s"] > 0, 30, "rates")
    time.sleep(4.0)  # the queues fill and the source settles at the sink's pace (steady state from here)
    a = observe(cluster, out)
    # the REST window (coordinator/rest_views.py RATE_WINDOW_S) then covers the measured span
    poll(lambda: time.monotonic() - a["at"] >= 10.0, 15, "the measurement window", interval_s=0.5)
    b = observe(cluster, out)
    g = graph(http, job_id)
    wall = b["at"] - a["at"]

    rows_per_s = (b["rows"] - a["rows"]) / wall
    blocked = 1.0 - (b["producing"] - a["producing"]) / wall  # the source's wall time minus time producing
    source, sink = g["vertices"]
    print(f"sink wrote {rows_per_s:.0f}/s, source blocked {blocked:.3f}; REST: source out "
          f"{source['records_out_per_s']:.0f}/s bp {source['backpressured_ratio']:.3f} busy {source['busy_ratio']:.3f},"
          f" sink in {sink['records_in_per_s']:.0f}/s; Prometheus: bp {(b['bp'] - a['bp']) / wall:.3f}/s, "
          f"sink {(b['sink_out'] - a['sink_out']) / wall:.0f}/s")
    assert rows_per_s > 200 and blocked > 0.5, (rows_per_s, blocked)  # a throttled source, a working sink

    near((b["bp"] - a["bp"]) / wall, blocked, "Prometheus backpressured s/s of the source")
    near((b["sink_out"] - a["sink_out"]) / wall, rows_per_s, "Prometheus rows/s of the sink")
    near(source["backpressured_ratio"], blocked, "REST backpressured ratio of the source")
    assert source["backpressure"] == "HIGH"
    near(sink["records_in_per_s"], rows_per_s, "REST records in/s of the sink")
    near(sink["records_out_per_s"], rows_per_s, "REST records out/s of the sink")
    near(source["records_out_per_s"], rows_per_s, "REST records out/s of the source")  # rates agree along the graph
    assert cluster.call("cancel", {"job_id": job_id})["state"] == "CANCELLED"
