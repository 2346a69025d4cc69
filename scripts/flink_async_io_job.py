#!/usr/bin/env python
"""The async I/O benchmark's `sleep` job on Apache Flink (PyFlink 2.x), for a side-by-side figure.

Run with the Python of a venv that has `apache-flink` installed (never Sluice's); scripts/bench_async_io.py starts
it with `--flink-python`. The same shape as Sluice's `sleep` job (runtime/examples/enrich.py,
`build_bench_async_sleep`): `--records` integers at parallelism 1 -> `AsyncDataStream.unordered_wait` with an
`async def` function that awaits `asyncio.sleep(--latency-ms)` (capacity `--capacity`, timeout 60 s) -> Flink's
discarding sink. A sleep, not the HTTP lookup service: PyFlink 2.3's async operator left calls doing socket I/O on
its loop unanswered until their timeout here (about capacity - 2 calls stalled in each try, at capacities 10,
50 and 100), so the engines are compared on the machinery alone: capacity / latency is the ceiling for both.

Prints one JSON line: records, the job's net run time (JobExecutionResult.getNetRuntime: from the job's start to
its end, deployment included) and records per second over it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def sleeping_function(latency_s: float) -> Any:
    import asyncio

    from pyflink.datastream.functions import AsyncFunction

    class Sleep(AsyncFunction):
        async def async_invoke(self, value: Any) -> list[Any]:
            await asyncio.sleep(latency_s)
            return [value]

    return Sleep()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=30_000)
    parser.add_argument("--capacity", type=int, default=100)
    parser.add_argument("--latency-ms", type=float, default=20.0)
    args = parser.parse_args(argv)

    from flink_common import discarding_sink, local_environment  # only in the Flink venv
    from pyflink.common import Time, Types
    from pyflink.datastream import AsyncDataStream

    env, _ = local_environment(1)
    rows = env.from_collection(list(range(args.records)), type_info=Types.LONG())
    out = AsyncDataStream.unordered_wait(rows, sleeping_function(args.latency_ms / 1000), Time.seconds(60),
                                         args.capacity, Types.LONG())
    out.sink_to(discarding_sink())
    t0 = time.monotonic()
    client = env.execute_async("bench-async-io")
    net_ms = client.get_job_execution_result().result().get_net_runtime()
    print(json.dumps({"records": args.records, "capacity": args.capacity, "net_runtime_s": net_ms / 1000.0,
                      "submit_to_end_s": time.monotonic() - t0, "records_per_s": args.records / (net_ms / 1000.0)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
