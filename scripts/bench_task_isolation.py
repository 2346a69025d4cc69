#!/usr/bin/env python
"""The cost of running tasks on their threads, in one process: CPU per record of the keyed count's tasks.

A source task (GeneratorSource -> hash writer into 2 subpartitions of 32 KiB buffers, 4 buffers a channel)
and two count tasks (keyed Count -> DiscardSink), joined by LocalLinks with the worker's credits, all on one
event loop with the worker's GIL switch interval (5 ms): the real Task, InputProcessor and SourceDriver,
without the network. Each repetition runs the same records in each mode, alternating: `inline` (every task on
the loop, `SLUICE_TASK_ISOLATION=inline`), `thread` (every task on its thread, the default: a run that held
the GIL is waited for with the loop blocked, runtime/execution/handover.py) and `awaited` (on threads, every
run awaited: `SLUICE_SYNC_WAIT_S=0`); CPU time is the process's (all threads), so the figure holds on a busy
machine better than a rate does.

`--async-state`: the count tasks count with AsyncCount (runtime/examples/wordcount.py, asynchronous state on the
memory backend), so each runs its chain on a loop of its own (runtime/execution/user_loop.py); the modes are
`blocked` (the default: UserLoop.call waits for a run blocked when the last one held the GIL and no record is
in flight) and `awaited` (`SLUICE_SYNC_WAIT_S=0`), the order swapped every round.

    .venv/bin/python scripts/bench_task_isolation.py --records 1000000 --repeat 5
    .venv/bin/python scripts/bench_task_isolation.py --async-state --records 200000 --repeat 8
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from netstack.credit import ChannelSender  # noqa: E402
from runtime.api import DiscardSink, GeneratorSource, Job  # noqa: E402
from runtime.examples.wordcount import AsyncCount, Count  # noqa: E402
from runtime.execution.channels import InputChannel, LocalLink, OutputGate, Subpartition  # noqa: E402
from runtime.execution.isolation import IsolationSettings  # noqa: E402
from runtime.execution.operators import Chain, RecordWriter  # noqa: E402
from runtime.execution.task import Credits, Task, TaskKey  # noqa: E402
from runtime.graph.partitioning import key_group_range  # noqa: E402
from runtime.state.memory import MemoryBackend  # noqa: E402

CAPACITY = 32 * 1024
BUFFERS_PER_CHANNEL = 4
CREDITS = Credits(2, 8)


def _job(records: int, asynchronous: bool = False) -> Job:
    job = Job("bench")
    (job.source(GeneratorSource(count=records, keys=1000, seed=7), parallelism=1)
        .key_by(lambda r: r[0]).process(AsyncCount() if asynchronous else Count(), parallelism=2)
        .sink(DiscardSink(), parallelism=2))
    return job


async def run_once(records: int, isolation: IsolationSettings, *,
                   asynchronous: bool = False) -> tuple[float, float, int, list[int]]:
    """(CPU s, wall s, records counted, [runs waited for blocked, runs] on the count tasks' own loops) of one run
    of the three tasks."""
    source_job = _job(records)
    subs = []
    for j in range(2):
        sub = Subpartition(ChannelSender(j), limit=BUFFERS_PER_CHANNEL, capacity=CAPACITY)
        subs.append(sub)
    gate = OutputGate()
    for sub in subs:
        sub.gate = gate
    writer = RecordWriter(subs, "hash", lambda r: r[0], source_job.max_parallelism, 0)
    head = source_job.nodes[0]
    source_chain = Chain(source_job, [head.id], subtask_index=0, parallelism=1, attempt=0, outputs=[writer])
    source = Task(key=TaskKey("bench", 0, 0, "source", 1), chain=source_chain, outputs=subs, output_gate=gate,
                  inputs=[], credits=CREDITS, source=head.payload, flush_timeout_s=0.05,
                  isolation=isolation)
    counts = []
    for j in range(2):
        job = _job(records, asynchronous)  # one job graph per task, as the worker builds them
        # asynchronous state needs a backend object: the memory backend's, as the worker gives the task one
        backend = MemoryBackend(key_group_range(job.max_parallelism, 2, j)) if asynchronous else None
        chain = Chain(job, [n.id for n in job.nodes[1:]], subtask_index=j, parallelism=2, attempt=0, outputs=[],
                      state_backend=backend)
        task = Task(key=TaskKey("bench", 1, j, "count", 2), chain=chain, outputs=[], output_gate=OutputGate(),
                    inputs=[InputChannel(j, 0, 0, "0:0")], credits=CREDITS, source=None, flush_timeout_s=0.05,
                    isolation=isolation)
        assert task.gate is not None
        link = LocalLink(j, subs[j], task.gate)
        subs[j].link = link
        task.gate.channels[j].send_credit = link.send_credit
        counts.append(task)
    blocked = [0, 0]  # runs on the tasks' own loops: waited for blocked, all

    def count_blocked(task: Task) -> None:  # the loop of a task with an asynchronous operator, before it stops
        if task._user_loop is not None:
            blocked[0] += task._user_loop.waited_blocked
            blocked[1] += task._user_loop.runs

    for task in counts:
        task.on_end_of_input = count_blocked
    cpu0, wall0 = time.process_time(), time.perf_counter()
    await asyncio.gather(source.run(), *(t.run() for t in counts))
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    return cpu, wall, sum(t.records_in for t in counts), blocked


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=5, help="runs of each mode, alternating (default 5)")
    parser.add_argument("--async-state", action="store_true",
                        help="count with asynchronous state: blocked vs awaited runs on the tasks' own loops")
    args = parser.parse_args(argv)
    sys.setswitchinterval(0.005)  # the worker's (runtime/worker/worker.py run_worker)
    try:
        import uvloop
        uvloop.install()
        loop_name = "uvloop"
    except ImportError:
        loop_name = "asyncio"
    modes = ("blocked", "awaited") if args.async_state else ("inline", "thread", "awaited")
    cpu: dict[str, list[float]] = {m: [] for m in modes}
    wall: dict[str, list[float]] = {m: [] for m in modes}
    print(f"bench_task_isolation{' --async-state' if args.async_state else ''}: {args.records:,} records x "
          f"{args.repeat}; {os.cpu_count()} cpus, Python {sys.version.split()[0]}, {loop_name}")
    for r in range(args.repeat):
        order = modes if not args.async_state or r % 2 == 0 else tuple(reversed(modes))
        for mode in order:
            settings = (IsolationSettings("inline") if mode == "inline" else
                        IsolationSettings(sync_wait_s=0.0) if mode == "awaited" else IsolationSettings())
            c, w, n, blocked = asyncio.run(run_once(args.records, settings, asynchronous=args.async_state))
            assert n == args.records, (mode, n)
            cpu[mode].append(c / n * 1e6)
            wall[mode].append(w / n * 1e6)
            extra = f", {blocked[0]} of {blocked[1]} runs waited for blocked" if args.async_state else ""
            print(f"  run {r + 1}: {mode:7s} {cpu[mode][-1]:.3f} CPU us/record, {wall[mode][-1]:.3f} wall "
                  f"us/record{extra}", flush=True)
    base = modes[-1] if args.async_state else "inline"
    med = {m: statistics.median(v) for m, v in cpu.items()}
    for mode in modes:
        print(f"median CPU us/record {mode:7s} {med[mode]:.3f} ({(med[mode] / med[base] - 1) * 100:+.1f} % of "
              f"{base}), slowest {max(cpu[mode]):.3f}; median wall {statistics.median(wall[mode]):.3f} us/record")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
