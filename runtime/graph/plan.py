"""From the user's node graph to tasks: chaining, edges, channels, placement.

Pure functions over plain data. The coordinator computes a `Plan` and sends
it to workers as a dict; workers rebuild the same node graph from the job
module and use the plan to know which subtasks they run and which logical
channels join them to whom.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Set
from dataclasses import asdict, dataclass, field
from typing import Any

from runtime.api import Job, JobDefinitionError, Node
from runtime.api.stream import DEFAULT_SLOT_SHARING_GROUP
from runtime.graph.job_config import JobConfig
from runtime.graph.operator_ids import assign_uids
from runtime.graph.restore_spec import RestoreSpec


class JobLoadError(Exception):
    """The job entry point cannot be imported or called."""


def load_entry(entry: str) -> Callable[[Job], None]:
    """Resolve 'package.module:function'; raises JobLoadError with the cause."""
    module_name, sep, func_name = entry.partition(":")
    if not sep or not module_name or not func_name:
        raise JobLoadError(f"job entry {entry!r} is not of the form 'package.module:function'")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise JobLoadError(f"cannot import job module {module_name!r}: {type(exc).__name__}: {exc}") from exc
    func = getattr(module, func_name, None)
    if not callable(func):
        raise JobLoadError(f"job module {module_name!r} has no function {func_name!r}")
    return func


def build_job(entry: str, name: str | None = None, parallelism: Mapping[str, int] | None = None) -> Job:
    """Import the entry point and let it fill a Job; `parallelism` overrides what it set (see
    apply_parallelism), the same on the coordinator and on every worker."""
    func = load_entry(entry)
    job = Job(name or entry)
    try:
        func(job)
    except JobDefinitionError:
        raise
    except Exception as exc:
        raise JobLoadError(f"{entry} raised while building the job: {type(exc).__name__}: {exc}") from exc
    if not job.nodes:
        raise JobDefinitionError(f"{entry} defined no operators")
    assign_uids(job)
    if parallelism:
        apply_parallelism(job, parallelism)
    return job


def apply_parallelism(job: Job, overrides: Mapping[str, int]) -> None:
    """`--parallelism N` ("*": N) sets every operator's parallelism, `--parallelism NAME=N` one operator's
    (by name or uid, winning over "*"). Raises JobDefinitionError for an unknown name or a graph that no longer fits
    (a forward edge between operators of different parallelism)."""
    names = {n.name for n in job.nodes}
    unknown = sorted(set(overrides) - names - {n.uid for n in job.nodes} - {"*"})
    if unknown:
        raise JobDefinitionError(f"--parallelism names no operator {', '.join(unknown)}; the job has "
                                 f"{', '.join(sorted(names))}")
    for node in job.nodes:  # by uid or by name (the uid wins), else "*"
        p = overrides.get(node.uid, overrides.get(node.name, overrides.get("*")))
        if p is None:
            continue
        if not isinstance(p, int) or p < 1 or p > job.max_parallelism:
            raise JobDefinitionError(f"parallelism of {node.name} must be 1..{job.max_parallelism}, got {p!r}")
        node.parallelism = p
    for node in job.nodes:
        for inp in node.inputs:
            up = job.nodes[inp.node]
            if inp.partitioner == "forward" and up.parallelism != node.parallelism:
                raise JobDefinitionError(f"forward from {up.name} (parallelism {up.parallelism}) to {node.name} "
                                         f"(parallelism {node.parallelism}) needs equal parallelism")


def ensure_on_path(path: str) -> None:
    if path and path not in sys.path:
        sys.path.insert(0, path)


@dataclass(frozen=True)
class Vertex:
    """A task type: a chain of nodes run in one task, `parallelism` subtasks."""

    id: int
    nodes: list[int]
    parallelism: int
    name: str
    slot_sharing_group: str = DEFAULT_SLOT_SHARING_GROUP  # its operators' group (a chain never spans two)


@dataclass(frozen=True)
class Edge:
    """Records flowing from vertex `up` to vertex `down`, routed by `partitioner`."""

    id: int
    up: int
    down: int
    partitioner: str
    input_index: int  # which input of the down vertex's head node
    channel_base: int  # first channel id of this edge (relative to the plan's base)
    tag: str | None = None  # a side output edge: it carries what node `tag_node` sent to `tag`
    tag_node: int = -1


def _resolve_partitioner(up: Node, down: Node, explicit: str | None) -> str:
    if explicit is not None:
        return explicit
    return "forward" if up.parallelism == down.parallelism else "rebalance"


def chain_graph(job: Job, groups: Mapping[int, int] | None = None) -> tuple[list[Vertex], list[Edge]]:
    """Chain the job's operators into vertices and join them with edges.

    `groups` (node id -> the task it ran in when a checkpoint was taken, for the operators the checkpoint
    holds) keeps the checkpoint's task boundaries: a chain never holds operators of two old tasks, so a former
    network edge stays one whatever the parallelisms now, and a restore never has to push what was in flight
    between two tasks into the middle of a chain. A chain may still split (its ends now run at different
    parallelisms): nothing was in flight inside it. Operators added since (no group) chain as usual."""
    groups = groups or {}
    nodes = job.nodes
    consumers: dict[int, list[int]] = {n.id: [] for n in nodes}  # of the main output (side outputs are edges)
    for n in nodes:
        for inp in n.inputs:
            if inp.tag is None:
                consumers[inp.node].append(n.id)

    def chains_to_upstream(n: Node) -> bool:
        if len(n.inputs) != 1 or n.inputs[0].tag is not None:
            return False
        inp = n.inputs[0]
        up = nodes[inp.node]
        return (_resolve_partitioner(up, n, inp.partitioner) == "forward"
                and up.parallelism == n.parallelism and len(consumers[up.id]) == 1
                and up.slot_sharing_group == n.slot_sharing_group)

    head_of: dict[int, int] = {}
    chains: dict[int, list[int]] = {}
    group_of_chain: dict[int, int | None] = {}
    for n in nodes:  # creation order is topological
        head = head_of[n.inputs[0].node] if chains_to_upstream(n) else n.id
        group = groups.get(n.id)
        if head != n.id and None not in (group, group_of_chain[head]) and group != group_of_chain[head]:
            head = n.id  # it ran in another task than the chain's operators: keep the network edge
        head_of[n.id] = head
        if head == n.id:
            chains[n.id] = [n.id]
            group_of_chain[n.id] = group
        else:
            chains[head].append(n.id)
            if group_of_chain[head] is None:
                group_of_chain[head] = group
    vertex_of_head = {head: i for i, head in enumerate(chains)}
    vertices = [Vertex(i, ids, nodes[ids[0]].parallelism, " -> ".join(nodes[x].name for x in ids),
                       nodes[ids[0]].slot_sharing_group)
                for i, ids in enumerate(chains.values())]
    edges: list[Edge] = []
    channel_base = 0
    for n in nodes:
        if head_of[n.id] != n.id:
            continue
        for index, inp in enumerate(n.inputs):
            up_vertex = vertex_of_head[head_of[inp.node]]
            down_vertex = vertex_of_head[n.id]
            part = _resolve_partitioner(nodes[inp.node], n, inp.partitioner)
            edges.append(Edge(len(edges), up_vertex, down_vertex, part, index, channel_base, inp.tag,
                              inp.node if inp.tag is not None else -1))
            channel_base += vertices[up_vertex].parallelism * vertices[down_vertex].parallelism
    return vertices, edges


def edge_key_fn(job: Job, vertices: list[Vertex], edge: Edge) -> Callable[[Any], Any] | None:
    """The key function that routes a hash edge: the one given to key_by() on that input."""
    if edge.partitioner != "hash":
        return None
    head = job.nodes[vertices[edge.down].nodes[0]]
    return head.inputs[edge.input_index].key_fn


def channel_id(plan_base: int, edge: Edge, down_parallelism: int, producer: int, consumer: int) -> int:
    return plan_base + edge.channel_base + producer * down_parallelism + consumer


def channels_of_edge(edge: Edge, up_p: int, down_p: int) -> list[tuple[int, int]]:
    """(producer subtask, consumer subtask) pairs joined by a logical channel."""
    if edge.partitioner == "forward":
        return [(i, i) for i in range(up_p)]
    return [(i, j) for i in range(up_p) for j in range(down_p)]


def channels_touching(edge: Edge, up_p: int, down_p: int, producers: Set[int],
                      consumers: Set[int]) -> Iterator[tuple[int, int]]:
    """The pairs of `channels_of_edge` with the producer in `producers` or the consumer in `consumers` (one
    worker's subtasks), in the same order, without walking the others: an all-to-all edge has up_p x down_p
    channels (250,000 at parallelism 500), of which a worker with a few subtasks touches a few thousand, and
    every worker of the job deploys at once."""
    if edge.partitioner == "forward":
        yield from ((i, i) for i in sorted(producers | consumers) if i < up_p)
        return
    here = sorted(j for j in consumers if j < down_p)
    for i in range(up_p):
        yield from ((i, j) for j in (range(down_p) if i in producers else here))


def group_slots(members: Iterable[tuple[str, int]]) -> dict[str, int]:
    """The slots of each slot sharing group, in the order groups first appear: its members' (group, parallelism)
    largest parallelism."""
    largest: dict[str, int] = {}
    for group, parallelism in members:
        largest[group] = max(largest.get(group, 0), parallelism)
    return largest


def slots_needed(vertices: list[Vertex]) -> int:
    """The slots a job takes: per slot sharing group, its largest parallelism."""
    return sum(group_slots((v.slot_sharing_group, v.parallelism) for v in vertices).values())


def place_subtasks(vertices: list[Vertex], workers: list[tuple[str, int]]) -> dict[str, str]:
    """Slot sharing: subtask i of every vertex of a slot sharing group goes to the group's slot i; each group
    (in the order its first vertex appears) takes the slots after the previous group's, and slots are spread
    over workers, so two groups' subtask 0 run on different workers when there are two.

    `workers` is [(worker_id, slots)]. Returns {"vertex:index": worker_id}.
    Raises JobDefinitionError when there are not enough slots.
    """
    slots: list[str] = []
    # interleave workers so that slot i and slot i+1 land on different workers
    remaining = {wid: n for wid, n in workers}
    while any(remaining.values()):
        for wid, _ in workers:
            if remaining[wid]:
                slots.append(wid)
                remaining[wid] -= 1
    needed = slots_needed(vertices)
    if needed > len(slots):
        raise JobDefinitionError(f"job needs {needed} slots, the cluster has {len(slots)} free")
    first_slot: dict[str, int] = {}
    offset = 0
    for group, size in group_slots((v.slot_sharing_group, v.parallelism) for v in vertices).items():
        first_slot[group] = offset
        offset += size
    return {f"{v.id}:{i}": slots[first_slot[v.slot_sharing_group] + i] for v in vertices for i in range(v.parallelism)}


@dataclass
class Plan:
    """Everything a worker needs to run its part of a job attempt (sent as a dict)."""

    job_id: str
    attempt: int
    entry: str
    name: str
    sys_path: str
    channel_base: int
    vertices: list[Vertex]
    edges: list[Edge]
    placement: dict[str, str]
    workers: dict[str, list[Any]]  # worker id -> [host, data_port]
    config: JobConfig
    restore: RestoreSpec | None = None  # the checkpoint this attempt starts from
    # the coordinator's record of the graph for checkpoints' `_metadata` (operator_ids.graph_document); not sent
    graph: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"job_id": self.job_id, "attempt": self.attempt, "entry": self.entry, "name": self.name,
                "sys_path": self.sys_path, "channel_base": self.channel_base,
                "vertices": [asdict(v) for v in self.vertices], "edges": [asdict(e) for e in self.edges],
                "placement": dict(self.placement), "workers": {k: list(v) for k, v in self.workers.items()},
                "config": self.config.to_wire(), "restore": self.restore.to_wire() if self.restore else None}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Plan:
        return cls(
            job_id=d["job_id"], attempt=d["attempt"], entry=d["entry"], name=d["name"], sys_path=d["sys_path"],
            channel_base=d["channel_base"],
            vertices=[Vertex(**v) for v in d["vertices"]],
            edges=[Edge(**e) for e in d["edges"]],
            placement=dict(d["placement"]), workers={k: list(v) for k, v in d["workers"].items()},
            config=JobConfig.from_wire(d["config"]),
            restore=RestoreSpec.from_wire(d["restore"]) if d.get("restore") else None,
        )
