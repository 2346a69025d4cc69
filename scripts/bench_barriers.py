#!/usr/bin/env python
"""A checkpoint barrier across an all-to-all edge's channels, in one process: CPU per channel, each side.

What a 1,000-task checkpoint of scripts/bench_scale.py waits for (issue 32): at P = 500 each count task aligns
500 barriers per checkpoint, and each source-side task emits one into each of its 500 subpartitions. Here a
source-like task (GeneratorSource -> hash writer into N subpartitions, never run: only its checkpoints are)
emits checkpoint barriers into N subpartitions, and a count task (keyed Count -> DiscardSink, running) receives
them on N input channels and aligns (or not). The two sit on two `NetworkEnvironment`s joined by a real TCP
link on 127.0.0.1, as two workers are: the real Subpartition, ChannelSender, Link, Connection (frames,
msgpack), InputGate, CreditLedger, Task, TaskCheckpoints, BarrierHandler and TaskCheckpointer.

Per checkpoint the event loop's thread CPU (time.thread_time: the task's own thread and the checkpoint
writer's are left out) is taken on each side:

- sender: the trigger's snapshot (one barrier queued on each subpartition) and the link's flush that frames
  and writes them;
- receiver: from there until the count task acknowledges: the frames decoded, each barrier delivered to the
  gate, taken (aligned) or mailed (unaligned, the priority lane), handed to the barrier handler, the channel
  blocked, and once all are in the snapshot, the unblock and the acknowledgement.

Divided by N: CPU microseconds per channel per checkpoint. The first checkpoints warm up and are left out.

With --idle-channels M it also times what an idle worker pays per period over M output subpartitions (2,500
for a worker of 10 tasks at P = 500): a task's flush tick (`Task._tick`, no record written since the last) and
one buffer sizing pass (`InflightBound.adjust`, no byte moved), CPU per pass.

    .venv/bin/python scripts/bench_barriers.py --channels 500 --checkpoints 30 --repeat 5 --idle-channels 2500
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from netstack.credit import ChannelSender  # noqa: E402
from netstack.transport import run as run_loop  # noqa: E402
from runtime.api import DiscardSink, GeneratorSource, Job  # noqa: E402
from runtime.checkpointing.barriers import BarrierSpec  # noqa: E402
from runtime.checkpointing.checkpointer import TaskCheckpointer  # noqa: E402
from runtime.checkpointing.task_checkpoints import TaskCheckpoints  # noqa: E402
from runtime.checkpointing.writer import CheckpointWriter  # noqa: E402
from runtime.examples.wordcount import Count  # noqa: E402
from runtime.execution.channels import InputChannel, OutputGate, Subpartition  # noqa: E402
from runtime.execution.inflight import InflightBound  # noqa: E402
from runtime.execution.operators import Chain, RecordWriter  # noqa: E402
from runtime.execution.task import Credits, Task, TaskKey  # noqa: E402
from runtime.graph.checkpoint_options import CheckpointOptions  # noqa: E402
from runtime.graph.enums import CheckpointMode  # noqa: E402
from runtime.worker.network import NetworkEnvironment  # noqa: E402

TOKEN = "bench"
CREDITS = Credits(2, 8)  # the worker's defaults (runtime/graph/job_config.py ChannelConfig)
CAPACITY = 32 * 1024
BUFFERS_PER_CHANNEL = 4
WARM_UP = 3
WAIT_S = 60.0


def _job() -> Job:
    job = Job("bench")
    (job.source(GeneratorSource(count=None, keys=1000, seed=7), parallelism=1)
        .key_by(lambda r: r[0]).process(Count(), parallelism=1).sink(DiscardSink(), parallelism=1))
    return job


class Pair:
    """The sending task on worker "a", the receiving task on worker "b", N channels between them over TCP."""

    def __init__(self, n: int, directory: str) -> None:
        self.n = n
        self.directory = directory
        self.acked: dict[int, asyncio.Future[None]] = {}

    async def start(self) -> None:
        self.a = NetworkEnvironment("a", token=TOKEN, host="127.0.0.1", link_timeout_s=None)
        self.b = NetworkEnvironment("b", token=TOKEN, host="127.0.0.1", link_timeout_s=None)
        await self.a.start(0)
        port_b = await self.b.start(0)
        self.writer = CheckpointWriter()
        n = self.n
        # the sender: a source task with N subpartitions
        subs = [Subpartition(ChannelSender(c), limit=BUFFERS_PER_CHANNEL, capacity=CAPACITY) for c in range(n)]
        gate = OutputGate()
        for c, sub in enumerate(subs):
            sub.gate = gate
            sub.key = f"0:0:{c}"
            self.a.register_outbound(c, "b", sub)
        job = _job()
        head = job.nodes[0]
        writer = RecordWriter(subs, "hash", lambda r: r[0], job.max_parallelism, 0)
        chain = Chain(job, [head.id], subtask_index=0, parallelism=1, attempt=0, outputs=[writer])
        self.source = Task(key=TaskKey("bench", 0, 0, "source", 1), chain=chain, outputs=subs, output_gate=gate,
                           inputs=[], credits=CREDITS, source=head.payload, flush_timeout_s=0.05,
                           checkpoints=self._listener)
        self.source_checkpoints: TaskCheckpoints = self._last
        # the receiver: a count task with N input channels
        job = _job()
        chain = Chain(job, [nd.id for nd in job.nodes[1:]], subtask_index=0, parallelism=1, attempt=0, outputs=[])
        inputs = [InputChannel(c, c, 0, f"0:{c}", key=f"0:{c}:0") for c in range(n)]
        self.count = Task(key=TaskKey("bench", 1, 0, "count", 1), chain=chain, outputs=[], output_gate=OutputGate(),
                          inputs=inputs, credits=CREDITS, source=None, flush_timeout_s=0.05,
                          checkpoints=self._listener)
        gate_in = self.count.gate
        assert gate_in is not None
        for c in range(n):
            self.b.register_inbound(c, "a", gate_in)
        self.link = await self.a.link_to("b", "127.0.0.1", port_b)
        link_b = await self.b.link_to("a", "127.0.0.1", self.a.port)
        for sub in subs:
            sub.link = self.link
        for ch in gate_in.channels.values():
            ch.send_credit = (lambda cid: lambda k: link_b.send_credit(cid, k))(ch.channel_id)
        self.running = asyncio.ensure_future(self.count.run())

    def _listener(self, task: Task) -> TaskCheckpoints:
        checkpointer = TaskCheckpointer(task, self.writer, task_key=task.key.vertex_subtask, max_parallelism=128,
                                        on_ack=self._on_ack, on_decline=self._on_decline)
        self._last = TaskCheckpoints(task, checkpointer)
        return self._last

    def _on_ack(self, task: Task, spec: BarrierSpec, files: dict[str, Any], figures: Any) -> None:
        if task is self.count:
            fut = self.acked.get(spec.checkpoint_id)
            if fut is not None and not fut.done():
                fut.set_result(None)

    def _on_decline(self, task: Task, checkpoint_id: int, reason: str) -> None:
        fut = self.acked.get(checkpoint_id)
        if fut is not None and not fut.done():
            fut.set_exception(RuntimeError(f"checkpoint {checkpoint_id} declined by {task.task_id}: {reason}"))

    async def checkpoint(self, checkpoint_id: int, mode: CheckpointMode) -> tuple[float, float]:
        """One checkpoint across the N channels: (sender CPU s, receiver CPU s) of the loop's thread."""
        spec = BarrierSpec(checkpoint_id, time.time(), CheckpointOptions(mode=mode), self.directory)
        done = self.acked[checkpoint_id] = asyncio.get_running_loop().create_future()
        t0 = time.thread_time()
        self.source_checkpoints._trigger(spec)  # the trigger's mail, run as the task's turn runs it
        self.link._flush()  # what the link's scheduled flush does: frame and write every queued barrier
        t1 = time.thread_time()
        async with asyncio.timeout(WAIT_S):
            await done
        t2 = time.thread_time()
        return t1 - t0, t2 - t1

    async def stop(self) -> None:
        self.count.cancel()
        try:
            await self.running
        except BaseException:  # noqa: BLE001 - cancelled on purpose
            pass
        await self.a.close()
        await self.b.close()


async def run_mode(n: int, checkpoints: int, mode: CheckpointMode) -> tuple[float, float]:
    """Median sender and receiver CPU us per channel over `checkpoints` checkpoints (warm-up left out)."""
    with tempfile.TemporaryDirectory(prefix="bench-barriers-") as directory:
        pair = Pair(n, directory)
        await pair.start()
        try:
            sender, receiver = [], []
            for k in range(1, checkpoints + WARM_UP + 1):
                s, r = await pair.checkpoint(k, mode)
                if k > WARM_UP:
                    sender.append(s / n * 1e6)
                    receiver.append(r / n * 1e6)
        finally:
            await pair.stop()
    return statistics.median(sender), statistics.median(receiver)


def idle_passes(m: int, passes: int = 200) -> tuple[float, float]:
    """CPU us of one flush tick and one sizing pass over `m` idle subpartitions (after a first pass of each)."""
    subs = [Subpartition(ChannelSender(c), limit=BUFFERS_PER_CHANNEL, capacity=CAPACITY) for c in range(m)]
    gate = OutputGate()
    for sub in subs:
        sub.gate = gate
    job = _job()
    head = job.nodes[0]
    chain = Chain(job, [head.id], subtask_index=0, parallelism=1, attempt=0,
                  outputs=[RecordWriter(subs, "hash", lambda r: r[0], job.max_parallelism, 0)])
    task = Task(key=TaskKey("bench", 0, 0, "source", 1), chain=chain, outputs=subs, output_gate=gate, inputs=[],
                credits=CREDITS, source=head.payload, flush_timeout_s=0.05)
    bound = InflightBound(subs, target_s=1.0, buffers_in_path=BUFFERS_PER_CHANNEL + CREDITS.exclusive
                          + CREDITS.floating, max_bytes=CAPACITY)
    for sub in subs:  # each channel has moved once: an estimate, as on a worker that has run a while
        sub.append(b"\x01")
    task._tick()
    bound.adjust(0.0)
    for sub in subs:
        sub.bytes_out += 1000
    bound.adjust(1.0)
    t0 = time.thread_time()
    for _ in range(passes):
        task._tick()
    t1 = time.thread_time()
    for k in range(passes):
        bound.adjust(2.0 + k)
    t2 = time.thread_time()
    return (t1 - t0) / passes * 1e6, (t2 - t1) / passes * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--channels", type=int, default=500)
    parser.add_argument("--checkpoints", type=int, default=30, help="measured per run (after 3 to warm up)")
    parser.add_argument("--repeat", type=int, default=5, help="runs per mode, alternating (default 5)")
    parser.add_argument("--modes", nargs="+", default=["aligned", "unaligned"])
    parser.add_argument("--idle-channels", type=int, default=0, help="also time idle passes over this many")
    args = parser.parse_args(argv)
    sys.setswitchinterval(0.005)  # the worker's (runtime/worker/worker.py run_worker)
    modes = [CheckpointMode(m) for m in args.modes]
    figures: dict[CheckpointMode, tuple[list[float], list[float]]] = {m: ([], []) for m in modes}
    print(f"bench_barriers: {args.channels} channels, {args.checkpoints} checkpoints x {args.repeat} runs; "
          f"{os.cpu_count()} cpus, load {os.getloadavg()[0]:.1f}, Python {sys.version.split()[0]}")
    for r in range(args.repeat):
        for mode in modes:
            s, rcv = run_loop(run_mode(args.channels, args.checkpoints, mode))
            figures[mode][0].append(s)
            figures[mode][1].append(rcv)
            print(f"  run {r + 1}: {mode.value:9s} sender {s:6.2f}  receiver {rcv:6.2f} CPU us/channel")
    if args.idle_channels:
        passes = [idle_passes(args.idle_channels) for _ in range(args.repeat)]
        ticks, sizing = [t for t, _ in passes], [z for _, z in passes]
        print(f"idle, {args.idle_channels} subpartitions, CPU us per pass, median of {args.repeat} (slowest): "
              f"flush tick {statistics.median(ticks):.1f} ({max(ticks):.1f}), sizing pass "
              f"{statistics.median(sizing):.1f} ({max(sizing):.1f})")
    print(f"load {os.getloadavg()[0]:.1f}")
    for mode in modes:
        sent, received = figures[mode]
        print(f"{mode.value:9s} CPU us per channel per checkpoint, median of {len(sent)} runs (slowest): "
              f"sender {statistics.median(sent):.2f} ({max(sent):.2f}), receiver {statistics.median(received):.2f} "
              f"({max(received):.2f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
