#!/usr/bin/env python
"""The join benchmark's interval join on Apache Flink (PyFlink 2.x), for side-by-side figures.

Run with the Python of a venv that has `apache-flink` installed (never Sluice's); scripts/bench_joins.py
starts it as a subprocess with `--flink-python`. The same shape and records as `bench_joins:build`: two
sources (parallelism 2; NumberSequenceSource mapped in Python to (key, seq, event_time_ms) with the same fixed
hashes as Sluice's job, event time 1_700_000_000_000 + seq, monotonous watermarks), keyed by key, joined by a
KeyedCoProcessFunction in Python (parallelism 2) that is Flink's IntervalJoinOperator algorithm (MapState
buffers per side, event-time clean-up timers; PyFlink's DataStream API has no interval_join of its own), into
a discarding sink. Each pair costs a busy-wait of `--cost-us`. With `--window-ms W` the KeyedCoProcessFunction
is a window join instead (Flink's WindowJoinOperator algorithm: both sides' records kept per key and tumbling
window of W ms, a timer at the window's end - 1 that pairs them and drops them), for
scripts/bench_window_join.py.

--mode throughput: `--records` per side, no checkpoints; prints records (both sides) per second of the job's
net run time. --mode checkpoint: unbounded sources, unaligned checkpoints every `--interval` s under the
backpressure the per-pair cost makes; after `--warmup` s, the durations of the checkpoints triggered in the
next `--seconds` s (trigger to last acknowledgement) from the mini cluster's REST API.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from flink_common import checkpoints_in_window, discarding_sink, enable_checkpoints, local_environment

T0 = 1_700_000_000_000


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=("throughput", "checkpoint"), default="throughput")
    parser.add_argument("--records", type=int, default=200_000, help="per side (throughput)")
    parser.add_argument("--keys", type=int, default=100)
    parser.add_argument("--lower", type=int, default=-5)
    parser.add_argument("--upper", type=int, default=5)
    parser.add_argument("--window-ms", type=int, default=0, help="> 0: a tumbling window join of this size")
    parser.add_argument("--cost-us", type=float, default=0.0)
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--warmup", type=float, default=8.0)
    parser.add_argument("--seconds", type=float, default=12.0)
    parser.add_argument("--parallelism", type=int, default=2)
    args = parser.parse_args(argv)

    from pyflink.common import Duration, Types, WatermarkStrategy  # only in the Flink venv
    from pyflink.common.watermark_strategy import TimestampAssigner
    from pyflink.datastream import KeyedCoProcessFunction
    from pyflink.datastream.connectors.number_seq import NumberSequenceSource
    from pyflink.datastream.state import MapStateDescriptor

    env, port = local_environment(args.parallelism, {"python.client.executable": sys.executable})
    if args.mode == "checkpoint":
        enable_checkpoints(env, args.interval, unaligned=True)
    keys, lower, upper, cost_s = args.keys, args.lower, args.upper, args.cost_us / 1e6
    left_keep, right_keep = max(upper, 0), max(-lower, 0)
    row = Types.TUPLE([Types.STRING(), Types.LONG(), Types.LONG()])

    def left_record(seq: int) -> tuple[str, int, int]:
        return f"k{(seq * 2654435761) % keys:03d}", seq, T0 + seq

    def right_record(seq: int) -> tuple[str, int, int]:
        return f"k{(seq * 40503 + 17) % keys:03d}", seq, T0 + seq

    class EventTime(TimestampAssigner):  # type: ignore[misc]
        def extract_timestamp(self, value: Any, record_timestamp: int) -> int:
            return int(value[2])

    class IntervalJoin(KeyedCoProcessFunction):  # type: ignore[misc]
        """Flink's IntervalJoinOperator in Python: buffer per side by timestamp, join on arrival, clean up
        when the watermark passes the end of a record's interval."""

        def open(self, runtime_context: Any) -> None:
            entries = Types.PICKLED_BYTE_ARRAY()  # a list of records per timestamp
            self.left = runtime_context.get_map_state(MapStateDescriptor("left", Types.LONG(), entries))
            self.right = runtime_context.get_map_state(MapStateDescriptor("right", Types.LONG(), entries))

        def _join(self, value: Any, ctx: Any, is_left: bool) -> Any:
            ts = value[2]
            if ts <= ctx.timer_service().current_watermark():
                return
            own, other = (self.left, self.right) if is_left else (self.right, self.left)
            low, high = (ts + lower, ts + upper) if is_left else (ts - upper, ts - lower)
            for other_ts, entries in other.items():
                if low <= other_ts <= high:
                    for o in entries:
                        end = time.perf_counter() + cost_s
                        while time.perf_counter() < end:
                            pass
                        yield (value[0], value[1], o[1]) if is_left else (value[0], o[1], value[1])
            own.put(ts, [*(own.get(ts) or []), value])
            ctx.timer_service().register_event_time_timer(ts + (left_keep if is_left else right_keep))

        def process_element1(self, value: Any, ctx: Any) -> Any:
            yield from self._join(value, ctx, True)

        def process_element2(self, value: Any, ctx: Any) -> Any:
            yield from self._join(value, ctx, False)

        def on_timer(self, timestamp: int, ctx: Any) -> Any:
            self.left.remove(timestamp - left_keep)
            self.right.remove(timestamp - right_keep)
            return iter(())

    class WindowJoin(KeyedCoProcessFunction):  # type: ignore[misc]
        """Flink's WindowJoinOperator in Python: both sides' records per window end, joined and dropped when the
        watermark passes the window."""

        def open(self, runtime_context: Any) -> None:
            entries = Types.PICKLED_BYTE_ARRAY()  # a list of records per window end
            self.left = runtime_context.get_map_state(MapStateDescriptor("left", Types.LONG(), entries))
            self.right = runtime_context.get_map_state(MapStateDescriptor("right", Types.LONG(), entries))

        def _add(self, value: Any, ctx: Any, own: Any) -> None:
            end = value[2] - value[2] % window_ms + window_ms
            if end - 1 <= ctx.timer_service().current_watermark():
                return  # its window fired: late, dropped as Flink SQL's window join drops it
            own.put(end, [*(own.get(end) or []), value])
            ctx.timer_service().register_event_time_timer(end - 1)

        def process_element1(self, value: Any, ctx: Any) -> Any:
            self._add(value, ctx, self.left)
            return iter(())

        def process_element2(self, value: Any, ctx: Any) -> Any:
            self._add(value, ctx, self.right)
            return iter(())

        def on_timer(self, timestamp: int, ctx: Any) -> Any:
            lefts, rights = self.left.get(timestamp + 1) or [], self.right.get(timestamp + 1) or []
            self.left.remove(timestamp + 1)
            self.right.remove(timestamp + 1)
            for left in lefts:
                for right in rights:
                    yield left[0], left[1], right[1]

    window_ms = args.window_ms
    end = args.records - 1 if args.mode == "throughput" else 2**62
    watermarks = WatermarkStrategy.for_bounded_out_of_orderness(Duration.of_millis(0)) \
        .with_timestamp_assigner(EventTime())
    left = env.from_source(NumberSequenceSource(0, end), WatermarkStrategy.no_watermarks(), "left") \
        .map(left_record, output_type=row).assign_timestamps_and_watermarks(watermarks)
    right = env.from_source(NumberSequenceSource(0, end), WatermarkStrategy.no_watermarks(), "right") \
        .map(right_record, output_type=row).assign_timestamps_and_watermarks(watermarks)
    discard = discarding_sink()
    (left.key_by(lambda r: r[0], key_type=Types.STRING())
        .connect(right.key_by(lambda r: r[0], key_type=Types.STRING()))
        .process(WindowJoin() if window_ms else IntervalJoin(), output_type=row)
        .sink_to(discard))

    if args.mode == "throughput":
        result = env.execute("flink-interval-join-throughput")
        net_s = result.get_net_runtime() / 1000.0
        print(json.dumps({"engine": "flink", "mode": "throughput", "records": 2 * args.records, "net_runtime_s": net_s,
                          "records_per_s": 2 * args.records / net_s}))
        return 0
    client = env.execute_async("flink-interval-join-checkpoints")
    job_id = str(client.get_job_id())
    try:
        window, _ = checkpoints_in_window(port, job_id, time.time(), args.warmup, args.seconds)
    finally:
        client.cancel()
    durations = [h["end_to_end_duration"] / 1000 for h in window if h["status"] == "COMPLETED"]
    print(json.dumps({"engine": "flink", "mode": "checkpoint", "completed": len(durations),
                      "failed": sum(1 for h in window if h["status"] == "FAILED"),
                      "durations_s": sorted(durations), "inflight_bytes": [h.get("persisted_data") for h in window]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
