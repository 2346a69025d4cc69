"""What seeing where time goes costs (issue 32): the coordinator's CPU to trace one checkpoint, and a profile's
cost to the process it samples.

1. Tracing: for a checkpoint of N tasks (N = 4, 100, 1000), the CPU time (of the calling thread) to build its span
   records (coordinator/trace_spans.py, pure) and to make the OpenTelemetry SDK's spans of them
   (coordinator/telemetry.py `emit`), which the telemetry's own thread spends, and what the coordinator's event
   loop spends to hand a trace to that thread (`submit`); exported to the tests' OTLP receiver
   (tests/support/otlp_receiver.py). Medians and the slowest of R runs.
2. Profiling: a busy Python process (a fixed CPU cost per step, counting its steps) sampled by the worker's
   Profiler (py-spy, --nonblocking, 100 Hz) for W seconds, alternating with W seconds unsampled, ROUNDS times:
   its steps per second in both, medians, the ratio measured in one run; and py-spy's own CPU per second of
   sampling (it does not stop the process it samples: its cost is that CPU, taken from the same cores).

    .venv/bin/python scripts/bench_observability.py [--runs 20] [--window 4] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from coordinator.checkpointing import CheckpointSummary, Status  # noqa: E402
from coordinator.telemetry import OtlpSettings, Telemetry  # noqa: E402
from coordinator.trace_spans import checkpoint_span  # noqa: E402
from runtime.graph.checkpoint_figures import CheckpointFigures, TaskCheckpointFigures  # noqa: E402
from runtime.graph.enums import CheckpointMode  # noqa: E402
from runtime.worker.profiler import Profiler, find_py_spy  # noqa: E402
from tests.support.otlp_receiver import otlp_receiver  # noqa: E402

BUSY = """
import sys, time
end = time.monotonic() + float(sys.argv[1])
while time.monotonic() < end:
    t0 = time.monotonic()
    steps = 0
    while time.monotonic() - t0 < 0.5:
        sum(i * i for i in range(2000))
        steps += 1
    print(f"{time.time():.3f} {steps / (time.monotonic() - t0):.1f}", flush=True)
"""


def tracing(runs: int) -> None:
    figures = TaskCheckpointFigures(start_delay_s=0.01, first_barrier_s=0.01, last_barrier_s=0.05, alignment_s=0.04,
                                    sync_s=0.002, async_s=0.2, state_bytes=1000)
    print("tasks  spans  build ms (median/slowest)  SDK spans ms (median/slowest)  on the loop ms (median/slowest)")
    with otlp_receiver() as receiver:
        telemetry = Telemetry(OtlpSettings(receiver.endpoint), collectors=(), instance_id="bench")
        for n in (4, 100, 1000):
            tasks = {f"{i // 10}:{i % 10}": figures for i in range(n)}
            summary = CheckpointSummary(1, Status.COMPLETED, CheckpointMode.ALIGNED, False, time.monotonic(), 0.3,
                                        CheckpointFigures.of(tasks.values()))
            build, emit, loop = [], [], []
            for _ in range(runs):
                # this thread's CPU only (the exporter's thread encodes and sends meanwhile)
                t0 = time.thread_time()
                span = checkpoint_span(summary, tasks, job_id="j", attempt=0, wall_offset_s=time.time())
                t1 = time.thread_time()
                assert span is not None
                telemetry.emit(span)
                t2 = time.thread_time()
                # what the coordinator's event loop pays: the builder handed to the telemetry's thread
                telemetry.submit(lambda: None)
                t3 = time.thread_time()
                build.append((t1 - t0) * 1000)
                emit.append((t2 - t1) * 1000)
                loop.append((t3 - t2) * 1000)
                time.sleep(0.4 if n >= 1000 else 0.05)  # the exporter's thread sends in between
            print(f"{n:5d}  {len(span.walk()):5d}  {statistics.median(build):8.2f} / {max(build):7.2f}      "
                  f"{statistics.median(emit):8.2f} / {max(emit):7.2f}            "
                  f"{statistics.median(loop):.3f} / {max(loop):.3f}")
        asyncio.run(telemetry.shutdown())
        print(f"received {len(receiver.spans())} spans, {len(receiver.bad_requests)} bad requests")


def profiling(window_s: float, rounds: int) -> None:
    executable = find_py_spy()
    if executable is None:
        print("py-spy is not installed: skipping the profile's cost")
        return
    total = rounds * 2 * window_s + 2
    busy = subprocess.Popen([sys.executable, "-c", BUSY, str(total)], stdout=subprocess.PIPE, text=True)
    profiler = Profiler(executable=executable, pid=busy.pid)
    windows: list[tuple[str, float, float]] = []
    spy_cpu: list[float] = []  # py-spy's CPU seconds per second it sampled

    async def alternate() -> None:
        await asyncio.sleep(1.0)  # the first half second of the busy loop is its warm-up
        for _ in range(rounds):
            t0 = time.time()
            await asyncio.sleep(window_s)
            windows.append(("off", t0, time.time()))
            t0 = time.time()
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            profile = await profiler.record(int(window_s))
            after = resource.getrusage(resource.RUSAGE_CHILDREN)  # py-spy's, once it has exited
            windows.append(("on", t0, time.time()))
            spy_cpu.append((after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime) / int(window_s))
            assert profile.samples > 0

    try:
        asyncio.run(alternate())
        out, _ = busy.communicate(timeout=total + 30)
    finally:
        if busy.poll() is None:
            busy.kill()
            busy.wait()
    slices = [(float(a), float(b)) for a, b in (line.split() for line in out.splitlines())]
    rates: dict[str, list[float]] = {"off": [], "on": []}
    for kind, start, end in windows:
        inside = [rate for at, rate in slices if start + 0.5 <= at <= end]  # slices that ended inside it
        rates[kind].append(statistics.median(inside))
    off, on = statistics.median(rates["off"]), statistics.median(rates["on"])
    print(f"busy loop steps/s, {rounds} windows of {window_s:g} s each: unsampled median {off:.1f} "
          f"(slowest {min(rates['off']):.1f}), sampled by py-spy median {on:.1f} (slowest {min(rates['on']):.1f}); "
          f"sampled/unsampled {on / off:.3f}")
    print(f"py-spy's own CPU per second of sampling (100 Hz, --nonblocking): median {statistics.median(spy_cpu):.3f} s "
          f"(most {max(spy_cpu):.3f} s)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--window", type=float, default=4.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    tracing(args.runs)
    profiling(args.window, args.rounds)


if __name__ == "__main__":
    main()
