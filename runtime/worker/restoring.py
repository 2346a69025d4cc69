"""Reading one task's restored state from a checkpoint, at the parallelism it was taken or another one.

Blocking file I/O: run it in a thread. At an unchanged parallelism a task reads its own three files, as
always. When its vertex, or a vertex it exchanges data with, runs at another parallelism than in the
checkpoint, it reads what it needs from every old task concerned and lets the pure
checkpointing/rescaling.py decide which part is its own.
"""

from __future__ import annotations

from typing import Any

from runtime.api import Job
from runtime.checkpointing.rescaling import (
    RescaleError,
    merge_keyed,
    overlapping_subtasks,
    redistribute_edge,
    rescale_sinks,
    rescale_source,
    rescale_time,
)
from runtime.checkpointing.snapshots import decode_channel_state, decode_operator_state, keyed_tables, read_file
from runtime.execution.channels import InputChannel
from runtime.execution.task import RestoredState
from runtime.graph.partitioning import key_group_range
from runtime.graph.plan import Plan, Vertex, edge_key_fn


def load_restored(restore: dict[str, Any], plan: Plan, vertex: Vertex, subtask: int, inputs: list[InputChannel],
                  job: Job) -> RestoredState | None:
    old_parallelism = {int(k): int(p) for k, p in (restore.get("parallelism") or {}).items()}

    def old(vertex_id: int) -> int:
        return old_parallelism.get(vertex_id, plan.vertices[vertex_id].parallelism)

    rescaled_edges = {e.id for e in plan.edges if old(e.up) != plan.vertices[e.up].parallelism
                      or old(e.down) != plan.vertices[e.down].parallelism}
    touching = any(e.id in rescaled_edges and vertex.id in (e.up, e.down) for e in plan.edges)
    if old(vertex.id) == vertex.parallelism and not touching:
        return _load_own(restore, f"{vertex.id}:{subtask}", inputs)
    try:
        return _load_rescaled(restore, plan, vertex, subtask, inputs, job, old, rescaled_edges)
    except RescaleError as exc:
        raise RescaleError(f"cannot restore {vertex.name} subtask {subtask} at parallelism {vertex.parallelism} "
                           f"(checkpointed at {old(vertex.id)}): {exc}") from None


def _load_own(restore: dict[str, Any], task_key: str, inputs: list[InputChannel]) -> RestoredState | None:
    """The task's own files of a checkpoint taken at the same parallelism."""
    files = restore["tasks"].get(task_key)
    if files is None:
        return None
    if files.get("finished"):
        return RestoredState(finished=True)  # finished before that checkpoint: nothing to restore or redo
    directory = restore["path"]
    state = RestoredState(ended=bool(files.get("ended")))
    if files.get("state"):
        operator = decode_operator_state(read_file(directory, files["state"]), files["state"])
        state.keyed = keyed_tables(operator)
        state.source = operator.get("source")
        state.sinks = list(operator.get("sinks") or [])
        state.time = operator.get("time")
    if files.get("out"):
        state.outputs = decode_channel_state(read_file(directory, files["out"]), files["out"])
    if files.get("in"):
        by_key = {ch.key: ch.channel_id for ch in inputs}
        stored = decode_channel_state(read_file(directory, files["in"]), files["in"])
        state.inputs = {by_key[k]: v for k, v in stored.items() if k in by_key}
    return state


class _Files:
    """The old tasks' files, each read and decoded at most once."""

    def __init__(self, restore: dict[str, Any]) -> None:
        self.restore = restore
        self._cache: dict[str, Any] = {}

    def entry(self, vertex_id: int, subtask: int) -> dict[str, Any]:
        return self.restore["tasks"].get(f"{vertex_id}:{subtask}") or {}

    def operator(self, vertex_id: int, subtask: int) -> dict[str, Any] | None:
        name = self.entry(vertex_id, subtask).get("state")
        if not name:
            return None
        if name not in self._cache:
            self._cache[name] = decode_operator_state(read_file(self.restore["path"], name), name)
        return self._cache[name]  # type: ignore[no-any-return]

    def channels(self, vertex_id: int, subtask: int, kind: str) -> dict[str, bytes]:
        name = self.entry(vertex_id, subtask).get(kind)
        if not name:
            return {}
        if name not in self._cache:
            self._cache[name] = decode_channel_state(read_file(self.restore["path"], name), name)
        return self._cache[name]  # type: ignore[no-any-return]


def _load_rescaled(restore: dict[str, Any], plan: Plan, vertex: Vertex, subtask: int, inputs: list[InputChannel],
                   job: Job, old: Any, rescaled_edges: set[int]) -> RestoredState | None:
    files = _Files(restore)
    p, q = old(vertex.id), vertex.parallelism
    entries = [files.entry(vertex.id, j) for j in range(p)]
    if p == q:  # only a neighbour changed: operator state is the task's own
        if not entries[subtask]:
            return None
        if entries[subtask].get("finished"):
            return RestoredState(finished=True)
        state = RestoredState(ended=bool(entries[subtask].get("ended")))
        operator = files.operator(vertex.id, subtask)
        if operator is not None:
            state.keyed = keyed_tables(operator)
            state.source = operator.get("source")
            state.sinks = list(operator.get("sinks") or [])
            state.time = operator.get("time")
        # output channel state of a rescaled edge is taken by its new consumers; the rest is re-sent as always
        outputs = {k: v for k, v in files.channels(vertex.id, subtask, "out").items()
                   if int(k.split(":", 1)[0]) not in rescaled_edges}
        state.outputs = outputs or None
    else:
        if all(e.get("finished") for e in entries):
            return RestoredState(finished=True)
        state = RestoredState(ended=all(e.get("ended") or e.get("finished") for e in entries))
        operators = [files.operator(vertex.id, j) for j in range(p)]
        for operator in operators:
            saved = int(operator.get("max_parallelism", job.max_parallelism)) if operator else job.max_parallelism
            if saved != job.max_parallelism:
                raise RescaleError(f"the checkpoint's max parallelism {saved} is not the job's "
                                   f"{job.max_parallelism}")
        groups = key_group_range(job.max_parallelism, q, subtask)
        state.keyed = merge_keyed([keyed_tables(operators[j], key_groups=groups)  # type: ignore[arg-type]
                                   for j in overlapping_subtasks(job.max_parallelism, p, groups)
                                   if operators[j] is not None])
        head = job.nodes[vertex.nodes[0]]
        if head.kind == "source":
            if not getattr(head.payload, "rescalable", False):
                raise RescaleError(f"source {type(head.payload).__name__} cannot be split at another parallelism")
            state.source = rescale_source([o.get("source") if o else None for o in operators], q,
                                          head.payload.lanes)[subtask]
        state.sinks = rescale_sinks([o.get("sinks") if o else None for o in operators], q, subtask,
                                    int(restore["checkpoint_id"]))
        state.time = rescale_time([o.get("time") if o else None for o in operators])
    by_key = {ch.key: ch.channel_id for ch in inputs}
    restored_inputs: dict[int, bytes] = {}
    for edge in plan.edges:
        if edge.down != vertex.id:
            continue
        prefix = f"{edge.id}:"
        if edge.id not in rescaled_edges:
            own = files.channels(vertex.id, subtask, "in")
            restored_inputs.update({by_key[k]: v for k, v in own.items() if k.startswith(prefix) and k in by_key})
            continue
        streams: dict[tuple[int, int], bytes] = {}
        # per old channel: what its consumer had received, then what its producer still held, in that order
        for vertex_id, count, kind in ((vertex.id, p, "in"), (edge.up, old(edge.up), "out")):
            for old_subtask in range(count):
                for name, data in files.channels(vertex_id, old_subtask, kind).items():
                    if name.startswith(prefix):
                        pair = (int(name.split(":")[1]), int(name.split(":")[2]))
                        streams[pair] = streams.get(pair, b"") + data
        share = redistribute_edge(edge.partitioner, streams, consumer=subtask,
                                  new_up=plan.vertices[edge.up].parallelism, new_down=q,
                                  max_parallelism=job.max_parallelism, key_fn=edge_key_fn(job, plan.vertices, edge),
                                  timestamped=job.event_time)
        for producer, data in share.items():
            restored_inputs[by_key[f"{edge.id}:{producer}:{subtask}"]] = data
    state.inputs = restored_inputs or None
    return state
