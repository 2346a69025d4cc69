"""Operator ids (uids): what a checkpoint's state belongs to, and how a checkpoint records them. Pure, no I/O.

An operator's uid is set with `.uid("...")` on the stream it produces (runtime/api/stream.py). Without one, a
default is derived from the operator's position in the graph, never from its display name or parallelism:

    default uid = "<kind>-" + the first 10 hex digits of SHA-256 over
                  [kind, [[input's uid, input's side-output tag or ""] for each input, in order], rank]

where `rank` counts the earlier operators with the same kind and the same inputs (the first is 0). A source's
inputs are empty, so sources are numbered in creation order. Renaming an operator, changing a parallelism or a
partitioning keeps every default uid; inserting, removing or reordering operators changes the defaults of the
operators downstream of the change (their inputs' uids changed), and of later siblings of the same kind: set
uids on jobs that will change. An explicit uid upstream anchors the defaults downstream of it.

A checkpoint's `_metadata` records, besides the tasks' acknowledgements (coordinator/checkpoint_runner.py):

    "operators": [{"uid", "name", "kind", "node", "vertex", "parallelism",  one per operator, node id order
                   "states": {name: kind}}]   (only when its function declares state, runtime/api/schema.py)
    "vertices":  [{"id", "name", "parallelism", "nodes": [node ids]}]        the tasks, as chained then
    "edges":     [{"id", "up", "down", "input_index", "partitioner", "channel_base", "tag", "tag_node",
                   "up_uid", "down_uid"}]                                      the network edges then

Node ids are the operators' positions in the job as it was built when the checkpoint was taken; a later version
of the job numbers its operators otherwise, and `node_of_uid` translates.
"""

from __future__ import annotations

import difflib
import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

from runtime.api import Job, JobDefinitionError, Node
from runtime.api.schema import declared_state_kinds


class UnknownUid(KeyError):
    """A uid that the checkpoint does not record; str() is one line for the user."""

    def __str__(self) -> str:
        return str(self.args[0])


def default_uid(node: Node, input_uids: Sequence[tuple[str, str]], rank: int) -> str:
    """The uid an operator gets without `.uid(...)` (module docstring)."""
    doc = json.dumps([node.kind, [list(i) for i in input_uids], rank], separators=(",", ":"))
    return f"{node.kind}-{hashlib.sha256(doc.encode()).hexdigest()[:10]}"


def assign_uids(job: Job) -> None:
    """Give every operator without an explicit uid its default, then check that uids are unique and non-empty.
    Raises JobDefinitionError naming the operators that share one."""
    ranks: dict[str, int] = {}
    for node in job.nodes:  # creation order is topological: inputs have their uid already
        inputs = [(job.nodes[i.node].uid, i.tag or "") for i in node.inputs]
        if not node.uid:
            signature = json.dumps([node.kind, inputs])
            rank = ranks.get(signature, 0)
            ranks[signature] = rank + 1
            node.uid = default_uid(node, inputs, rank)
    owners: dict[str, Node] = {}
    for node in job.nodes:
        if not isinstance(node.uid, str) or not node.uid.strip():
            raise JobDefinitionError(f"{node.name} has an empty uid")
        if node.uid in owners:
            raise JobDefinitionError(f"uid {node.uid!r} is set on both {owners[node.uid].name} and {node.name}: "
                                     "uids are unique within a job")
        owners[node.uid] = node


def graph_document(job: Job, vertices: Sequence[Any], edges: Sequence[Any]) -> dict[str, Any]:
    """What a checkpoint's `_metadata` records of the job graph (module docstring); `vertices` and `edges` are
    the plan's (runtime/graph/plan.py)."""
    vertex_of = {n: v.id for v in vertices for n in v.nodes}
    head_of = {v.id: v.nodes[0] for v in vertices}
    tail_of = {v.id: v.nodes[-1] for v in vertices}
    return {
        "operators": [{"uid": n.uid, "name": n.name, "kind": n.kind, "node": n.id, "vertex": vertex_of[n.id],
                       "parallelism": n.parallelism, **_states(n.payload)} for n in job.nodes],
        "vertices": [{"id": v.id, "name": v.name, "parallelism": v.parallelism, "nodes": list(v.nodes)}
                     for v in vertices],
        "edges": [{"id": e.id, "up": e.up, "down": e.down, "input_index": e.input_index,
                   "partitioner": e.partitioner, "channel_base": e.channel_base, "tag": e.tag,
                   "tag_node": e.tag_node, "up_uid": job.nodes[tail_of[e.up] if e.tag is None else e.tag_node].uid,
                   "down_uid": job.nodes[head_of[e.down]].uid} for e in edges],
    }


def _states(payload: Any) -> dict[str, Any]:
    """The state kinds an operator's function declares, by name (runtime/api/schema.py), when it declares any:
    a restore into a version that declares another kind under a name is refused (runtime/graph/evolution.py)."""
    kinds = declared_state_kinds(payload)
    return {"states": kinds} if kinds else {}


def recorded_operators(metadata: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The operators a checkpoint's metadata records ([] for a checkpoint taken before uids were recorded)."""
    return list(metadata.get("operators") or [])


def node_of_uid(metadata: Mapping[str, Any], uid: str) -> int:
    """The node id under which a checkpoint holds the state of operator `uid` (its keyed tables, lists, backend
    prefix `<node>/` and async documents). Raises UnknownUid naming the recorded uids (and the closest)."""
    operators = recorded_operators(metadata)
    for op in operators:
        if op["uid"] == uid:
            return int(op["node"])
    known = [str(op["uid"]) for op in operators]
    if not known:
        raise UnknownUid(f"checkpoint {metadata.get('checkpoint_id', '?')} records no operator uids (taken by an "
                         "older Sluice): restore it once and take a new savepoint")
    close = difflib.get_close_matches(uid, known, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    raise UnknownUid(f"checkpoint {metadata.get('checkpoint_id', '?')} has no operator with uid {uid!r}{hint} "
                     f"(it records {', '.join(sorted(known))})")
