"""From a submitted job to a deployable plan: pure, no I/O."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from runtime.api import Job, JobDefinitionError
from runtime.graph.job_config import JobConfig
from runtime.graph.operator_ids import graph_document
from runtime.graph.plan import Plan, chain_graph, place_subtasks


@dataclass(frozen=True)
class WorkerSlots:
    worker_id: str
    slots: int
    host: str
    data_port: int


def make_plan(*, job_id: str, attempt: int, entry: str, name: str, sys_path: str, config: JobConfig, job: Job,
              workers: list[WorkerSlots], channel_base: int, groups: Mapping[int, int] | None = None) -> Plan:
    """Chain the job graph `job` (built from the entry point at `config`'s parallelism) into tasks and place its
    subtasks on `workers`. Raises JobDefinitionError (bad graph, too few slots)."""
    vertices, edges = chain_graph(job, groups)
    if not workers:
        raise JobDefinitionError("no workers are registered")
    placement = place_subtasks(vertices, [(w.worker_id, w.slots) for w in workers])
    used = set(placement.values())
    return Plan(
        job_id=job_id, attempt=attempt, entry=entry, name=name, sys_path=sys_path, channel_base=channel_base,
        vertices=vertices, edges=edges, placement=placement,
        workers={w.worker_id: [w.host, w.data_port] for w in workers if w.worker_id in used},
        config=config, graph=graph_document(job, vertices, edges),
    )


def merge_parallelism(current: Mapping[str, int], requested: Mapping[str, int]) -> dict[str, int]:
    """The parallelism overrides after a rescale: a request for every operator ("*") replaces the old overrides
    (per-operator ones given with it win, as on submit); per-operator requests update the old ones."""
    if "*" in requested:
        return dict(requested)
    return {**current, **requested}


def describe_parallelism(plan: Plan | None) -> str:
    """One line for logs and answers: each task type with its parallelism."""
    return ", ".join(f"{v.name}={v.parallelism}" for v in plan.vertices) if plan is not None else "-"
