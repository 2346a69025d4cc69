"""Reading one task's restored state from a checkpoint, at the parallelism it was taken or another one.

Blocking file I/O: run it in a thread. At an unchanged parallelism a task reads its own three files, as
always. When its vertex, or a vertex it exchanges data with, runs at another parallelism than in the
checkpoint, it reads what it needs from every old task concerned and lets the pure
checkpointing/rescaling.py decide which part is its own. When the new parallelisms split a chain, the
old tasks and edges are those of the old chaining (OldPlan): a task takes its operators' part of the old
task that ran them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from runtime.api import Job
from runtime.checkpointing.rescaling import (
    RescaleError,
    merge_keyed,
    overlapping_subtasks,
    redistribute_broadcast,
    redistribute_edge,
    rescale_lists,
    rescale_sinks,
    rescale_source,
    rescale_time,
)
from runtime.checkpointing.snapshots import (
    async_documents,
    decode_channel_state,
    decode_operator_state,
    keyed_tables,
    list_tables,
    read_file,
)
from runtime.connectors.source import Source
from runtime.connectors.splits import SplitReader, deal_splits, fold_emitted, is_split_position
from runtime.execution.channels import InputChannel
from runtime.execution.task import RestoredState
from runtime.graph.partitioning import key_group_range
from runtime.graph.plan import Edge, Plan, Vertex, chain_graph, edge_key_fn
from runtime.graph.restore_spec import RestoreSpec


class OldPlan:
    """The checkpoint's tasks and edges, as the job chained them at its checkpointed parallelisms.

    The same operators, maybe chained otherwise: a forward pair whose ends now run at different parallelisms
    ran as one task then (restore.nodes: each node's checkpointed parallelism, from the coordinator). Every
    new task's operators lie in one old task; an edge is an old one when its ends were in different old tasks,
    new (it was inside a chain, with nothing in flight) when they were in the same one."""

    def __init__(self, restore: RestoreSpec, plan: Plan, job: Job) -> None:
        nodes = restore.nodes
        if nodes:
            then = Job(job.name, max_parallelism=job.max_parallelism)
            then.nodes = [replace(n, parallelism=nodes.get(n.id, n.parallelism)) for n in job.nodes]
            self.vertices, self.edges = chain_graph(then)
        else:  # chained as now (a checkpoint restored before the coordinator sent node parallelisms)
            old = restore.parallelism
            self.vertices = [replace(v, parallelism=old.get(v.id, v.parallelism)) for v in plan.vertices]
            self.edges = list(plan.edges)
        self.plan = plan
        self.vertex_of_node = {n: v for v in self.vertices for n in v.nodes}

    def vertex(self, vertex: Vertex) -> Vertex:
        return self.vertex_of_node[vertex.nodes[0]]

    def edge(self, edge: Edge) -> Edge | None:
        """The old edge a new one continues (same producing and consuming operator and input), or None."""
        tail = self.plan.vertices[edge.up].nodes[-1]
        head = self.plan.vertices[edge.down].nodes[0]
        for old in self.edges:
            if (self.vertices[old.up].nodes[-1] == tail and self.vertices[old.down].nodes[0] == head
                    and old.input_index == edge.input_index):
                return old
        return None

    def same_vertex(self, vertex: Vertex) -> bool:
        old = self.vertex(vertex)
        return old.id == vertex.id and old.nodes == vertex.nodes and old.parallelism == vertex.parallelism

    def same_edge(self, edge: Edge) -> bool:
        """The edge, its channels and both its ends are as checkpointed: its channel state stays where it is."""
        old = self.edge(edge)
        return (old is not None and old.id == edge.id and self.same_vertex(self.plan.vertices[edge.up])
                and self.same_vertex(self.plan.vertices[edge.down]))


def load_restored(restore: RestoreSpec, plan: Plan, vertex: Vertex, subtask: int, inputs: list[InputChannel],
                  job: Job) -> RestoredState | None:
    then = OldPlan(restore, plan, job)
    rescaled_edges = {e.id for e in plan.edges if not then.same_edge(e)}
    touching = any(e.id in rescaled_edges and vertex.id in (e.up, e.down) for e in plan.edges)
    if then.same_vertex(vertex) and not touching:
        return _split_positions_whole(_load_own(restore, f"{vertex.id}:{subtask}", inputs))
    try:
        return _split_positions_whole(_load_rescaled(restore, plan, vertex, subtask, inputs, job, then,
                                                     rescaled_edges))
    except RescaleError as exc:
        raise RescaleError(f"cannot restore {vertex.name} subtask {subtask} at parallelism {vertex.parallelism} "
                           f"(checkpointed at {then.vertex(vertex).parallelism}): {exc}") from None


def _split_positions_whole(state: RestoredState | None) -> RestoredState | None:
    """A split reader skips what was emitted after its position itself, split by split (the task's own skip
    would read from whichever split comes first)."""
    if state is not None and state.source and is_split_position(state.source[0]):
        state.source = [fold_emitted(state.source[0], int(state.source[1])), 0]
    return state


def source_for(source: Source, restored: RestoredState | None) -> Source:
    """The source a task runs: the job's own, or a reader of the splits of old subtasks dealt to it
    (connectors/splits.py) when its checkpointed position says so."""
    if restored is not None and restored.source and is_split_position(restored.source[0]):
        return SplitReader(source)
    return source


def _load_own(restore: RestoreSpec, task_key: str, inputs: list[InputChannel]) -> RestoredState | None:
    """The task's own files of a checkpoint taken at the same parallelism."""
    files = restore.tasks.get(task_key)
    if files is None:
        return None
    if files.get("finished"):
        return RestoredState(finished=True)  # finished before that checkpoint: nothing to restore or redo
    directory = restore.path
    state = RestoredState(ended=bool(files.get("ended")))
    if files.get("state"):
        operator = decode_operator_state(read_file(directory, files["state"]), files["state"])
        state.keyed = keyed_tables(operator)
        state.backend = [operator["backend"]] if operator.get("backend") else None
        state.source = operator.get("source")
        state.sinks = list(operator.get("sinks") or [])
        state.lists = list_tables(operator)
        state.time = operator.get("time")
        state.async_inflight = {n: [doc] for n, doc in async_documents(operator).items()} or None
    if files.get("out"):
        state.outputs = decode_channel_state(read_file(directory, files["out"]), files["out"])
    if files.get("in"):
        by_key = {ch.key: ch.channel_id for ch in inputs}
        stored = decode_channel_state(read_file(directory, files["in"]), files["in"])
        state.inputs = {by_key[k]: v for k, v in stored.items() if k in by_key}
    return state


class _Files:
    """The old tasks' files, each read and decoded at most once."""

    def __init__(self, restore: RestoreSpec) -> None:
        self.restore = restore
        self._cache: dict[str, Any] = {}

    def entry(self, vertex_id: int, subtask: int) -> Mapping[str, Any]:
        return self.restore.tasks.get(f"{vertex_id}:{subtask}") or {}

    def operator(self, vertex_id: int, subtask: int) -> dict[str, Any] | None:
        name = self.entry(vertex_id, subtask).get("state")
        if not name:
            return None
        if name not in self._cache:
            self._cache[name] = decode_operator_state(read_file(self.restore.path, name), name)
        return self._cache[name]  # type: ignore[no-any-return]

    def channels(self, vertex_id: int, subtask: int, kind: str) -> dict[str, bytes]:
        name = self.entry(vertex_id, subtask).get(kind)
        if not name:
            return {}
        if name not in self._cache:
            self._cache[name] = decode_channel_state(read_file(self.restore.path, name), name)
        return self._cache[name]  # type: ignore[no-any-return]


def _own_part(operator: dict[str, Any] | None, old: Vertex, vertex: Vertex, job: Job,
              key_groups: range | None = None) -> dict[str, Any] | None:
    """An old task's operator state cut to the operators of `vertex` (all of them unless a chain was split):
    keyed tables and lists by node, sinks by their place in the old chain, the source if it heads both."""
    if operator is None:
        return None
    mine = set(vertex.nodes)
    old_sinks = [n for n in old.nodes if job.nodes[n].kind == "sink"]
    sinks = list(operator.get("sinks") or [])
    return {"max_parallelism": operator.get("max_parallelism", job.max_parallelism),
            "keyed": {n: t for n, t in keyed_tables(operator, key_groups=key_groups).items() if n in mine},
            "lists": {n: t for n, t in list_tables(operator).items() if n in mine},
            "sinks": [state for n, state in zip(old_sinks, sinks, strict=False) if n in mine],
            "source": operator.get("source") if vertex.nodes[0] == old.nodes[0] else None,
            "time": operator.get("time"),  # a task's watermark state (event time), whole
            # a state backend's handle goes with the keyed operators (restore clips it to the task's key groups)
            "backend": operator.get("backend") if any(job.nodes[n].key_fn is not None for n in mine) else None,
            # an asynchronous operator's in-flight input and pending writes (restore clips them to key groups)
            "async": {n: doc for n, doc in async_documents(operator).items() if n in mine}}


def _load_rescaled(restore: RestoreSpec, plan: Plan, vertex: Vertex, subtask: int, inputs: list[InputChannel],
                   job: Job, then: OldPlan, rescaled_edges: set[int]) -> RestoredState | None:
    files = _Files(restore)
    old_vertex = then.vertex(vertex)
    p, q = old_vertex.parallelism, vertex.parallelism
    inputs_of = [e for e in plan.edges if e.down == vertex.id]
    # fed by a broadcast edge: each new subtask continues one old one (its replica), state and channels together
    replicated = any(e.partitioner == "broadcast" for e in inputs_of)
    entries = [files.entry(old_vertex.id, j) for j in range(p)]
    if p == q:  # only a neighbour (or the chain) changed: operator state is the task's own
        if not entries[subtask]:
            return None
        if entries[subtask].get("finished"):
            return RestoredState(finished=True)
        state = RestoredState(ended=bool(entries[subtask].get("ended")))
        operator = _own_part(files.operator(old_vertex.id, subtask), old_vertex, vertex, job)
        if operator is not None:
            state.keyed = operator["keyed"]  # _own_part's tables, already decoded
            state.backend = [operator["backend"]] if operator["backend"] else None
            state.source = operator["source"]
            state.sinks = operator["sinks"]
            state.lists = operator["lists"]
            state.time = operator.get("time")
            state.async_inflight = {n: [doc] for n, doc in operator["async"].items()} or None
        # output channel state of a rescaled edge is taken by its new consumers; the rest is re-sent as always
        # (an unchanged edge kept its id)
        keep = {e.id for e in plan.edges if e.up == vertex.id and e.id not in rescaled_edges}
        outputs = {k: v for k, v in files.channels(old_vertex.id, subtask, "out").items()
                   if int(k.split(":", 1)[0]) in keep}
        state.outputs = outputs or None
    else:
        if all(e.get("finished") for e in entries):
            return RestoredState(finished=True)
        state = RestoredState(ended=all(e.get("ended") or e.get("finished") for e in entries))
        groups = key_group_range(job.max_parallelism, q, subtask)
        operators = [_own_part(files.operator(old_vertex.id, j), old_vertex, vertex, job) for j in range(p)]
        for operator in operators:
            saved = int(operator["max_parallelism"]) if operator else job.max_parallelism
            if saved != job.max_parallelism:
                raise RescaleError(f"the checkpoint's max parallelism {saved} is not the job's "
                                   f"{job.max_parallelism}")
        state.keyed = merge_keyed([_own_part(files.operator(old_vertex.id, j), old_vertex, vertex, job,
                                             key_groups=groups)["keyed"]  # type: ignore[index]
                                   for j in overlapping_subtasks(job.max_parallelism, p, groups)
                                   if operators[j] is not None])
        # a state backend's handles of the old subtasks whose key groups overlap ours: the backend reads only
        # the overlap of each (runtime/state/rocksdb.py restore)
        handles = [o["backend"] for o in (operators[j] for j in overlapping_subtasks(job.max_parallelism, p, groups))
                   if o is not None and o["backend"]]
        state.backend = handles or None
        inflight: dict[int, list[dict[str, Any]]] = {}
        for j in overlapping_subtasks(job.max_parallelism, p, groups):
            for n, doc in (operators[j] or {}).get("async", {}).items():
                inflight.setdefault(n, []).append(doc)
        state.async_inflight = inflight or None
        head = job.nodes[vertex.nodes[0]]
        if head.kind == "source":
            old_sources = [o["source"] if o else None for o in operators]
            if getattr(head.payload, "rescalable", False):
                state.source = rescale_source(old_sources, q, head.payload.lanes)[subtask]
            elif getattr(head.payload, "subtask_splits", False):
                state.source = deal_splits(old_sources, q)[subtask]
            else:
                raise RescaleError(f"source {type(head.payload).__name__} cannot be split at another parallelism")
        state.sinks = rescale_sinks([o["sinks"] if o else None for o in operators], q, subtask,
                                    restore.checkpoint_id)
        old_lists = [o["lists"] if o else None for o in operators]
        if replicated and len(inputs_of) > 1 and any(old_lists):
            raise RescaleError("its list state reflects a broadcast input and another one: a broadcast input "
                               "needs it replicated, the other split, so it cannot be redistributed")
        state.lists = rescale_lists(old_lists, q, subtask, replicated=replicated)
        state.time = rescale_time([o.get("time") if o else None for o in operators])
    by_key = {ch.key: ch.channel_id for ch in inputs}
    restored_inputs: dict[int, bytes] = {}
    for edge in inputs_of:
        old_edge = then.edge(edge)
        if old_edge is None:
            continue  # inside a chain when checkpointed: nothing was in flight on it
        if edge.id not in rescaled_edges:
            own = files.channels(old_vertex.id, subtask, "in")
            prefix = f"{edge.id}:"
            restored_inputs.update({by_key[k]: v for k, v in own.items() if k.startswith(prefix) and k in by_key})
            continue
        prefix = f"{old_edge.id}:"
        streams: dict[tuple[int, int], bytes] = {}
        # per old channel: what its consumer had received, then what its producer still held, in that order
        producer = then.vertices[old_edge.up]
        for vertex_id, count, kind in ((old_vertex.id, p, "in"), (producer.id, producer.parallelism, "out")):
            for old_subtask in range(count):
                for name, data in files.channels(vertex_id, old_subtask, kind).items():
                    if name.startswith(prefix):
                        pair = (int(name.split(":")[1]), int(name.split(":")[2]))
                        streams[pair] = streams.get(pair, b"") + data
        if edge.partitioner == "broadcast":
            share = redistribute_broadcast(streams, consumer=subtask, old_down=p,
                                           new_up=plan.vertices[edge.up].parallelism)
        else:
            share = redistribute_edge(edge.partitioner, streams, consumer=subtask,
                                      new_up=plan.vertices[edge.up].parallelism, new_down=q,
                                      max_parallelism=job.max_parallelism,
                                      key_fn=edge_key_fn(job, plan.vertices, edge), timestamped=job.event_time)
        for up_subtask, data in share.items():
            restored_inputs[by_key[f"{edge.id}:{up_subtask}:{subtask}"]] = data
    state.inputs = restored_inputs or None
    return state
