"""What one new subtask restores of a checkpoint, at the parallelism it was taken or another one. Pure, no I/O.

`plan_restore` looks only at the checkpoint's metadata (the RestoreSpec: which files each old task wrote, the
old parallelisms) and at the job graph, and answers with a RestorePlan: which old tasks' operator-state files
to read and how to cut and combine them (own state whole, or redistributed by key group, source lanes or
splits, sinks, lists), which output channel state to keep, and, per input edge, which channel-state files
hold its old channels and how to redistribute them. `assemble` turns the plan and the decoded files into the
task's RestoredState. runtime/worker/restoring.py reads the files between the two; nothing else touches storage.

When the new parallelisms split a chain, the old tasks and edges are those of the old chaining (OldPlan): a
task takes its operators' part of the old task that ran them. The redistribution rules themselves are
checkpointing/rescaling.py's; docs/ARCHITECTURE.md ("Rescaling") says why they keep every record exactly once.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from runtime.api import Job
from runtime.checkpointing.rescaling import (
    RescaleError,
    merge_keyed,
    only_broadcast_state,
    overlapping_subtasks,
    redistribute_broadcast,
    redistribute_edge,
    rescale_async_io,
    rescale_lists,
    rescale_sinks,
    rescale_source,
    rescale_time,
)
from runtime.checkpointing.snapshots import async_documents, keyed_tables, list_tables
from runtime.connectors.splits import deal_splits
from runtime.execution.task import RestoredState
from runtime.graph.evolution import match_operators
from runtime.graph.partitioning import key_group_range
from runtime.graph.plan import Edge, Plan, Vertex, chain_graph, edge_key_fn
from runtime.graph.restore_spec import RestoreSpec, TaskFiles

Operator = dict[str, Any]  # a decoded operator-state file (checkpointing/snapshots.py)
Channels = dict[str, bytes]  # a decoded channel-state file: channel key "edge:producer:consumer" -> records


class OldPlan:
    """The checkpoint's tasks and edges, and which of its operators each operator of the job continues.

    A checkpoint that records its graph by uid (RestoreSpec.graph, runtime/graph/operator_ids.py) is read as
    recorded: its tasks, edges and node ids, matched with the job's operators by uid (runtime/graph/evolution.py;
    an operator added since matches none). Older checkpoints hold the same operators under the same node ids,
    maybe chained otherwise: a forward pair whose ends now run at different parallelisms ran as one task then
    (RestoreSpec.nodes: each node's checkpointed parallelism, from the coordinator).

    The plan keeps the checkpoint's task boundaries (plan.chain_graph groups), so every new task's matched
    operators lie in one old task; an edge is an old one when its ends were in different old tasks, new (it
    was inside a chain, with nothing in flight) when they were in the same one."""

    def __init__(self, restore: RestoreSpec, plan: Plan, job: Job) -> None:
        graph = restore.graph
        if graph.get("operators"):
            self.vertices = [Vertex(int(v["id"]), [int(n) for n in v["nodes"]], int(v["parallelism"]), str(v["name"]))
                             for v in graph["vertices"]]
            self.edges = [Edge(int(e["id"]), int(e["up"]), int(e["down"]), str(e["partitioner"]),
                               int(e["input_index"]), int(e["channel_base"]), e.get("tag"), int(e.get("tag_node", -1)))
                          for e in graph["edges"]]
            self.kinds = {int(op["node"]): str(op["kind"]) for op in graph["operators"]}
            self.old_of_new = match_operators(graph, job).old_of_new
        else:
            if restore.nodes:
                then = Job(job.name, max_parallelism=job.max_parallelism)
                then.nodes = [replace(n, parallelism=restore.nodes.get(n.id, n.parallelism)) for n in job.nodes]
                self.vertices, self.edges = chain_graph(then)
            else:  # chained as now (a checkpoint restored before the coordinator sent node parallelisms)
                old = restore.parallelism
                self.vertices = [replace(v, parallelism=old.get(v.id, v.parallelism)) for v in plan.vertices]
                self.edges = list(plan.edges)
            self.kinds = {n.id: n.kind for n in job.nodes}
            self.old_of_new = {n.id: n.id for n in job.nodes}
        self.plan = plan
        self.vertex_of_node = {n: v for v in self.vertices for n in v.nodes}

    def vertex(self, vertex: Vertex) -> Vertex | None:
        """The old task that ran this task's operators (None: they were all added since)."""
        olds = {self.vertex_of_node[self.old_of_new[n]].id for n in vertex.nodes if n in self.old_of_new}
        if len(olds) > 1:  # the plan keeps task boundaries (chain_graph groups): a bug if this happens
            raise RescaleError(f"{vertex.name} would hold operators of {len(olds)} checkpointed tasks")
        return self.vertices[olds.pop()] if olds else None

    def _ends(self, edge: Edge, vertices: Sequence[Vertex]) -> tuple[int, int]:
        """(producing operator, consuming operator) of an edge: the up task's tail (or the side output's
        operator) and the down task's head."""
        return (edge.tag_node if edge.tag is not None else vertices[edge.up].nodes[-1], vertices[edge.down].nodes[0])

    def edge(self, edge: Edge) -> Edge | None:
        """The old edge a new one continues (the same producing and consuming operator, input and side output),
        or None."""
        up, down = self._ends(edge, self.plan.vertices)
        if up not in self.old_of_new or down not in self.old_of_new:
            return None
        ends = (self.old_of_new[up], self.old_of_new[down])
        for old in self.edges:
            if self._ends(old, self.vertices) == ends and old.input_index == edge.input_index and old.tag == edge.tag:
                return old
        return None

    def same_vertex(self, vertex: Vertex) -> bool:
        old = self.vertex(vertex)
        return (old is not None and old.id == vertex.id and old.parallelism == vertex.parallelism
                and old.nodes == [self.old_of_new.get(n) for n in vertex.nodes])

    def same_edge(self, edge: Edge) -> bool:
        """The edge, its channels and both its ends are as checkpointed: its channel state stays where it is."""
        old = self.edge(edge)
        return (old is not None and old.id == edge.id and self.same_vertex(self.plan.vertices[edge.up])
                and self.same_vertex(self.plan.vertices[edge.down]))


# -- the plan --------------------------------------------------------------------------------------------------


class SourceRule(enum.Enum):
    NONE = "none"  # the task does not head with the old task's source
    OWN = "own"  # one old subtask's position, as it is
    LANES = "lanes"  # a rescalable source: what every old subtask had left, dealt as lanes
    SPLITS = "splits"  # a source with per-subtask splits: every old subtask's splits, dealt round robin
    DEALT = "dealt"  # a source that deals its own positions (`redistribute`, e.g. Kafka partitions)


@dataclass(frozen=True, slots=True)
class Cut:
    """Which part of an old task's operator state belongs to the new task's operators."""

    nodes: frozenset[int]  # the old node ids of the new task's operators: keyed tables, lists, async documents
    sinks: tuple[int | None, ...]  # per sink of the new chain, in its order: its index among the old chain's
    source: bool  # the old chain's source heads the new task: its position goes with it
    backend: bool  # the new task has a keyed operator: the state backend's handle goes with it
    # (old node id, new node id) of the operators whose node id changed (by uid: runtime/graph/evolution.py)
    renamed: tuple[tuple[int, int], ...] = ()
    # a state backend's entries to move (old node id -> new one) or drop (None) after its restore: renamed
    # operators, and old operators whose node id a new operator of the task now has
    backend_moves: tuple[tuple[int, int | None], ...] = ()


@dataclass(frozen=True, slots=True)
class OperatorStatePlan:
    """Operator state from old subtasks `files` (one per old subtask, None: it wrote none).

    Not rescaled (`key_groups` None): the single file's part, as it is. Rescaled: keyed tables, backend handles
    and async documents of the `overlapping` old subtasks cut to `key_groups`; source, sinks, lists and time
    redistributed from every old subtask."""

    files: tuple[str | None, ...]
    cut: Cut
    key_groups: range | None = None
    overlapping: tuple[int, ...] = ()
    source: SourceRule = SourceRule.NONE
    subtask: int = 0  # the new subtask and parallelism (rescaled only)
    parallelism: int = 1
    checkpoint_id: int = 0  # sinks name committed files by it
    replicated: bool = False  # fed by a broadcast edge: lists are the replica's, whole
    lists_conflict: bool = False  # broadcast-fed and fed by another input: list state cannot be redistributed
    max_parallelism: int = 128
    # a rescalable source's own `lanes` (its position format -> lanes), or for DEALT its `redistribute`
    # (old subtasks' states, new parallelism -> new states); not part of what the plan says
    lanes_of: Callable[..., Any] | None = field(default=None, compare=False)


@dataclass(frozen=True, slots=True)
class OwnInputs:
    """An unchanged edge: the task's own recorded input channels of it, as they are."""

    edge: int
    file: str | None


@dataclass(frozen=True, slots=True)
class RedistributedInputs:
    """A rescaled edge: the old channels of `old_edge`, each what its consumer had received (`in_files`) then
    what its producer still held (`out_files`), redistributed to new consumer `consumer`."""

    edge: int
    old_edge: int
    in_files: tuple[str | None, ...]  # old consumers', subtask order
    out_files: tuple[str | None, ...]  # old producers', subtask order
    partitioner: str
    consumer: int
    new_up: int
    new_down: int
    old_down: int
    max_parallelism: int
    timestamped: bool
    key_fn: Callable[[Any], Any] | None = field(default=None, compare=False)  # a hash edge's, from the job


InputPlan = OwnInputs | RedistributedInputs


@dataclass(frozen=True, slots=True)
class RestorePlan:
    """One new subtask's restore: nothing (no entry: a new task), finished, or the state to assemble."""

    nothing: bool = False
    finished: bool = False
    ended: bool = False
    operator: OperatorStatePlan | None = None
    outputs_file: str | None = None  # the task's own output channel state, kept for `kept_outputs` edges
    kept_outputs: frozenset[int] = frozenset()
    inputs: tuple[InputPlan, ...] = ()

    def operator_files(self) -> list[str]:
        """The operator-state files to read, each once."""
        return sorted({f for f in (self.operator.files if self.operator else ()) if f})

    def channel_files(self) -> list[str]:
        """The channel-state files to read, each once."""
        names = {self.outputs_file}
        for part in self.inputs:
            names.update((part.file,) if isinstance(part, OwnInputs) else (*part.in_files, *part.out_files))
        return sorted(n for n in names if n)


NOTHING = RestorePlan(nothing=True)
FINISHED = RestorePlan(finished=True)


def plan_restore(restore: RestoreSpec, plan: Plan, vertex: Vertex, subtask: int, job: Job) -> RestorePlan:
    """What new subtask `subtask` of `vertex` reads of the checkpoint and how it combines it.

    Raises RescaleError for state that cannot be restored at the new parallelism (a source that cannot split)."""
    then = OldPlan(restore, plan, job)
    rescaled_edges = frozenset(e.id for e in plan.edges if not then.same_edge(e))
    old = then.vertex(vertex)
    if old is None:
        return NOTHING  # operators added since the checkpoint: they start empty
    entries = [restore.tasks.get(f"{old.id}:{j}") for j in range(old.parallelism)]
    if old.parallelism == vertex.parallelism:
        steps = _own_state(entries[subtask], plan, old, vertex, job, rescaled_edges, then)
    else:
        steps = _rescaled_state(restore, plan, old, vertex, subtask, job, entries, then)
    if steps.nothing or steps.finished:
        return steps
    parts = (_inputs(restore, plan, then, edge, subtask, job, rescaled_edges) for edge in plan.edges
             if edge.down == vertex.id)
    return replace(steps, inputs=tuple(part for part in parts if part is not None))


def _own_state(own: TaskFiles | None, plan: Plan, old: Vertex, vertex: Vertex, job: Job,
               rescaled_edges: frozenset[int], then: OldPlan) -> RestorePlan:
    """Only a neighbour (or the chain) changed, or nothing: the operator state is the task's own."""
    if own is None:
        return NOTHING
    if own.finished:
        return FINISHED
    cut = _cut(old, vertex, job, then)
    operator = OperatorStatePlan((own.state,), cut, source=SourceRule.OWN if cut.source else SourceRule.NONE)
    # output channel state of a rescaled edge is taken by its new consumers; the rest is re-sent as always
    kept = frozenset(e.id for e in plan.edges if e.up == vertex.id and e.id not in rescaled_edges)
    return RestorePlan(ended=own.ended, operator=operator, outputs_file=own.outputs, kept_outputs=kept)


def _rescaled_state(restore: RestoreSpec, plan: Plan, old: Vertex, vertex: Vertex, subtask: int, job: Job,
                    entries: Sequence[TaskFiles | None], then: OldPlan) -> RestorePlan:
    """The vertex runs at another parallelism: its state is redistributed from every old subtask.

    Finished subtasks (FLIP-147) follow `at_end`: an operator all of whose subtasks finished stays finished at
    any parallelism; one all of whose subtasks reached their end restores at its end (it commits, never reads
    or finishes again); a partly finished one restores like a running one, its finished subtasks having no
    state (their source lanes or splits are read, nothing of theirs is redistributed)."""
    finished, ended = subtasks_at_end(entries)
    if finished:
        return FINISHED
    return RestorePlan(ended=ended, operator=_rescaled_operator(restore, plan, old, vertex, subtask, job, entries,
                                                                then, at_end=ended))


def subtasks_at_end(entries: Sequence[TaskFiles | None]) -> tuple[bool, bool]:
    """(every old subtask had finished, every one had reached its end of input or finished): a checkpoint
    records both per task (RestoreSpec: "finished", "ended"), an operator's are those of its task's subtasks."""
    present = [e for e in entries if e is not None]
    if len(present) != len(entries) or not present:
        return False, False
    return all(e.finished for e in present), all(e.ended or e.finished for e in present)


def _cut(old: Vertex, vertex: Vertex, job: Job, then: OldPlan) -> Cut:
    ours = {then.old_of_new[n]: n for n in vertex.nodes if then.old_of_new.get(n) in old.nodes}
    old_sinks = [n for n in old.nodes if then.kinds[n] == "sink"]
    sinks = tuple(old_sinks.index(then.old_of_new[n]) if then.old_of_new.get(n) in old_sinks else None
                  for n in vertex.nodes if job.nodes[n].kind == "sink")
    renamed = tuple(sorted((o, n) for o, n in ours.items() if o != n))
    collisions = tuple((o, None) for o in old.nodes if o not in ours and o in vertex.nodes)
    return Cut(nodes=frozenset(ours), sinks=sinks,
               source=then.old_of_new.get(vertex.nodes[0]) == old.nodes[0] and then.kinds[old.nodes[0]] == "source",
               backend=any(job.nodes[n].key_fn is not None for n in ours.values()), renamed=renamed,
               backend_moves=(*renamed, *collisions) if renamed or collisions else ())


def _rescaled_operator(restore: RestoreSpec, plan: Plan, old: Vertex, vertex: Vertex, subtask: int, job: Job,
                       entries: Sequence[TaskFiles | None], then: OldPlan, *, at_end: bool) -> OperatorStatePlan:
    p, q, mp = old.parallelism, vertex.parallelism, job.max_parallelism
    groups = key_group_range(mp, q, subtask)
    inputs_of = [e for e in plan.edges if e.down == vertex.id]
    # fed by a broadcast edge: each new subtask continues one old one (its replica), state and channels together
    replicated = any(e.partitioner == "broadcast" for e in inputs_of)
    head = job.nodes[vertex.nodes[0]]
    cut = _cut(old, vertex, job, then)
    source, lanes_of = SourceRule.NONE, None
    if cut.source and not at_end:  # a source heads its chain, then and now (at its end it reads nothing more)
        if getattr(head.payload, "redistributes_positions", False):
            source, lanes_of = SourceRule.DEALT, head.payload.redistribute
        elif getattr(head.payload, "rescalable", False):
            source, lanes_of = SourceRule.LANES, head.payload.lanes
        elif getattr(head.payload, "subtask_splits", False):
            source = SourceRule.SPLITS
        else:
            raise RescaleError(f"source {type(head.payload).__name__} cannot be split at another parallelism")
    return OperatorStatePlan(
        tuple(e.state if e is not None else None for e in entries), cut, key_groups=groups,
        overlapping=tuple(overlapping_subtasks(mp, p, groups)), source=source, subtask=subtask, parallelism=q,
        checkpoint_id=restore.checkpoint_id, replicated=replicated,
        lists_conflict=replicated and len(inputs_of) > 1, max_parallelism=mp, lanes_of=lanes_of)


def _inputs(restore: RestoreSpec, plan: Plan, then: OldPlan, edge: Edge, subtask: int, job: Job,
            rescaled_edges: frozenset[int]) -> InputPlan | None:
    old_edge = then.edge(edge)
    if old_edge is None:
        return None  # inside a chain when checkpointed: nothing was in flight on it
    consumer = then.vertices[old_edge.down]
    if edge.id not in rescaled_edges:
        own = restore.tasks.get(f"{consumer.id}:{subtask}")
        return OwnInputs(edge.id, own.inputs if own is not None else None)
    producer = then.vertices[old_edge.up]

    def files(vertex: Vertex, kind: str) -> tuple[str | None, ...]:
        entries = (restore.tasks.get(f"{vertex.id}:{j}") for j in range(vertex.parallelism))
        return tuple(None if e is None else e.inputs if kind == "in" else e.outputs for e in entries)

    return RedistributedInputs(
        edge.id, old_edge.id, in_files=files(consumer, "in"), out_files=files(producer, "out"),
        partitioner=edge.partitioner, consumer=subtask, new_up=plan.vertices[edge.up].parallelism,
        new_down=plan.vertices[edge.down].parallelism, old_down=consumer.parallelism,
        max_parallelism=job.max_parallelism, timestamped=job.event_time,
        key_fn=edge_key_fn(job, plan.vertices, edge))


# -- executing it on the decoded files -------------------------------------------------------------------------


def assemble(plan: RestorePlan, operators: Mapping[str, Operator], channels: Mapping[str, Channels],
             channel_ids: Mapping[str, int]) -> RestoredState | None:
    """The task's restored state from the plan and its files, decoded (`channel_ids`: the task's input
    channels by channel key). Raises RescaleError for state the plan could not judge without reading it."""
    if plan.nothing:
        return None
    if plan.finished:
        return RestoredState(finished=True)  # finished before that checkpoint: nothing to restore or redo
    state = RestoredState(ended=plan.ended)
    if plan.operator is not None:
        _operator_state(state, plan.operator, operators)
    if plan.outputs_file:
        outputs = channels[plan.outputs_file]
        state.outputs = {k: v for k, v in outputs.items() if int(k.split(":", 1)[0]) in plan.kept_outputs} or None
    restored: dict[int, bytes] = {}
    for part in plan.inputs:
        for key, data in _input_channels(part, channels).items():
            if key in channel_ids:
                restored[channel_ids[key]] = data
    state.inputs = restored or None
    return state


@dataclass(frozen=True, slots=True)
class OperatorPart:
    """An old task's operator state cut to the new task's operators (own_part)."""

    max_parallelism: int | None
    keyed: dict[int, dict[str, dict[Any, Any]]]
    lists: dict[int, dict[str, list[Any]]]
    sinks: list[Any]
    source: Any
    time: dict[str, Any] | None
    backend: dict[str, Any] | None
    async_docs: dict[int, dict[str, Any]]


def own_part(operator: Operator, cut: Cut, key_groups: range | None = None) -> OperatorPart:
    """An old task's operator state cut to the new task's operators: keyed tables and lists by node, sinks by
    their place in the old chain, the source if it heads both."""
    sinks = list(operator.get("sinks") or [])
    new = dict(cut.renamed)
    return OperatorPart(
        max_parallelism=operator.get("max_parallelism"),
        keyed={new.get(n, n): t for n, t in keyed_tables(operator, key_groups=key_groups).items() if n in cut.nodes},
        lists={new.get(n, n): t for n, t in list_tables(operator).items() if n in cut.nodes},
        sinks=[sinks[i] if i is not None and i < len(sinks) else None for i in cut.sinks],
        source=operator.get("source") if cut.source else None,
        time=operator.get("time"),  # a task's watermark state (event time), whole
        # a state backend's handle goes with the keyed operators (restore clips it to the task's key groups)
        backend=operator.get("backend") if cut.backend else None,
        # an asynchronous operator's in-flight input and pending writes (restore clips them to key groups)
        async_docs={new.get(n, n): doc for n, doc in async_documents(operator).items() if n in cut.nodes})


def _operator_state(state: RestoredState, plan: OperatorStatePlan, files: Mapping[str, Operator]) -> None:
    docs = [files[f] if f else None for f in plan.files]
    parts = [None if doc is None else own_part(doc, plan.cut) for doc in docs]
    if plan.key_groups is None:  # the task's own state, as it is
        _own_operator_state(state, parts[0])
    else:
        _check_max_parallelism(parts, plan.max_parallelism)
        _key_group_state(state, plan, docs, parts)
        _redistributed_state(state, plan, parts)
    if state.backend and plan.cut.backend_moves:
        state.backend_moves = dict(plan.cut.backend_moves)


def _own_operator_state(state: RestoredState, own: OperatorPart | None) -> None:
    if own is None:
        return
    state.keyed, state.lists, state.time, state.source, state.sinks = (own.keyed, own.lists, own.time, own.source,
                                                                       own.sinks)
    state.backend = [own.backend] if own.backend else None
    state.async_inflight = {n: [doc] for n, doc in own.async_docs.items()} or None


def _check_max_parallelism(parts: Sequence[OperatorPart | None], expected: int) -> None:
    saved = {int(part.max_parallelism) for part in parts if part is not None and part.max_parallelism is not None}
    if saved - {expected}:
        raise RescaleError(f"the checkpoint's max parallelism {min(saved - {expected})} is not the job's {expected}")


def _key_group_state(state: RestoredState, plan: OperatorStatePlan, docs: Sequence[Operator | None],
                     parts: Sequence[OperatorPart | None]) -> None:
    """Keyed tables, backend handles and async documents: from the old subtasks whose key groups overlap ours,
    cut to ours (a state backend reads only the overlap of each handle: runtime/state/rocksdb.py restore)."""
    overlapping_docs = [doc for doc in (docs[j] for j in plan.overlapping) if doc is not None]
    overlapping = [part for part in (parts[j] for j in plan.overlapping) if part is not None]
    state.keyed = merge_keyed([own_part(doc, plan.cut, key_groups=plan.key_groups).keyed for doc in overlapping_docs])
    state.backend = [part.backend for part in overlapping if part.backend] or None
    inflight: dict[int, list[dict[str, Any]]] = {}
    for part in overlapping:
        for n, doc in part.async_docs.items():
            if not _round_robin(doc):
                inflight.setdefault(n, []).append(doc)
    state.async_inflight = inflight or None


def _round_robin(doc: dict[str, Any]) -> bool:
    """A non-keyed async_map's in-flight document: dealt from every old subtask, not cut by key group."""
    return doc.get("kind") == "io" and not doc.get("keyed")


def _redistributed_state(state: RestoredState, plan: OperatorStatePlan, parts: Sequence[OperatorPart | None]) -> None:
    """Source, sinks, lists and time: from every old subtask, by checkpointing/rescaling.py's rules."""
    def each(name: str) -> list[Any]:
        return [getattr(part, name) if part is not None else None for part in parts]

    if plan.source is SourceRule.LANES:
        assert plan.lanes_of is not None  # the planner takes it from the rescalable source
        state.source = rescale_source(each("source"), plan.parallelism, plan.lanes_of)[plan.subtask]
    elif plan.source is SourceRule.SPLITS:
        state.source = deal_splits(each("source"), plan.parallelism)[plan.subtask]
    elif plan.source is SourceRule.DEALT:
        assert plan.lanes_of is not None  # the planner takes the source's own `redistribute`
        state.source = plan.lanes_of(each("source"), plan.parallelism)[plan.subtask]
    state.sinks = rescale_sinks(each("sinks"), plan.parallelism, plan.subtask, plan.checkpoint_id)
    # broadcast state (the broadcast state pattern) is the replica's even beside another input: it reflects the
    # broadcast input only, and the replica's channel state of that input completes it
    if plan.lists_conflict and any(each("lists")) and not only_broadcast_state(each("lists")):
        raise RescaleError("its list state reflects a broadcast input and another one: a broadcast input "
                           "needs it replicated, the other split, so it cannot be redistributed")
    state.lists = rescale_lists(each("lists"), plan.parallelism, plan.subtask, replicated=plan.replicated)
    state.time = rescale_time(each("time"))
    docs = each("async_docs")
    for n in sorted({n for d in docs if d for n, doc in d.items() if _round_robin(doc)}):
        share = rescale_async_io([d.get(n) if d else None for d in docs], plan.parallelism, plan.subtask)
        if share is not None:
            state.async_inflight = {**(state.async_inflight or {}), n: [share]}


def _input_channels(part: InputPlan, files: Mapping[str, Channels]) -> dict[str, bytes]:
    """One input edge's restored channels, by new channel key."""
    if isinstance(part, OwnInputs):
        prefix = f"{part.edge}:"
        return {k: v for k, v in (files[part.file] if part.file else {}).items() if k.startswith(prefix)}
    prefix = f"{part.old_edge}:"
    streams: dict[tuple[int, int], bytes] = {}
    # per old channel: what its consumer had received, then what its producer still held, in that order
    for name in (*part.in_files, *part.out_files):
        for key, data in (files[name] if name else {}).items():
            if key.startswith(prefix):
                _, up, down = key.split(":")
                streams[(int(up), int(down))] = streams.get((int(up), int(down)), b"") + data
    if part.partitioner == "broadcast":
        share = redistribute_broadcast(streams, consumer=part.consumer, old_down=part.old_down, new_up=part.new_up)
    else:
        share = redistribute_edge(part.partitioner, streams, consumer=part.consumer, new_up=part.new_up,
                                  new_down=part.new_down, max_parallelism=part.max_parallelism,
                                  key_fn=part.key_fn, timestamped=part.timestamped)
    return {f"{part.edge}:{up}:{part.consumer}": data for up, data in share.items()}
