"""Turning a plan into this worker's tasks and wiring their channels.

For every logical channel of the plan that touches this worker: the producer
side gets a `Subpartition`, the consumer side an `InputChannel` in the
task's gate; a channel with both ends here gets a `LocalLink`, otherwise the
channel rides the TCP link to the peer worker.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass, field

from netstack.credit import ChannelSender
from netstack.transport import Link
from runtime.api import Job
from runtime.checkpointing.checkpointer import AckCallback, DeclineCallback, TaskCheckpointer
from runtime.checkpointing.snapshots import channel_key
from runtime.checkpointing.task_checkpoints import TaskCheckpoints
from runtime.checkpointing.writer import CheckpointWriter
from runtime.execution.async_operator import AsyncStateSettings
from runtime.execution.channels import InputChannel, LocalLink, OutputGate, Subpartition
from runtime.execution.inflight import ADJUST_PERIOD_S, InflightBound
from runtime.execution.isolation import IsolationSettings
from runtime.execution.operators import Chain, RecordWriter
from runtime.execution.task import Credits, RestoredState, Task, TaskKey
from runtime.graph.enums import TaskState
from runtime.graph.job_config import ChannelConfig
from runtime.graph.plan import Plan, Vertex, build_job, channel_id, channels_touching, edge_key_fn, ensure_on_path
from runtime.state.backend import StateBackend
from runtime.worker.network import NetworkEnvironment
from runtime.worker.restoring import load_restored, source_for
from runtime.worker.state_backends import backend_for, restore_backend


@dataclass
class DeployedJob:
    plan: Plan
    tasks: dict[str, Task] = field(default_factory=dict)
    checkpoints: dict[str, TaskCheckpoints] = field(default_factory=dict)
    running: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    channel_ids: list[int] = field(default_factory=list)
    local_links: list[LocalLink] = field(default_factory=list)
    peers: set[str] = field(default_factory=set)
    sizing: asyncio.Task[None] | None = None  # the in-flight bound's timer, cancelled by teardown


@dataclass(frozen=True)
class CheckpointHooks:
    writer: CheckpointWriter
    on_ack: AckCallback
    on_decline: DeclineCallback


def build_task(plan: Plan, vertex: Vertex, subtask: int, *, job: Job, outputs: dict[int, dict[int, Subpartition]],
               inputs: list[InputChannel], restored: RestoredState | None, hooks: CheckpointHooks,
               cfg: ChannelConfig, state_backend: StateBackend | None = None,
               isolation: IsolationSettings = IsolationSettings()) -> tuple[Task, TaskCheckpoints]:
    """One complete task: chain, outputs, input gate, restored state and checkpoint listener.

    `outputs` maps each output edge to its subpartitions by consumer index; `state_backend` holds its keyed
    state (None: dict tables, the memory backend); `isolation` is the worker's (WorkerConfig.isolation).
    """
    writers = []
    subpartitions: list[Subpartition] = []
    output_gate = OutputGate()
    for edge in plan.edges:
        if edge.up != vertex.id:
            continue
        ordered = [outputs[edge.id][j] for j in sorted(outputs[edge.id])]
        for sub in ordered:
            sub.gate = output_gate
        subpartitions += ordered
        writer = RecordWriter(ordered, edge.partitioner, edge_key_fn(job, plan.vertices, edge),
                              job.max_parallelism, subtask, producer=vertex.name)
        if edge.tag is not None:
            writer.side_output = (edge.tag_node, edge.tag)
        writers.append(writer)
    chain = Chain(job, vertex.nodes, subtask_index=subtask, parallelism=vertex.parallelism, attempt=plan.attempt,
                  outputs=writers, state_backend=state_backend,
                  async_state=AsyncStateSettings.from_config(dict(plan.config.async_state)))
    for node in chain.nodes:
        if node.kind == "sink":
            node.payload.bind(plan.job_id, node.uid)
    head = job.nodes[vertex.nodes[0]]
    key = TaskKey(plan.job_id, vertex.id, subtask, vertex.name, vertex.parallelism)
    checkpoints: list[TaskCheckpoints] = []

    def listener(task: Task) -> TaskCheckpoints:
        checkpointer = TaskCheckpointer(task, hooks.writer, task_key=key.vertex_subtask,
                                        max_parallelism=job.max_parallelism, on_ack=hooks.on_ack,
                                        on_decline=hooks.on_decline,
                                        incremental_channel_state=cfg.incremental_channel_state)
        checkpoints.append(TaskCheckpoints(task, checkpointer))
        return checkpoints[0]

    task = Task(key=key, chain=chain, outputs=subpartitions, output_gate=output_gate, inputs=inputs,
                credits=Credits(cfg.exclusive_credits, cfg.floating_credits),
                source=source_for(head.payload, restored) if head.kind == "source" else None,
                flush_timeout_s=cfg.flush_timeout_s,
                restore=restored, checkpoints=listener, isolation=isolation)
    return task, checkpoints[0]


async def deploy(plan: Plan, worker_id: str, network: NetworkEnvironment, hooks: CheckpointHooks, *,
                 isolation: IsolationSettings = IsolationSettings()) -> DeployedJob:
    ensure_on_path(plan.sys_path)
    cfg = plan.config.channels
    deployed = DeployedJob(plan)
    vertices = plan.vertices
    mine = [(v, i) for v in vertices for i in range(v.parallelism) if plan.placement[f"{v.id}:{i}"] == worker_id]
    here: dict[int, set[int]] = {v.id: set() for v in vertices}  # vertex id -> its subtasks on this worker
    for v, i in mine:
        here[v.id].add(i)

    # one job graph per task: user functions keep per-subtask state in `self`
    jobs = {f"{v.id}:{i}": build_job(plan.entry, plan.name, plan.config.parallelism) for v, i in mine}
    subs: dict[tuple[str, int], dict[int, Subpartition]] = {}  # (task, edge) -> consumer index -> subpartition
    tasks: dict[str, Task] = {}
    inputs: dict[str, list[InputChannel]] = {key: [] for key in jobs}

    # producer ends first: the task needs its subpartitions to build its writers
    pending_local: list[tuple[int, str, Subpartition]] = []
    for edge in plan.edges:
        up, down = vertices[edge.up], vertices[edge.down]
        for i, j in channels_touching(edge, up.parallelism, down.parallelism, here[up.id], here[down.id]):
            cid = channel_id(plan.channel_base, edge, down.parallelism, i, j)
            producer, consumer = f"{up.id}:{i}", f"{down.id}:{j}"
            p_worker, c_worker = plan.placement[producer], plan.placement[consumer]
            if p_worker == worker_id:
                sub = Subpartition(ChannelSender(cid), limit=cfg.buffers_per_channel, capacity=cfg.buffer_bytes)
                sub.key = channel_key(edge.id, i, j)
                subs.setdefault((producer, edge.id), {})[j] = sub
                if c_worker == worker_id:
                    pending_local.append((cid, consumer, sub))
                else:
                    network.register_outbound(cid, c_worker, sub)
                    deployed.peers.add(c_worker)
            if c_worker == worker_id:
                inputs[consumer].append(InputChannel(cid, len(inputs[consumer]), edge.input_index, producer,
                                                     key=channel_key(edge.id, i, j)))
                if p_worker != worker_id:
                    deployed.peers.add(p_worker)
            deployed.channel_ids.append(cid)

    restore = plan.restore
    for v, i in mine:
        key = f"{v.id}:{i}"
        restored = (await asyncio.to_thread(load_restored, restore, plan, v, i, inputs[key], jobs[key])
                    if restore else None)
        backend = backend_for(plan, v, i, jobs[key])
        try:
            await asyncio.to_thread(restore_backend, backend, restored, plan, v, i, jobs[key])
        except BaseException:
            if backend is not None:
                backend.close()
            raise
        task, checkpoints = build_task(plan, v, i, job=jobs[key], inputs=inputs[key], restored=restored, hooks=hooks,
                                       cfg=cfg, outputs={e: by_consumer for (k, e), by_consumer in subs.items()
                                                         if k == key}, state_backend=backend, isolation=isolation)
        if task.gate is not None:
            for ch in inputs[key]:
                p_worker = plan.placement[ch.producer]
                if p_worker != worker_id:
                    network.register_inbound(ch.channel_id, p_worker, task.gate)
        tasks[key] = task
        deployed.checkpoints[key] = checkpoints

    for cid, consumer, sub in pending_local:
        gate = tasks[consumer].gate
        assert gate is not None
        link = LocalLink(cid, sub, gate)
        sub.link = link
        gate.channels[cid].send_credit = link.send_credit
        deployed.local_links.append(link)

    deployed.tasks = tasks
    if cfg.inflight_target_s > 0:
        outputs = [sub for by_consumer in subs.values() for sub in by_consumer.values()]
        bound = InflightBound(outputs, target_s=cfg.inflight_target_s, buffers_in_path=cfg.buffers_in_path,
                              max_bytes=cfg.buffer_bytes)
        deployed.sizing = asyncio.create_task(bound.run(sizing_period_s(len(outputs))))
    return deployed


SIZING_COST_S = 2e-6  # the buffer sizing's CPU per channel and period (InflightBound.adjust, measured: 1.9 us)
SIZING_CPU_SHARE = 0.005  # of a core, per worker, at most


def sizing_period_s(channels: int) -> float:
    """How often the worker sizes its output buffers: every ADJUST_PERIOD_S, less often when it has so many
    channels that it would cost more than SIZING_CPU_SHARE of a core. At 1,000 tasks on 100 workers (2,500
    output channels each) every 0.2 s took 2.3 % of a core per worker, 2.3 cores for the cluster: more than
    the machine had, before any record moved (docs/BENCHMARKS.md, Coordinator at scale)."""
    return max(ADJUST_PERIOD_S, channels * SIZING_COST_S / SIZING_CPU_SHARE)


async def connect(deployed: DeployedJob, network: NetworkEnvironment, *, timeout_s: float = 30.0) -> None:
    """Open (or reuse) the TCP link to every peer this job exchanges data with, then bind channels to it."""
    plan = deployed.plan
    links: dict[str, Link] = {}
    for peer in sorted(deployed.peers):
        host, port = plan.workers[peer]
        links[peer] = await network.link_to(peer, host, int(port), timeout_s=timeout_s)
    for task in deployed.tasks.values():
        for sub in task.subpartitions:
            consumer_worker = network.outbound_peer(sub.sender.channel_id)
            if consumer_worker is not None:
                sub.link = links[consumer_worker]
        if task.gate is not None:
            for ch in task.gate.channels.values():
                p_worker = plan.placement[ch.producer]
                if ch.send_credit is None and p_worker in links:
                    link = links[p_worker]
                    ch.send_credit = (lambda cid, lk: lambda n: lk.send_credit(cid, n))(ch.channel_id, link)


def teardown(deployed: DeployedJob, network: NetworkEnvironment) -> None:
    if deployed.sizing is not None:
        deployed.sizing.cancel()
    # a task that ran closed its chain (and state backend) itself; one cancelled before it started did not
    _close_backends(t for t in deployed.tasks.values() if t.state == TaskState.CREATED)
    for link in deployed.local_links:
        link.closed = True
    network.unregister(deployed.channel_ids)


def _close_backends(tasks: Iterable[Task]) -> None:
    for task in tasks:
        backend = task.chain.state_backend
        if backend is not None:
            task.chain.state_backend = None
            backend.close()
