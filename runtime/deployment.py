"""Turning a plan into this worker's tasks and wiring their channels.

For every logical channel of the plan that touches this worker: the producer
side gets a `Subpartition`, the consumer side an `InputChannel` in the
task's gate; a channel with both ends here gets a `LocalLink`, otherwise the
channel rides the TCP link to the peer worker.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from netstack.credit import ChannelSender
from runtime.barriers import BarrierHandler
from runtime.channels import InputChannel, InputGate, LocalLink, Subpartition
from runtime.checkpoint_writer import CheckpointWriter
from runtime.graph import Plan, build_job, channel_id, channels_of_edge, edge_key_fn, ensure_on_path
from runtime.network import NetworkEnvironment
from runtime.operators import Chain, RecordWriter
from runtime.snapshots import channel_key, decode_channel_state, decode_operator_state, read_file
from runtime.task import RestoredState, Task
from runtime.task_checkpoint import AckCallback, DeclineCallback, TaskCheckpointer


@dataclass(frozen=True)
class ChannelConfig:
    buffer_bytes: int = 32 * 1024
    buffers_per_channel: int = 4  # producer queue limit per subpartition
    exclusive_credits: int = 2
    floating_credits: int = 8
    flush_timeout_s: float = 0.05

    @classmethod
    def from_plan(cls, config: dict[str, Any]) -> ChannelConfig:
        keys = cls.__dataclass_fields__.keys()
        return cls(**{k: config[k] for k in keys if k in config})


@dataclass
class DeployedJob:
    plan: Plan
    tasks: dict[str, Task] = field(default_factory=dict)
    running: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    channel_ids: list[int] = field(default_factory=list)
    local_links: list[LocalLink] = field(default_factory=list)
    peers: set[str] = field(default_factory=set)


@dataclass(frozen=True)
class CheckpointHooks:
    writer: CheckpointWriter
    on_ack: AckCallback
    on_decline: DeclineCallback


def load_restored(restore: dict[str, Any], task_key: str) -> RestoredState | None:
    """Read one task's files from the checkpoint being restored (blocking: run it in a thread)."""
    files = restore["tasks"].get(task_key)
    if files is None:
        return None
    directory = restore["path"]
    state = RestoredState()
    if files.get("state"):
        state.operator = decode_operator_state(read_file(directory, files["state"]), files["state"])
    if files.get("out"):
        state.outputs = decode_channel_state(read_file(directory, files["out"]), files["out"])
    if files.get("in"):
        state.inputs = decode_channel_state(read_file(directory, files["in"]), files["in"])  # type: ignore[assignment]
    return state


async def deploy(plan: Plan, worker_id: str, network: NetworkEnvironment, hooks: CheckpointHooks) -> DeployedJob:
    ensure_on_path(plan.sys_path)
    cfg = ChannelConfig.from_plan(plan.config)
    deployed = DeployedJob(plan)
    vertices = plan.vertices
    mine = [(v, i) for v in vertices for i in range(v.parallelism) if plan.placement[f"{v.id}:{i}"] == worker_id]

    # one job graph per task: user functions keep per-subtask state in `self`
    jobs = {f"{v.id}:{i}": build_job(plan.entry, plan.name) for v, i in mine}
    subs: dict[tuple[str, int], dict[int, Subpartition]] = {}  # (task, edge) -> consumer index -> subpartition
    tasks: dict[str, Task] = {}
    inputs: dict[str, list[InputChannel]] = {key: [] for key in jobs}

    # producer ends first: the task needs its subpartitions to build its writers
    pending_local: list[tuple[int, str, Subpartition]] = []
    for edge in plan.edges:
        up, down = vertices[edge.up], vertices[edge.down]
        for i, j in channels_of_edge(edge, up.parallelism, down.parallelism):
            cid = channel_id(plan.channel_base, edge, down.parallelism, i, j)
            producer, consumer = f"{up.id}:{i}", f"{down.id}:{j}"
            p_worker, c_worker = plan.placement[producer], plan.placement[consumer]
            if p_worker == worker_id:
                sub = Subpartition(ChannelSender(cid), None, limit=cfg.buffers_per_channel,  # type: ignore[arg-type]
                                   capacity=cfg.buffer_bytes)
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

    for v, i in mine:
        key = f"{v.id}:{i}"
        job = jobs[key]
        writers = []
        all_subs: list[Subpartition] = []
        for edge in plan.edges:
            if edge.up != v.id:
                continue
            edge_subs = subs[(key, edge.id)]
            ordered = [edge_subs[j] for j in sorted(edge_subs)]
            all_subs += ordered
            writers.append(RecordWriter(ordered, edge.partitioner, edge_key_fn(job, vertices, edge),
                                        job.max_parallelism, i))
        chain = Chain(job, v.nodes, subtask_index=i, parallelism=v.parallelism, attempt=plan.attempt,
                      outputs=writers)
        head = job.nodes[v.nodes[0]]
        source = head.payload if head.kind == "source" else None
        task = Task(task_id=f"{plan.job_id}/{v.id}:{i}", name=f"{v.name} ({i + 1}/{v.parallelism})", chain=chain,
                    outputs=all_subs, source=source, flush_timeout_s=cfg.flush_timeout_s)
        for sub in all_subs:
            sub.gate = task.output
        if inputs[key]:
            task.gate = InputGate(task, inputs[key], exclusive=cfg.exclusive_credits, floating=cfg.floating_credits)
            for ch in inputs[key]:
                p_worker = plan.placement[ch.producer]
                if p_worker != worker_id:
                    network.register_inbound(ch.channel_id, p_worker, task.gate)
        task.checkpointer = TaskCheckpointer(task, hooks.writer, task_key=key, max_parallelism=job.max_parallelism,
                                             on_ack=hooks.on_ack, on_decline=hooks.on_decline)
        if task.gate is not None:
            task.barriers = BarrierHandler(list(task.gate.channels))
        restore = plan.config.get("restore")
        if restore:
            restored = await asyncio.to_thread(load_restored, restore, key)
            if restored is not None and restored.inputs and task.gate is not None:
                by_key = {ch.key: ch.channel_id for ch in task.gate.channels.values()}
                restored.inputs = {by_key[k]: v for k, v in restored.inputs.items() if k in by_key}
            task.restore = restored
        tasks[key] = task

    for cid, consumer, sub in pending_local:
        gate = tasks[consumer].gate
        assert gate is not None
        link = LocalLink(cid, sub, gate)
        sub.link = link
        gate.channels[cid].send_credit = link.send_credit
        deployed.local_links.append(link)

    deployed.tasks = tasks
    return deployed


async def connect(deployed: DeployedJob, network: NetworkEnvironment, *, timeout_s: float = 30.0) -> None:
    """Open (or reuse) the TCP link to every peer this job exchanges data with, then bind channels to it."""
    plan = deployed.plan
    links = {}
    for peer in sorted(deployed.peers):
        host, port = plan.workers[peer]
        links[peer] = await network.link_to(peer, host, int(port), timeout_s=timeout_s)
    for task in deployed.tasks.values():
        for sub in task.subpartitions:
            peer = network.outbound_peer(sub.sender.channel_id)
            if peer is not None:
                sub.link = links[peer]
        if task.gate is not None:
            for ch in task.gate.channels.values():
                p_worker = plan.placement[ch.producer]
                if ch.send_credit is None and p_worker in links:
                    link = links[p_worker]
                    ch.send_credit = (lambda cid, lk: lambda n: lk.send_credit(cid, n))(ch.channel_id, link)


def teardown(deployed: DeployedJob, network: NetworkEnvironment) -> None:
    for link in deployed.local_links:
        link.closed = True
    network.unregister(deployed.channel_ids)
