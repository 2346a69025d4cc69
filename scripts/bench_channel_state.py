#!/usr/bin/env python
"""Incremental channel state: persisted in-flight bytes and the checkpoint writer's time, with and without.

1. Cluster (the backpressured job of scripts/bench_checkpoint.py, unaligned checkpoints every second, one
   fresh local cluster per setting): per completed checkpoint in the measured window, the in-flight bytes it
   persisted (channel-state files plus new segments), its duration, and its tasks' async time (first barrier to
   acknowledgement minus the synchronous part; the slowest task), with `incremental_channel_state` off and on.
2. Writer (in process, real files with fsync, the real CheckpointWriter and channel-state files): each of
   --channels producer channels holds --queue buffers of --buffer-bytes; between checkpoints the consumer takes
   --drain of them and the producer queues as many new ones (sustained backpressure); per checkpoint the bytes
   written and the writer thread's time (encoding, segment and file writes), off and on.

    .venv/bin/python scripts/bench_channel_state.py
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
from typing import Any

SCRIPTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(SCRIPTS)
for path in (ROOT, SCRIPTS):
    if path not in sys.path:
        sys.path.insert(0, path)

import bench_checkpoint  # noqa: E402

from netstack.credit import Buffer  # noqa: E402
from runtime.checkpointing.channel_files import ChannelStateFiles, output_capture  # noqa: E402
from runtime.checkpointing.writer import CheckpointWriter  # noqa: E402
from runtime.common.checkpoint_metadata import BadMetadata  # noqa: E402
from runtime.graph.checkpoint_metadata import read_checkpoint_metadata  # noqa: E402


def _median_max(values: list[float]) -> dict[str, float | None]:
    return {"median": statistics.median(values) if values else None, "max": max(values) if values else None}


def cluster_run(incremental: bool, buffers: int, seconds: float, warmup: float, max_warmup: float) -> dict[str, Any]:
    """One bench_checkpoint run of the unaligned mode, with the setting; figures of the window's checkpoints."""
    plain, timeline = bench_checkpoint.job_config, bench_checkpoint.barrier_timeline
    slowest_async: list[float] = []

    def job_config(mode: str, buffers: int, inflight_target_s: float | None = None) -> dict[str, Any]:
        return {**plain(mode, buffers, inflight_target_s), "incremental_channel_state": incremental}

    def barrier_timeline(state_dir: str, job_id: str, checkpoint_ids: list[int]) -> dict[str, Any]:
        for cid in checkpoint_ids:  # before run_one removes the state directory: each checkpoint's slowest task's async
            try:  # the runtime's one reader of `_metadata`
                acks = read_checkpoint_metadata(os.path.join(state_dir, "checkpoints", job_id, f"chk-{cid}")).acks
                slowest_async.append(max(float(a["figures"]["async_s"]) for a in acks.values()))
            except (BadMetadata, KeyError, ValueError):
                continue
        return timeline(state_dir, job_id, checkpoint_ids)

    # _measure and run_one look these up when they run
    bench_checkpoint.job_config, bench_checkpoint.barrier_timeline = job_config, barrier_timeline
    try:
        result = bench_checkpoint.run_one("unaligned", buffers, seconds, warmup, max_warmup)
    finally:
        bench_checkpoint.job_config, bench_checkpoint.barrier_timeline = plain, timeline
    window = [h for h in result["history"] if h["status"] == "COMPLETED" and not h["savepoint"]
              and result["measure_from"] <= h["started_at"] <= result["measure_to"]]
    return {"incremental": incremental, "buffers_per_channel": buffers, "checkpoints": len(window),
            "processed_records_per_s": result["processed_records_per_s"],
            "inflight_bytes": _median_max([h["inflight_bytes"] for h in window]),
            "duration_s": _median_max([h["duration_s"] for h in window]),
            "async_s": _median_max(slowest_async), "other_cores": result["other_cores"]}


def writer_run(incremental: bool, channels: int, queue: int, drain: int, buffer_bytes: int,
               checkpoints: int) -> dict[str, Any]:
    """The model of a backpressured producer's queues checkpointed again and again (see the module doc)."""
    directory = tempfile.mkdtemp(prefix="sluice-bench-chan-")
    writer = CheckpointWriter()
    files = ChannelStateFiles("1:0", incremental=incremental)
    made = 0

    def buffer() -> Buffer:
        nonlocal made
        made += 1
        return Buffer(os.urandom(16) + bytes(buffer_bytes - 16), 0)

    queues = {f"1:0:{c}": [buffer() for _ in range(queue)] for c in range(channels)}
    written: list[int] = []
    seconds: list[float] = []

    async def run() -> None:
        for n in range(1, checkpoints + 1):
            chk = os.path.join(directory, f"chk-{n}")
            os.makedirs(chk)
            files.begin(n, savepoint=False)
            captures = {k: c for k, q in queues.items() if (c := output_capture(q)) is not None}
            result = await writer.write(os.path.join(chk, "1-0.out"), files.produce(chk, n, "out", captures))
            written.append(result.bytes)
            seconds.append(result.seconds)
            files.completed(n)
            for q in queues.values():  # the consumer took `drain`, the producer queued as many
                del q[:drain]
                q.extend(buffer() for _ in range(drain))

    try:
        asyncio.run(run())
    finally:
        writer.close()
        shutil.rmtree(directory, ignore_errors=True)
    steady_bytes, steady_s = written[1:], seconds[1:]  # the first checkpoint writes everything either way
    return {"incremental": incremental, "captured_bytes": channels * queue * buffer_bytes,
            "written_bytes": _median_max([float(b) for b in steady_bytes]),
            "writer_s": _median_max(steady_s), "first_written_bytes": written[0]}


def _mb(n: float | None) -> str:
    return "-" if n is None else f"{n / 1e6:.2f} MB"


def _ms(s: float | None) -> str:
    return "-" if s is None else f"{s * 1000:.1f} ms"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=15.0, help="measured seconds per cluster run (15)")
    parser.add_argument("--warmup", type=float, default=2.0, help="minimum warm-up, s (2)")
    parser.add_argument("--max-warmup", type=float, default=30.0, help="longest warm-up, s (30)")
    parser.add_argument("--buffers", type=int, default=4, help="buffers_per_channel of the cluster job (4)")
    parser.add_argument("--cost-us", type=float, default=bench_checkpoint.DEFAULT_COST_US,
                        help="busy-wait per record in the keyed count, us")
    parser.add_argument("--no-cluster", action="store_true", help="only the writer model")
    parser.add_argument("--channels", type=int, default=4, help="writer model: channels (4)")
    parser.add_argument("--queue", type=int, default=16, help="writer model: buffers queued per channel (16)")
    parser.add_argument("--drain", type=int, default=4, help="writer model: buffers taken between checkpoints (4)")
    parser.add_argument("--buffer-bytes", type=int, default=32 * 1024, help="writer model: buffer size (32768)")
    parser.add_argument("--checkpoints", type=int, default=30, help="writer model: checkpoints (30)")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    args = parser.parse_args(argv)
    out: dict[str, Any] = {"writer": [writer_run(inc, args.channels, args.queue, args.drain, args.buffer_bytes,
                                                 args.checkpoints) for inc in (False, True)]}
    if not args.no_cluster:
        os.environ[bench_checkpoint.COST_ENV] = repr(args.cost_us)
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in [SCRIPTS, os.environ.get("PYTHONPATH", "")] if p)
        out["cluster"] = [cluster_run(inc, args.buffers, args.seconds, args.warmup, args.max_warmup)
                          for inc in (False, True)]
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    w_off, w_on = out["writer"]
    print(f"writer model: {args.channels} channels x {args.queue} buffers of {args.buffer_bytes} B, "
          f"{args.drain} drained between checkpoints, {args.checkpoints} checkpoints (medians / slowest)")
    for w in out["writer"]:
        print(f"  incremental {'on ' if w['incremental'] else 'off'}: written {_mb(w['written_bytes']['median'])}"
              f" / {_mb(w['written_bytes']['max'])}, writer {_ms(w['writer_s']['median'])}"
              f" / {_ms(w['writer_s']['max'])}")
    print(f"  ratio on/off: bytes {w_on['written_bytes']['median'] / w_off['written_bytes']['median']:.2f}, "
          f"writer time {w_on['writer_s']['median'] / w_off['writer_s']['median']:.2f}")
    for c in out.get("cluster", []):
        print(f"cluster, unaligned, buffers {c['buffers_per_channel']}, incremental "
              f"{'on ' if c['incremental'] else 'off'}: {c['checkpoints']} checkpoints, in-flight persisted "
              f"{_mb(c['inflight_bytes']['median'])} / {_mb(c['inflight_bytes']['max'])}, duration "
              f"{_ms(c['duration_s']['median'])} / {_ms(c['duration_s']['max'])}, async "
              f"{_ms(c['async_s']['median'])} / {_ms(c['async_s']['max'])}, "
              f"processed {c['processed_records_per_s']:,.0f} rec/s, other load {c['other_cores']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
