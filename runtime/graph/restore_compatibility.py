"""Whether a checkpoint fits a job's plan, and what the workers need to restore it. Pure, no I/O.

The coordinator reads the checkpoint's `_metadata` and builds the job graph; `restore_spec` decides, from those
and the plan, whether the plan can restore it and answers with the RestoreSpec the deploy carries (its
worker-side twin, runtime/checkpointing/restore_plan.py, decides what each new subtask reads of it). A
checkpoint that does not fit is refused with IncompatibleCheckpoint, one line naming the checkpoint and the
operator:

- a checkpoint that records its operators by uid (runtime/graph/operator_ids.py) is matched operator by
  operator (runtime/graph/evolution.py): state of an operator the job no longer has is refused unless the job
  allows non-restored state, and so are the in-flight data of a removed edge; then every operator's old and
  new parallelism must be one it can be redistributed between (runtime/graph/rescalability.py);
- an older checkpoint (no uids) is matched by task name; at other parallelisms (or chained otherwise) the same
  rescaling rules apply.
"""

from __future__ import annotations

from typing import Any

from runtime.api import Job
from runtime.graph.checkpoint_metadata import CheckpointMetadata
from runtime.graph.evolution import evolution_refusal, inflight_edges, match_operators
from runtime.graph.plan import Plan
from runtime.graph.rescalability import NotRestorable, checkpointed_node_parallelism, ended_operators, rescale_refusal
from runtime.graph.restore_spec import RestoreSpec


class IncompatibleCheckpoint(ValueError):
    """The checkpoint cannot be restored by this plan; the message is one line naming the checkpoint."""


def restore_spec(metadata: CheckpointMetadata, job: Job, plan: Plan, *, path: str, directory: str) -> RestoreSpec:
    """The RestoreSpec of the checkpoint whose `_metadata` is `metadata` (read from `path`, in `directory`) for
    `plan`, whose operators `job` is; raises IncompatibleCheckpoint."""
    saved = list(metadata.vertices)
    acks = metadata.task_states()
    graph: dict[str, Any] = {}
    nodes: dict[int, int] = {}
    if metadata.operators:
        graph = metadata.graph
        nodes = _by_uid(metadata, acks, job, plan, path)
    elif _reshaped(saved, plan):
        nodes = _by_name(saved, acks, job, plan, path)
    return RestoreSpec(path=directory, checkpoint_id=metadata.checkpoint_id, tasks=metadata.task_files(),
                       parallelism={int(v["id"]): int(v["parallelism"]) for v in saved}, nodes=nodes, graph=graph)


def _by_uid(metadata: CheckpointMetadata, acks: dict[str, Any], job: Job, plan: Plan, path: str) -> dict[int, int]:
    """Each operator's parallelism in the checkpoint, by the job's node id, matched by uid."""
    graph = metadata.graph
    refusal = evolution_refusal(graph, job, allow_non_restored_state=plan.config.allow_non_restored_state,
                                inflight_edges=inflight_edges(graph, acks), new_edges=plan.graph.get("edges") or [])
    if refusal:
        raise IncompatibleCheckpoint(f"checkpoint {path} {refusal}")
    match = match_operators(graph, job)
    by_node = {int(op["node"]): int(op["parallelism"]) for op in metadata.operators}
    nodes = {new: by_node[was] for new, was in match.old_of_new.items()}
    ended = ended_operators(metadata.vertices, acks)
    _check_rescale(job, plan, nodes, frozenset(new for new, was in match.old_of_new.items() if was in ended), path)
    return nodes


def _reshaped(saved: list[Any], plan: Plan) -> bool:
    """Whether a checkpoint without uids was taken with other tasks or parallelisms than the plan's."""
    old = {int(v["id"]): int(v["parallelism"]) for v in saved}
    return ([v["name"] for v in saved] != [v.name for v in plan.vertices]
            or any(old.get(v.id) != v.parallelism for v in plan.vertices))


def _by_name(saved: list[Any], acks: dict[str, Any], job: Job, plan: Plan, path: str) -> dict[int, int]:
    """Each operator's parallelism in a checkpoint without uids, matched by task name."""
    try:
        nodes = checkpointed_node_parallelism(saved, job, plan.vertices)
    except NotRestorable as exc:
        raise IncompatibleCheckpoint(f"checkpoint {path} {exc}" if str(exc).startswith("was taken") else
                                     f"checkpoint {path}: {exc}") from None
    _check_rescale(job, plan, nodes, ended_operators(saved, acks), path)
    return nodes


def _check_rescale(job: Job, plan: Plan, nodes: dict[int, int], ended: frozenset[int], path: str) -> None:
    refusal = rescale_refusal(job, plan.vertices, plan.edges, nodes, ended=ended)
    if refusal:
        raise IncompatibleCheckpoint(f"checkpoint {path}: {refusal}")
