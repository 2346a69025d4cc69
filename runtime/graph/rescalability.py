"""Whether a checkpoint can be restored under a plan of other parallelisms, decided before anything is stopped.

Pure, on the job graph and the plan only (the coordinator calls it on a restore and before a rescale). What
can be restored is redistributed by the workers (runtime/checkpointing/rescaling.py, worker/restoring.py);
what cannot is refused here with one line naming the operator and saying what to do.

Chaining. Operators chain when a forward edge (explicit, or implicit between equal parallelisms) joins them,
so a rescale of one end of an implicit forward pair turns it into a rebalance between two tasks. That *split*
is restored: each new task takes its operators' part of the old task's state (by node), and nothing was in
flight inside the chain. The opposite, two tasks that a rescale would chain into one, is refused: what was in
flight between them would have to enter the chain in its middle.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from runtime.api import Job
from runtime.graph.plan import Edge, Vertex, chain_graph

CHAIN = " -> "


class NotRestorable(ValueError):
    """The checkpoint cannot be restored under this plan; the message is one line for the user."""


def checkpointed_node_parallelism(checkpointed: list[dict[str, Any]], job: Job,
                                  ours: list[Vertex]) -> dict[int, int]:
    """Each operator's parallelism in the checkpoint (its metadata's vertices: name, parallelism), by node id.
    Raises NotRestorable when the checkpoint's tasks cannot be matched with the job's, naming the pair of
    operators a rescale would chain."""
    saved = [str(v["name"]) for v in checkpointed]
    names = [v.name for v in ours]
    if saved == names:
        return {n: int(v["parallelism"]) for v, ours_v in zip(checkpointed, ours, strict=True) for n in ours_v.nodes}
    different = NotRestorable(f"was taken from a different job graph: {saved} != {names}")
    node_names = Counter(n.name for n in job.nodes)
    old_ops = Counter(op for name in saved for op in name.split(CHAIN))
    if old_ops != node_names or any(c > 1 for c in node_names.values()):
        raise different
    by_name = {n.name: n.id for n in job.nodes}
    parallelism = {by_name[op]: int(v["parallelism"]) for v in checkpointed for op in str(v["name"]).split(CHAIN)}
    then = Job(job.name, max_parallelism=job.max_parallelism)
    then.nodes = [replace(n, parallelism=parallelism[n.id]) for n in job.nodes]
    old_vertices, _ = chain_graph(then)
    if [v.name for v in old_vertices] != saved:
        raise different
    old_of = {n: v for v in old_vertices for n in v.nodes}
    for vertex in ours:
        for a, b in zip(vertex.nodes, vertex.nodes[1:], strict=False):
            if old_of[a] is not old_of[b]:
                na, nb = job.nodes[a].name, job.nodes[b].name
                raise NotRestorable(f"{na} and {nb} ran as two tasks (parallelism {parallelism[a]} and "
                                    f"{parallelism[b]}); at {vertex.parallelism} they would be chained into one, "
                                    "and what was in flight between them cannot enter a chain in its middle: keep "
                                    "their parallelisms apart, or put rebalance() between them")
    return parallelism


def ended_operators(vertices: Sequence[Mapping[str, Any]], acks: Mapping[str, Mapping[str, Any]]) -> frozenset[int]:
    """The checkpoint's operators (old node ids) every subtask of which had reached its end of input: its
    task's ack is marked "finished" (the coordinator's, for a task that finished before the checkpoint) or
    "ended" (the task's own, past its end and waiting for its last commit). Such an operator restores at any
    parallelism without reading its input again: its new subtasks start at their end (restore_plan.py), so
    what its position would say about splitting its input does not matter. `vertices`: the checkpoint's
    `_metadata` vertices (id, parallelism, nodes); `acks`: task "vertex:subtask" -> its ack's state."""
    out: set[int] = set()
    for v in vertices:
        marks = [acks.get(f"{v['id']}:{j}") or {} for j in range(int(v["parallelism"]))]
        if marks and all(m.get("finished") or m.get("ended") for m in marks):
            out.update(int(n) for n in v.get("nodes") or ())
    return frozenset(out)


def rescale_refusal(job: Job, vertices: list[Vertex], edges: list[Edge], old: dict[int, int], *,
                    ended: frozenset[int] = frozenset()) -> str | None:
    """Why the checkpoint (taken at parallelisms `old`, by node id) cannot be restored at the plan's
    parallelisms, in one line naming the operator; None when it can. `ended`: the job's operators (node ids)
    that were at their end in the checkpoint (`ended_operators`): a source among them reads nothing more, so
    it restores at any parallelism."""
    for vertex in vertices:
        before = {old.get(n, vertex.parallelism) for n in vertex.nodes}
        if before == {vertex.parallelism}:
            continue
        was = "/".join(str(p) for p in sorted(before))
        head = job.nodes[vertex.nodes[0]]
        splittable = getattr(head.payload, "rescalable", False) or getattr(head.payload, "subtask_splits", False)
        if head.kind == "source" and old.get(head.id, vertex.parallelism) != vertex.parallelism \
                and head.id not in ended and not splittable:
            return (f"source {head.name} ({type(head.payload).__name__}) cannot be restored at parallelism "
                    f"{vertex.parallelism} (checkpointed at {was}): its position does not say how to "
                    "split its input (a Source declares rescalable = True and describes what it has left as "
                    "lanes, or subtask_splits = True when its subtasks read independent inputs, see "
                    "runtime/connectors/); keep it at its checkpointed parallelism")
        inputs = [e for e in edges if e.down == vertex.id]
        # a broadcast state pattern's own state restores: broadcast state from the replica, keyed state by key
        # group; a process function in its chain would still hold list state of both inputs
        stateful = [job.nodes[n].name for n in vertex.nodes if job.nodes[n].kind in ("process", "co_process")]
        if len(inputs) > 1 and any(e.partitioner == "broadcast" for e in inputs) and stateful:
            return (f"{stateful[0]} reads a broadcast input and another one: its list state would have to be "
                    f"replicated for the one and split for the other, so it cannot be restored at parallelism "
                    f"{vertex.parallelism} (checkpointed at {was})")
    return None
