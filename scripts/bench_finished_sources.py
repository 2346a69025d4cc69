"""Unaligned checkpoints after sources finish (FLIP-147), on a real local cluster.

A short and a long source (one subtask each) feed one slow keyed count (busy-wait per record) behind a
discard sink; fixed 32 KiB buffers, 8 per channel, unaligned checkpoints every 0.2 s, every one retained.
The count is backpressured, so when a source reaches its end its channel still holds seconds of data.
For each checkpoint started after the first source ended the script prints its duration (trigger -> last
acknowledgement, the coordinator's history) and, from its `_metadata`, when (s after the trigger) its last
barrier reached each task, and whether each source had ended. "both ended" marks the checkpoints taken when
every source was past its end: before the fix no barrier reached the count for those (the ends had left the
sources), so the count took them only at its own end of input, seconds later.

    .venv/bin/python scripts/bench_finished_sources.py --runs 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any

SCRIPTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(SCRIPTS)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from runtime.api import DiscardSink, GeneratorSource, Job, KeyedProcessFunction  # noqa: E402
from runtime.common.checkpoint_metadata import BadMetadata  # noqa: E402
from runtime.graph.checkpoint_metadata import read_checkpoint_metadata  # noqa: E402

ENTRY = "bench_finished_sources:short_and_long"
SHORT_ENV, LONG_ENV, COST_ENV = "SLUICE_BENCH_SHORT", "SLUICE_BENCH_LONG", "SLUICE_BENCH_COST_US"
BOUND_S = 1.0  # the target: every checkpoint after a source ends within 1 s


class SlowCount(KeyedProcessFunction):
    """A keyed count with a fixed busy-wait per record: keeps the sources backpressured."""

    def open(self, ctx: Any) -> None:
        self.count = ctx.value_state("count", default=0)
        self.cost_s = float(os.environ.get(COST_ENV, "100")) / 1e6

    def process(self, record: Any, ctx: Any) -> None:
        end = time.perf_counter() + self.cost_s
        n = self.count.value() + 1
        self.count.update(n)
        while time.perf_counter() < end:
            pass
        ctx.emit((record[0], n))


def short_and_long(job: Job) -> None:
    short = job.source(GeneratorSource(count=int(os.environ[SHORT_ENV]), keys=50, seed=5), parallelism=1,
                       name="short")
    long = job.source(GeneratorSource(count=int(os.environ[LONG_ENV]), keys=50, seed=6), parallelism=1,
                      name="long")
    short.union(long).key_by(lambda r: r[0]).process(SlowCount(), parallelism=1).sink(DiscardSink())


CONFIG: dict[str, Any] = {
    "buffer_bytes": 32 * 1024, "buffers_per_channel": 8, "inflight_target_s": 0,
    "checkpoint": {"interval_s": 0.2, "mode": "unaligned", "timeout_s": 20, "min_pause_s": 0,
                   "tolerable_failures": 1000, "retain": 1000}}


async def _run_job(cluster: Any) -> str:
    await cluster.wait_workers()
    job_id = (await cluster.call("submit", {"entry": ENTRY, "config": CONFIG, "sys_path": SCRIPTS}))["job_id"]
    deadline = time.monotonic() + 300.0
    while True:
        st = await cluster.call("status", {"job_id": job_id})
        if st["state"] in ("FAILED", "CANCELLED"):
            raise RuntimeError(f"job {job_id} ended {st['state']}: {st.get('error', '')}")
        if st["state"] == "FINISHED":
            return str(job_id)
        if time.monotonic() > deadline:
            raise RuntimeError(f"job {job_id} did not finish within 300 s")
        await asyncio.sleep(0.5)


def _per_checkpoint(directory: str) -> dict[str, Any] | None:
    """One completed checkpoint (every one is retained; the coordinator's history keeps only the last 50): its
    duration (trigger -> last acknowledgement), which tasks had ended, each task's last barrier."""
    try:  # the runtime's one reader of `_metadata`
        meta = read_checkpoint_metadata(directory)
    except BadMetadata:
        return None
    ended, last_barrier = {}, {}
    for task, ack in meta.acks.items():
        name = str(task)
        ended[name] = ack.get("state") == {"finished": True} or "ended" in json.dumps(ack.get("files", {}))
        figures = ack.get("figures") or {}
        if "last_barrier_s" in figures:
            last_barrier[name] = round(float(figures["last_barrier_s"]), 3)
    return {"id": meta.checkpoint_id, "duration_s": meta.duration_s, "ended": ended, "last_barrier_s": last_barrier}


def run_once(short: int, long: int, cost_us: float) -> list[dict[str, Any]]:
    from bench_throughput import logs_kept_on_failure

    from runtime.cli.local_cluster import LocalCluster

    os.environ.update({SHORT_ENV: str(short), LONG_ENV: str(long), COST_ENV: str(cost_us)})  # the workers inherit
    log_dir = tempfile.mkdtemp(prefix="sluice-bench-finished-")
    state_dir = os.path.join(log_dir, "state")
    cluster = LocalCluster(workers=2, slots=2, log_dir=log_dir, state_dir=state_dir)
    with logs_kept_on_failure(cluster, log_dir):
        cluster.start()
        job_id = asyncio.run(_run_job(cluster))
        root = os.path.join(state_dir, "checkpoints", job_id)
        names = sorted((n for n in os.listdir(root) if n.startswith("chk-")), key=lambda n: int(n[4:]))
        rows = [_per_checkpoint(os.path.join(root, n)) for n in names]
    return [r for r in rows if r is not None and r["duration_s"] is not None]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--short", type=int, default=50_000, help="records of the short source")
    parser.add_argument("--long", type=int, default=90_000, help="records of the long source")
    parser.add_argument("--cost-us", type=float, default=100.0, help="busy-wait per record in the count")
    parser.add_argument("--json", action="store_true", help="print every checkpoint's row as JSON")
    args = parser.parse_args(argv)
    after_first: list[float] = []
    both: list[float] = []
    for run in range(args.runs):
        rows = run_once(args.short, args.long, args.cost_us)
        print(f"run {run + 1}: {len(rows)} completed checkpoints")
        for r in rows:
            sources = {t: e for t, e in r["ended"].items() if t.startswith(("0:", "1:"))}
            n_ended = sum(sources.values())
            if n_ended == 0:
                continue
            tag = "both ended" if n_ended == len(sources) else "one ended"
            (both if n_ended == len(sources) else after_first).append(r["duration_s"])
            if args.json:
                print(json.dumps(r))
            else:
                print(f"  chk {r['id']:3d} {tag:10s} {r['duration_s']:.3f} s  last barrier: "
                      + ", ".join(f"{t} {s:.3f}" for t, s in sorted(r["last_barrier_s"].items())))
    every = after_first + both
    for label, values in (("one source ended", after_first), ("both ended", both), ("every one after an end", every)):
        if values:
            print(f"{label}: {len(values)} checkpoints, median {statistics.median(values):.3f} s, "
                  f"slowest {max(values):.3f} s, over {BOUND_S:.0f} s: {sum(v > BOUND_S for v in values)}")
    return 0 if every and max(every) <= BOUND_S else 1


if __name__ == "__main__":
    sys.exit(main())
