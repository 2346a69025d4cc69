"""Whether a checkpoint can be restored under a plan of other parallelisms, decided before anything is stopped.

Pure, on the job graph and the plan only (the coordinator calls it on a restore and before a rescale). What
can be restored is redistributed by the workers (runtime/checkpointing/rescaling.py); what cannot is refused
here with one line naming the operator and saying what to do.
"""

from __future__ import annotations

from typing import Any

from runtime.api import Job
from runtime.graph.plan import Edge, Vertex

CHAIN = " -> "


def chaining_refusal(checkpointed: list[dict[str, Any]], ours: list[Vertex]) -> str | None:
    """When the checkpoint's tasks (its metadata's vertices: name, parallelism) and the plan's differ only in
    how the same operators are chained, the line that says which pair and why; None when the graphs differ
    otherwise (or not at all).

    Operators chain when a forward edge (explicit, or implicit between equal parallelisms) joins them, so a
    rescale of one side of an implicit forward pair turns it into a rebalance between two tasks. Their state
    would have to be cut along the chain, which restoring does not do: the restore is refused instead."""
    saved = [str(v["name"]) for v in checkpointed]
    old_parallelism = {op: int(v["parallelism"]) for v in checkpointed for op in str(v["name"]).split(CHAIN)}
    old_ops = [op for name in saved for op in name.split(CHAIN)]
    new_ops = [op for v in ours for op in v.name.split(CHAIN)]
    if old_ops != new_ops or saved == [v.name for v in ours]:
        return None
    old_next = {a: b for name in saved for a, b in zip(name.split(CHAIN), name.split(CHAIN)[1:], strict=False)}
    new_next = {a: b for v in ours for a, b in zip(v.name.split(CHAIN), v.name.split(CHAIN)[1:], strict=False)}
    parallelism = {op: v.parallelism for v in ours for op in v.name.split(CHAIN)}
    for a, b in old_next.items():
        if new_next.get(a) != b:
            return (f"{a} and {b} ran chained in one task at parallelism {old_parallelism.get(a, '?')}; at "
                    f"{parallelism[a]} and {parallelism[b]} they would not: give both the same parallelism")
    for a, b in new_next.items():
        if old_next.get(a) != b:
            return (f"{a} and {b} ran as two tasks (parallelism {old_parallelism.get(a, '?')} and "
                    f"{old_parallelism.get(b, '?')}); at {parallelism[a]} and {parallelism[b]} they would be "
                    "chained into one: keep their parallelisms apart, or put rebalance() between them")
    return None


def rescale_refusal(job: Job, vertices: list[Vertex], edges: list[Edge], old: dict[int, int]) -> str | None:
    """Why the checkpoint (taken at parallelisms `old`, by vertex id) cannot be restored at the plan's
    parallelisms, in one line naming the operator; None when it can."""
    changed = {v.id for v in vertices if old[v.id] != v.parallelism}
    for vertex in vertices:
        if vertex.id not in changed:
            continue
        head = job.nodes[vertex.nodes[0]]
        if head.kind == "source" and not (getattr(head.payload, "rescalable", False)
                                          or getattr(head.payload, "subtask_splits", False)):
            return (f"source {head.name} ({type(head.payload).__name__}) cannot be restored at parallelism "
                    f"{vertex.parallelism} (checkpointed at {old[vertex.id]}): its position does not say how to "
                    "split its input (a Source declares rescalable = True and describes what it has left as "
                    "lanes, or subtask_splits = True when its subtasks read independent inputs, see "
                    "runtime/connectors/); keep it at its checkpointed parallelism")
        inputs = [e for e in edges if e.down == vertex.id]
        stateful = [job.nodes[n].name for n in vertex.nodes if job.nodes[n].kind == "process"]
        if len(inputs) > 1 and any(e.partitioner == "broadcast" for e in inputs) and stateful:
            return (f"{stateful[0]} reads a broadcast input and another one: its list state would have to be "
                    f"replicated for the one and split for the other, so it cannot be restored at parallelism "
                    f"{vertex.parallelism} (checkpointed at {old[vertex.id]})")
    return None
