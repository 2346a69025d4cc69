"""`sluice demo`: exactly-once word count under backpressure, with a worker killed midway.

The story, in the terminal:
1. Spark generates the input (Parquet) - `sluice data generate`.
2. A local cluster (coordinator + 3 workers, separate processes) runs the keyed word count over it with
   a sink far slower than the source, so the pipeline is backpressured, and unaligned checkpoints every
   second. One aligned checkpoint is taken midway for contrast: its barriers wait behind the backlog.
3. A worker is killed with SIGKILL; the coordinator restarts the job from the latest checkpoint on the
   worker that the local supervisor starts again.
4. Spark checks the committed output against a batch computation - `sluice data verify` - and the demo
   prints the verdict with the figures: checkpoint durations, restart time, rows verified.

`--kafka HOST:PORT` tells the same story over Kafka (runtime/cli/kafka_demo.py): the input is a topic, the
sink KafkaSink exactly once, and the verdict reads the output topic back read_committed; no Spark.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import signal
import statistics
import time
from typing import Any

from netstack.transport import run
from runtime.cli.chaos import ChaosSettings, generate_input, sink_workers, verify_output
from runtime.cli.local_cluster import LocalCluster, run_job_on_cluster, summarise_progress
from runtime.graph import protocol as p

SINK_DELAY_S = 0.00004
PARQUET_RECORDS = 400_000
KAFKA_RECORDS = 40_000  # what a local broker takes in a few seconds
# a Kafka sink subtask's 20,000 records take 8 s at this cost, so the kill after four checkpoints comes mid-run
KAFKA_SINK_DELAY_S = 0.0004


def print_checkpoints(history: list[dict[str, Any]]) -> None:
    unaligned = [h for h in history if h["mode"] == "unaligned" and h["status"] == "COMPLETED"]
    aligned = [h for h in history if h["mode"] == "aligned"]
    if unaligned:
        durations = sorted(h["duration_s"] for h in unaligned)
        inflight = sorted(h["inflight_bytes"] for h in unaligned)
        print(f"  unaligned checkpoints: {len(unaligned)} completed under backpressure, duration median "
              f"{statistics.median(durations) * 1000:.0f} ms, max {durations[-1] * 1000:.0f} ms; in-flight data "
              f"persisted median {statistics.median(inflight) / 1024:.0f} KiB")
    for h in aligned:
        if h["status"] == "COMPLETED":
            print(f"  the aligned checkpoint #{h['checkpoint_id']} took {h['duration_s']:.2f} s: its barriers "
                  "waited behind the queued data")
        else:
            print(f"  the aligned checkpoint #{h['checkpoint_id']} did not finish: {h['failure_reason']}")


def run_demo(*, records: int | None, directory: str, kafka: str | None = None) -> int:
    directory = os.path.abspath(directory)
    os.makedirs(directory, exist_ok=True)
    if kafka:
        return run_kafka_demo(bootstrap=kafka, records=records or KAFKA_RECORDS, directory=directory)
    records = records or PARQUET_RECORDS
    settings = ChaosSettings(workdir=directory, rows=records, keys=1000, partitions=4, workers=3)
    print("Sluice demo: exactly-once word count under backpressure, with a worker killed midway\n")
    print(f"1. Spark generates {records:,} rows (key, seq, event_time_ms) over 1,000 keys as Parquet")
    t0 = time.monotonic()
    try:
        input_path = generate_input(settings, lambda line: print(f"   {line}"))
    except RuntimeError as exc:
        print(f"demo: {exc}")
        return 2
    print(f"   ready in {time.monotonic() - t0:.1f}s\n")

    out_dir = os.path.join(directory, "out")
    shutil.rmtree(out_dir, ignore_errors=True)
    os.environ.update({"SLUICE_INPUT": input_path, "SLUICE_OUTPUT": out_dir,
                       "SLUICE_SINK_DELAY_S": str(SINK_DELAY_S), "SLUICE_PARALLELISM": "2"})
    print("2. The job: Parquet source x2 -> key_by -> count x2 (keyed state) -> two-phase file sink x2")
    print(f"   The sink costs {SINK_DELAY_S * 1e6:.0f} us a record, far slower than the source: credit runs")
    print("   out, queues stay bounded, the sources are throttled. The sink blocks (it sleeps), so its tasks run")
    print("   on threads of their own and the workers' event loops keep moving data, barriers and heartbeats.")
    print("   Unaligned checkpoints every second; one aligned checkpoint midway for contrast; a worker killed")
    print("   with SIGKILL after a few checkpoints.\n")
    summary = run_with_a_kill(directory, "runtime.examples.wordcount:build_parquet", "demo-wordcount", "FileSink")
    if summary is None:
        return 1
    print()
    print("3. Spark verifies the committed output against a batch word count of the input")
    t0 = time.monotonic()
    result = verify_output(input_path, out_dir)
    print(f"   {result.get('summary')} (with Spark's start-up: {time.monotonic() - t0:.1f}s)\n")
    return verdict(bool(result.get("ok")), int(result.get("expected_rows", 0)), summary)


def run_kafka_demo(*, bootstrap: str, records: int, directory: str) -> int:
    """The same story over Kafka: topics in and out on the broker at `bootstrap`, no Spark (kafka_demo.py)."""
    from runtime.cli import kafka_demo

    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)  # the demo says in one line what went wrong
    print(f"Sluice demo over Kafka at {bootstrap}: exactly-once word count, a worker killed midway\n")
    print(f"1. {records:,} JSON records [word, seq] over 1,000 words into a new topic of 4 partitions")
    t0 = time.monotonic()
    try:
        topics = asyncio.run(kafka_demo.prepare(bootstrap, records))
    except Exception as exc:
        print(f"demo: {exc}")
        return 2
    print(f"   {topics.topic_in} ready in {time.monotonic() - t0:.1f}s\n")
    os.environ.update({"SLUICE_KAFKA_DEMO_BOOTSTRAP": bootstrap, "SLUICE_KAFKA_DEMO_IN": topics.topic_in,
                       "SLUICE_KAFKA_DEMO_OUT": topics.topic_out, "SLUICE_SINK_DELAY_S": str(KAFKA_SINK_DELAY_S),
                       "SLUICE_PARALLELISM": "2"})
    print("2. The job: KafkaSource x2 (partitions as splits, offsets in every checkpoint) -> key_by -> count x2")
    print(f"   -> KafkaSink x2 exactly-once into {topics.topic_out}: each checkpoint's records in one Kafka")
    print(f"   transaction committed when the checkpoint completes. The sink costs {KAFKA_SINK_DELAY_S * 1e6:.0f} us a")
    print("   record, so the job is backpressured. Unaligned checkpoints every second; one aligned checkpoint")
    print("   midway; a worker that hosts a sink killed with SIGKILL after a few checkpoints.\n")
    summary = run_with_a_kill(directory, "runtime.examples.wordcount:build_kafka", "demo-kafka-wordcount",
                              "KafkaSink")
    if summary is None:
        return 1
    print()
    print(f"3. Reading {topics.topic_out} back as a read_committed consumer")
    try:
        result = kafka_demo.verify_counts(topics.expected, asyncio.run(kafka_demo.read_output(topics)))
    except Exception as exc:
        print(f"demo: reading the output: {exc}")
        return 1
    print(f"   {result.summary()}\n")
    return verdict(result.ok, result.expected_rows, summary)


def run_with_a_kill(directory: str, entry: str, name: str, sink_kind: str) -> dict[str, Any] | None:
    """Run `entry` on a local cluster of 3 workers, an aligned checkpoint midway, and kill -9 a worker that
    hosts a sink (`sink_kind` in its vertex name) after 4 checkpoints; print the figures. None: it failed."""
    config = {"checkpoint": {"interval_s": 1.0, "mode": "unaligned", "timeout_s": 5.0, "tolerable_failures": 5},
              "restart": {"kind": "fixed", "max_attempts": 3, "delay_s": 0.2}}
    cluster = LocalCluster(workers=3, slots=2, log_dir=os.path.join(directory, "logs"),
                           state_dir=os.path.join(directory, "state"))
    shutil.rmtree(cluster.log_dir or "", ignore_errors=True)
    shutil.rmtree(cluster.state_dir or "", ignore_errors=True)
    cluster.start()
    events: dict[str, Any] = {}
    history: list[dict[str, Any]] = []
    try:
        print("   cluster (separate OS processes on loopback; scrape the metrics ports with Prometheus):")
        for line in cluster.describe():
            print(f" {line}")
        print()

        async def on_tick(summary: dict[str, Any], elapsed: float) -> None:
            running = summary["state"] == "RUNNING"
            if running:
                history[:] = (await cluster.ask(p.Checkpoints(summary["job_id"]))).history
            if running and elapsed > 2.5 and "aligned" not in events:
                events["aligned"] = asyncio.create_task(
                    cluster.ask(p.TakeCheckpoint(summary["job_id"], mode="aligned")))
            done = summary.get("checkpoints_completed", 0)
            if running and "kill" not in events and done >= 4 and "aligned" in events and events["aligned"].done():
                victim_id = (sink_workers(summary, sink_kind) or ["worker-2"])[-1]
                victim = next(w for w in cluster.worker_procs if w.fields["id"] == victim_id)
                print(f"   >>> kill -9 {victim_id} (pid {victim.pid}), which hosts a sink; last completed "
                      f"checkpoint #{(summary.get('last_checkpoint') or {}).get('checkpoint_id')}")
                os.kill(victim.pid, signal.SIGKILL)
                events["kill"] = elapsed

        summary = run(run_job_on_cluster(cluster, entry, config=config, name=name,
                                         progress=lambda s: print(f"   {s}"), on_tick=on_tick, timeout_s=600))
    finally:
        cluster.stop()
    print()
    if summary["state"] != "FINISHED":
        print(f"demo: the job ended {summary['state']}: {summary.get('error')}")
        return None
    print(f"   job FINISHED in {summary['elapsed_s']:.1f}s; {summarise_progress(summary, summary['elapsed_s'])}")
    print_checkpoints(history)
    if summary.get("restarts"):
        restarts = ", ".join(f"{s:.2f}s" for s in summary.get("restart_s", []))
        print(f"  restarts: {summary['restarts']} (failure detected -> running again: {restarts}), restored "
              f"checkpoint #{summary.get('restored_checkpoint_id')}; cause: {summary['failures'][-1]}")
    return summary


def verdict(ok: bool, expected_rows: int, summary: dict[str, Any]) -> int:
    if ok:
        print(f"verdict: EXACTLY ONCE - {expected_rows:,} rows verified, 0 missing, 0 duplicate, "
              f"0 wrong, across {summary.get('restarts', 0)} restart(s)")
    else:
        print("verdict: WRONG OUTPUT - see the differences above")
    return 0 if ok else 1
