#!/usr/bin/env python
"""The checkpoint benchmark's job on Apache Flink (PyFlink 2.x), for side-by-side checkpoint durations.

Run with the Python of a venv that has `apache-flink` installed (never Sluice's); scripts/bench_checkpoint.py
starts it as a subprocess with `--flink-python`. The same shape as `bench_checkpoint:build`: an unbounded
source (parallelism 2; Flink's NumberSequenceSource, mapped in Python to (key, seq) with the key drawn
uniformly from 1000, `k000`..`k999`) -> key_by(key) -> a keyed count in Python (parallelism 2) with value
state and the same busy-wait per record (`--cost-us`) -> a discarding sink. The count is far slower than the
sources, so every channel in front of it is full: full backpressure. Checkpoints every `--interval` s in the
given mode (aligned: exactly-once barriers, unaligned checkpoints off; unaligned: on), on the local mini
cluster, with Flink's default network buffers (32 KiB, 2 exclusive per channel and 8 floating per gate, no
buffer debloating) unless `--debloat` is given.

After `--warmup` s it measures for `--seconds` s, then prints one JSON line: the durations (trigger to last
acknowledgement, Flink's end_to_end_duration) of the checkpoints triggered in the window, completed or
failed, from the mini cluster's REST API.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from flink_common import checkpoints_in_window, discarding_sink, enable_checkpoints, local_environment, rest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=("aligned", "unaligned"), default="aligned")
    parser.add_argument("--interval", type=float, default=1.0, help="checkpoint interval, s")
    parser.add_argument("--cost-us", type=float, default=30.0, help="busy-wait per record in the count, µs")
    parser.add_argument("--warmup", type=float, default=10.0)
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--parallelism", type=int, default=2)
    parser.add_argument("--debloat", action="store_true", help="turn Flink's buffer debloating on (1 s target)")
    parser.add_argument("--verbose", action="store_true", help="print the whole checkpoint history to stderr")
    args = parser.parse_args(argv)

    from pyflink.common import Types, WatermarkStrategy  # only in the Flink venv
    from pyflink.datastream import KeyedProcessFunction, RuntimeContext
    from pyflink.datastream.connectors.number_seq import NumberSequenceSource
    from pyflink.datastream.state import ValueStateDescriptor

    debloat = {"taskmanager.network.memory.buffer-debloat.enabled": "true"} if args.debloat else {}
    env, port = local_environment(args.parallelism, debloat)
    enable_checkpoints(env, args.interval, unaligned=args.mode == "unaligned")
    cost_s = args.cost_us / 1e6

    class SlowCount(KeyedProcessFunction):  # type: ignore[misc]
        def open(self, runtime_context: RuntimeContext) -> None:
            self.count = runtime_context.get_state(ValueStateDescriptor("count", Types.LONG()))

        def process_element(self, value: Any, ctx: Any) -> Any:
            end = time.perf_counter() + cost_s
            n = (self.count.value() or 0) + 1
            self.count.update(n)
            while time.perf_counter() < end:
                pass
            yield value[0], n

    def keyed(seq: int) -> tuple[str, int]:
        return f"k{(seq * 2654435761) % 1000:03d}", seq  # a fixed hash: uniform over the 1000 keys

    source = NumberSequenceSource(0, 2**62)
    discard = discarding_sink()
    (env.from_source(source, WatermarkStrategy.no_watermarks(), "gen")
        .map(keyed, output_type=Types.TUPLE([Types.STRING(), Types.LONG()]))
        .key_by(lambda r: r[0], key_type=Types.STRING())
        .process(SlowCount(), output_type=Types.TUPLE([Types.STRING(), Types.LONG()]))
        .sink_to(discard))
    client = env.execute_async("flink-checkpoint-bench")
    job_id = str(client.get_job_id())
    try:
        deadline = time.time() + 120
        while True:  # the warm-up starts once every task runs (PyFlink starts its Python workers first)
            try:
                vertices = rest(port, f"/jobs/{job_id}")["vertices"]
            except OSError:
                vertices = []
            if vertices and all(v["status"] == "RUNNING" for v in vertices):
                break
            if time.time() > deadline:
                try:
                    state = rest(port, f"/jobs/{job_id}")["state"]
                    causes = rest(port, f"/jobs/{job_id}/exceptions").get("exceptionHistory", {})
                except OSError as exc:
                    state, causes = f"unknown ({exc})", {}
                raise RuntimeError(f"the Flink job's tasks were not all RUNNING within 120 s: job {state}, "
                                   f"vertices {[(v['name'], v['status']) for v in vertices]}, "
                                   f"exceptions {json.dumps(causes)[:3000]}")
            time.sleep(0.2)
        window, history = checkpoints_in_window(port, job_id, time.time(), args.warmup, args.seconds)
    finally:
        client.cancel()
    durations = [h["end_to_end_duration"] / 1000 for h in window if h["status"] == "COMPLETED"]
    failed = sum(1 for h in window if h["status"] == "FAILED")
    if args.verbose:
        print(json.dumps(rest(port, f"/jobs/{job_id}/checkpoints")["counts"]), file=sys.stderr)
        for h in history:
            print(h["id"], h["status"], h["trigger_timestamp"], h.get("end_to_end_duration"), file=sys.stderr)
    print(json.dumps({"engine": "flink", "mode": args.mode, "completed": len(durations), "failed": failed,
                      "durations_s": sorted(durations), "warmup_s": args.warmup, "seconds": args.seconds,
                      "cost_us": args.cost_us, "debloat": args.debloat}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
