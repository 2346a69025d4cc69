"""A sink far slower than the source: memory stays flat, queues stay bounded, the source is throttled,
metrics show the backpressure, and a probe still crosses the job quickly on the priority lane."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.support.cluster import Cluster, poll, write_module
from tests.support.scrape import scrape

JOB = '''
from runtime.api import DiscardSink, GeneratorSource, Job, KeyedProcessFunction


from runtime.examples.wordcount import Count  # the README's keyed word count


def build(job: Job) -> None:
    # the sink (chained after Count) costs 200 us a record: ~10k records/s for two subtasks,
    # against a source that makes several hundred thousand a second when unhindered
    (job.source(GeneratorSource(count=None, keys=1000, seed=3), parallelism=2)
        .key_by(lambda r: r[0])
        .process(Count(), parallelism=2)
        .sink(DiscardSink(delay_per_record_s=0.0002)))
'''

BUFFER_BYTES = 32 * 1024
BUFFERS_PER_CHANNEL = 4
WINDOW_RECORDS = 50_000  # what the two sink subtasks write in about 5 s


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for {pid}")


def stage_totals(summary: dict) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for t in summary["tasks"]:
        name = t["name"].rsplit(" (", 1)[0]
        agg = out.setdefault(name, {"in": 0, "out": 0, "bp": 0.0})
        agg["in"] += t["records_in"]
        agg["out"] += t["records_out"]
        agg["bp"] += t["backpressured_s"]
    return out


@pytest.mark.integration
def test_slow_sink_backpressures_with_bounded_memory(running_cluster: Cluster) -> None:
    cluster = running_cluster
    write_module(cluster.tmp_path, "slowjob", JOB)
    job_id = cluster.submit("slowjob:build", {"buffer_bytes": BUFFER_BYTES,
                                              "buffers_per_channel": BUFFERS_PER_CHANNEL})
    poll(lambda: cluster.call("status", {"job_id": job_id})["state"] == "RUNNING", 60, "job to run")
    poll(lambda: len(cluster.call("status", {"job_id": job_id})["tasks"]) == 4, 30, "task statistics")

    # until the queues are full: the source has been blocked for a while (memory has settled by then)
    poll(lambda: stage_totals(cluster.call("status", {"job_id": job_id}))["GeneratorSource"]["bp"] >= 2.0, 60,
         "the source to be backpressured")
    early = cluster.call("status", {"job_id": job_id})
    rss_early = {w.pid: rss_mib(w.pid) for w in cluster.workers}
    t_early = time.monotonic()

    # a probe rides the priority lane past everything queued
    probe = cluster.call("probe", {"job_id": job_id})
    assert probe["complete"], probe
    assert probe["duration_s"] < 2.0, probe
    assert any(r["overtaken_output_buffers"] + r["overtaken_input_buffers"] > 0 for r in probe["tasks"]), probe

    # a window of sink progress (~5 s at its pace), long enough for the rates and memory to show
    sink_before = stage_totals(early)["Count -> DiscardSink"]["out"]
    poll(lambda: stage_totals(cluster.call("status", {"job_id": job_id}))["Count -> DiscardSink"]["out"]
         >= sink_before + WINDOW_RECORDS, 30, f"the sink to write {WINDOW_RECORDS} more records")
    late = cluster.call("status", {"job_id": job_id})
    rss_late = {w.pid: rss_mib(w.pid) for w in cluster.workers}
    window_s = time.monotonic() - t_early

    a, b = stage_totals(early), stage_totals(late)
    source, sink = "GeneratorSource", "Count -> DiscardSink"
    sink_rate = (b[sink]["out"] - a[sink]["out"]) / window_s
    source_rate = (b[source]["out"] - a[source]["out"]) / window_s
    assert sink_rate > 1000, f"the sink hardly progressed: {sink_rate:.0f} records/s"
    # throttled: the source runs at the sink's pace, not at its own
    assert source_rate < 1.5 * sink_rate + 2000, (source_rate, sink_rate)
    # bounded in flight: records emitted but not yet written stay within the buffer budget
    in_flight = b[source]["out"] - b[sink]["in"]
    assert 0 <= in_flight < 400_000, in_flight
    # both source subtasks spent most of the window waiting for output buffers
    assert b[source]["bp"] - a[source]["bp"] > 0.5 * 2 * window_s, (a[source], b[source], window_s)
    print(f"sink {sink_rate:.0f}/s source {source_rate:.0f}/s in flight {in_flight} probe {probe['duration_s']:.3f}s "
          f"bp {b[source]['bp'] - a[source]['bp']:.1f}s of {2 * window_s:.1f}s rss {rss_early} -> {rss_late}")

    for t in late["tasks"]:
        # The limit is soft by one chunk (runtime/execution/task.py): a chunk started with a buffer free may cut
        # several. Here a chunk is at most 256 records of ~12 bytes (~3 KiB) and the in-flight bound may shrink
        # buffers to 1 KiB, so a chunk overdraws at most ~3 buffers plus one partial cut per subpartition.
        assert t["output_queue"] <= t["output_buffers_limit"] + 6, t
        assert t["input_queue"] <= 2 * 2 + 8 + 2, t  # exclusive * channels + floating (+ events)
    for pid in rss_late:
        assert rss_late[pid] - rss_early[pid] < 25, f"worker {pid} grew {rss_early[pid]:.0f} -> {rss_late[pid]:.0f} MiB"

    # Prometheus shows it too
    metrics = {}
    for w in cluster.workers:
        metrics.update(scrape(w.fields["metrics"]))
    bp_source = sum(v for k, v in metrics.items()
                    if k.startswith("sluice_task_backpressured_seconds_total") and "GeneratorSource" in k)
    assert bp_source > 3.0, bp_source
    assert any(k.startswith("sluice_connection_sent_bytes_total") and v > 0 for k, v in metrics.items())

    assert cluster.call("cancel", {"job_id": job_id})["state"] == "CANCELLED"
    assert all(w.proc.poll() is None for w in cluster.workers), "cancelling must not take workers down"
