"""Restoring a checkpoint into another version of the job: operators matched by uid. Pure, no I/O.

The checkpoint records its job graph by operator uid (runtime/graph/operator_ids.py). A new version of the job
restores it when its operators can be matched by uid:

- an operator of the job that the checkpoint does not hold (added since) starts empty;
- an operator of the checkpoint that the job no longer has (removed, or given another uid) and that keeps
  state (a source, sink, process or keyed operator) is refused, unless the user allows dropping its state
  (`--allow-non-restored-state`); a stateless one (map, filter, flat_map) has nothing to lose;
- an operator whose kind of state changed (keyed, operator list state, source position, sink files) is refused
  with a line naming it: the state would not mean anything to it; so is a state declared under the same name as
  another kind (value, list, map, reducing, aggregating: `kind_change`, from the kinds the checkpoint recorded
  and those the new version's function declares, runtime/api/schema.py);
- the checkpoint's task boundaries are kept (groups for plan.chain_graph), so state always belongs to one old
  task per new one, whatever the chaining would be now; channel state belongs to an edge by (producing uid,
  consuming uid, input index): in-flight data of an unaligned checkpoint on an edge the job no longer has
  (an operator inserted into it, removed from it, rewired) is refused with the edge named. Savepoints and
  aligned checkpoints hold no in-flight data and restore across any change.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from runtime.api import Job
from runtime.api.schema import declared_state_kinds

# what an operator of each kind keeps in a checkpoint ("" nothing); two kinds with the same class restore into
# each other (a keyed process function and a reduce both hold keyed tables)
STATE_CLASS = {"source": "source position", "sink": "sink files", "process": "operator list state",
               "keyed_process": "keyed state", "reduce": "keyed state",
               "map": "", "filter": "", "flat_map": ""}


@dataclass(frozen=True)
class OperatorMatch:
    """The job's operators against the checkpoint's, by uid."""

    old_of_new: dict[int, int]  # new node id -> the checkpoint's node id of the same uid
    old_vertex_of_new: dict[int, int]  # new node id -> the checkpoint's task (vertex) that ran it
    added: tuple[str, ...]  # uids the checkpoint does not hold
    removed: tuple[str, ...]  # uids of the checkpoint the job no longer has


def match_operators(graph: Mapping[str, Any], job: Job) -> OperatorMatch:
    """Match by uid; `graph` is the checkpoint's recorded graph (its `_metadata`: operators, vertices, edges)."""
    old = {str(op["uid"]): op for op in graph.get("operators") or []}
    ours = {n.uid: n for n in job.nodes}
    return OperatorMatch(
        old_of_new={n.id: int(old[n.uid]["node"]) for n in job.nodes if n.uid in old},
        old_vertex_of_new={n.id: int(old[n.uid]["vertex"]) for n in job.nodes if n.uid in old},
        added=tuple(n.uid for n in job.nodes if n.uid not in old),
        removed=tuple(uid for uid in old if uid not in ours))


def _describe(op: Mapping[str, Any]) -> str:
    return f"{op['name']} (uid {op['uid']!r}, {op['kind']})"


def evolution_refusal(graph: Mapping[str, Any], job: Job, *, allow_non_restored_state: bool,
                      inflight_edges: Collection[int], new_edges: Sequence[Mapping[str, Any]]) -> str | None:
    """Why the checkpoint cannot be restored into `job`, in one line; None when it can.

    `inflight_edges`: ids of the checkpoint's edges that may hold in-flight data (an unaligned checkpoint whose
    tasks wrote channel state for them); `new_edges`: the new plan's edges as operator_ids.graph_document
    records them (up_uid, down_uid, input_index)."""
    match = match_operators(graph, job)
    old = {str(op["uid"]): op for op in graph.get("operators") or []}
    if not match.old_of_new:
        return (f"was taken from a different job graph: none of its operator uids ({', '.join(sorted(old))}) is "
                f"in the job ({', '.join(n.uid for n in job.nodes)})")
    for node in job.nodes:
        was = old.get(node.uid)
        if was is None:
            continue
        before, now = STATE_CLASS.get(str(was["kind"]), "?"), STATE_CLASS.get(node.kind, "?")
        if before and before != now:
            return (f"operator {_describe(was)} kept {before}, but the job's operator with that uid is {node.name} "
                    f"({node.kind}), which keeps {now or 'no state'}: its state cannot be restored into it; give "
                    "the new operator another uid (and restore with --allow-non-restored-state to drop the old "
                    "state)")
        changed = kind_change(was, node.payload)
        if changed:
            return changed
    stateful = [old[uid] for uid in match.removed if STATE_CLASS.get(str(old[uid]["kind"]), "?")]
    if stateful and not allow_non_restored_state:
        return (f"holds state of {', '.join(_describe(op) for op in stateful)}, which the job no longer has: give "
                "the operator that replaces it the same uid, or restore with --allow-non-restored-state to drop "
                "that state")
    ours = {(str(e["up_uid"]), str(e["down_uid"]), int(e["input_index"])) for e in new_edges}
    for edge in graph.get("edges") or []:
        if int(edge["id"]) in inflight_edges and (
                str(edge["up_uid"]), str(edge["down_uid"]), int(edge["input_index"])) not in ours:
            return (f"is an unaligned checkpoint with in-flight data on the edge {edge['up_uid']} -> "
                    f"{edge['down_uid']}, which the job no longer has (an operator was added, removed or rewired "
                    "around it): restore from a savepoint (sluice savepoint, or sluice upgrade, which takes one) "
                    "or an aligned checkpoint")
    return None


def kind_change(was: Mapping[str, Any], payload: Any) -> str | None:
    """A state the checkpoint's operator `was` recorded under a name that the job's function (`payload`) now
    declares as another kind, in one line naming the uid, the state and both kinds; None when there is none
    (or the checkpoint recorded no kinds: taken before they were recorded)."""
    before = was.get("states") or {}
    if not before:
        return None
    now = declared_state_kinds(payload)
    for name in sorted(set(before) & set(now)):
        if before[name] != now[name]:
            return (f"operator uid {was['uid']!r}: state {name!r} was {_a(before[name])} state and is declared as "
                    f"{_a(now[name])} state now: its stored values cannot be read as that; keep its kind, or give "
                    "the new state another name (it starts empty)")
    return None


def _a(kind: str) -> str:
    return f"{'an' if kind[0] in 'aeiou' else 'a'} {kind}"


def inflight_edges(graph: Mapping[str, Any], acks: Mapping[str, Mapping[str, Any]]) -> set[int]:
    """The checkpoint's edges that may hold in-flight data: those whose consumer task wrote input channel state
    or whose producer task wrote output channel state (`acks`: task "vertex:subtask" -> its files document)."""
    wrote_in = {int(task.split(":")[0]) for task, doc in acks.items() if doc.get("in")}
    wrote_out = {int(task.split(":")[0]) for task, doc in acks.items() if doc.get("out")}
    return {int(e["id"]) for e in graph.get("edges") or [] if int(e["down"]) in wrote_in or int(e["up"]) in wrote_out}
