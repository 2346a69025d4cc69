"""Which state backend each task of a job runs on, and filling it from a checkpoint before the task starts.

The job's backend is `--state-backend` from the job configuration ("state" in the plan), else the job
module's `Job.state_backend`, else memory. Only tasks with a keyed operator get a backend object; on the
memory backend none does (keyed state stays in dicts: the fast path), except a task with an asynchronous
keyed operator (AsyncKeyedProcessFunction), which gets a MemoryBackend: its runner batches requests into
backend round trips on every backend. `state.options.round_trip_ms` (tests and benchmarks only) wraps
every backend in runtime/state/latency.py's LatencyBackend, a fixed delay per round trip. Restoring a
backend reads files (RocksDB: downloads SST files), so it runs in a thread while the worker deploys.

A checkpoint taken on one backend restores on another: memory -> rocksdb loads the restored dict tables into
the backend as the task starts (Chain.restore_state writes through its tables), rocksdb -> memory opens
the snapshot in a scratch RocksDB instance and reads it out into dict tables here.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from typing import Any

from runtime.api import Job
from runtime.checkpointing import backend_snapshots
from runtime.execution.async_state import AsyncKeyedProcessFunction
from runtime.execution.task import RestoredState
from runtime.graph.partitioning import key_group_range
from runtime.graph.plan import Plan, Vertex
from runtime.state.backend import StateBackend, StateBackendError
from runtime.state.latency import LatencyBackend
from runtime.state.registry import DEFAULT, MEMORY, ROCKSDB, check_kind, make_backend, spec
from runtime.state.tables import state_name


def backend_kind(plan: Plan, job: Job) -> str:
    return check_kind(str(plan.config.state.backend or job.state_backend or DEFAULT))


def has_keyed_state(vertex: Vertex, job: Job) -> bool:
    return any(job.nodes[n].key_fn is not None for n in vertex.nodes)


def has_async_state(vertex: Vertex, job: Job) -> bool:
    return any(isinstance(job.nodes[n].payload, AsyncKeyedProcessFunction) for n in vertex.nodes)


def backend_for(plan: Plan, vertex: Vertex, subtask: int, job: Job) -> StateBackend | None:
    """A fresh backend for one task's key groups, or None for the dict tables of the memory backend."""
    kind = backend_kind(plan, job)
    if not has_keyed_state(vertex, job) or (kind == MEMORY and not has_async_state(vertex, job)):
        return None
    # the remote backend fences writers per (namespace, key group): each keyed operator needs its own namespace,
    # named by its node id, which (unlike the vertex id) no rescale or chain split changes
    keyed_node = next(n for n in vertex.nodes if job.nodes[n].key_fn is not None)
    backend = _make(kind, key_group_range(job.max_parallelism, vertex.parallelism, subtask), plan,
                    f"{vertex.id}-{subtask}", namespace=f"{plan.job_id}/{keyed_node}")
    round_trip_ms = plan.config.state.round_trip_ms
    return LatencyBackend(backend, round_trip_s=round_trip_ms / 1000) if round_trip_ms > 0 else backend


def _make(kind: str, groups: range, plan: Plan, label: str, *, namespace: str) -> StateBackend:
    config = plan.config.state
    base = config.work_dir or tempfile.gettempdir()
    work_dir = os.path.join(base, f"sluice-state-{plan.job_id}-{plan.attempt}-{label}-{uuid.uuid4().hex[:8]}")
    options: dict[str, Any] = {**config.options, "remote_address": config.remote_address,
                               "job_id": plan.job_id, "namespace": namespace}
    return make_backend(kind, groups, work_dir=work_dir, options=options)


def restore_backend(backend: StateBackend | None, restored: RestoredState | None, plan: Plan, vertex: Vertex,
                    subtask: int, job: Job) -> None:
    """Fill the task's backend from the checkpoint's handles (blocking: run it in a thread)."""
    if restored is None or not restored.backend:
        return
    assert plan.restore is not None  # restored state comes from the plan's checkpoint
    path = plan.restore.path
    groups = key_group_range(job.max_parallelism, vertex.parallelism, subtask)
    moves = restored.backend_moves or {}
    kinds = {str(h.get("backend")) for h in restored.backend}
    running = spec(backend_kind(plan, job))
    if not all(running.restores(kind) for kind in kinds):
        raise StateBackendError(f"the checkpoint holds {'/'.join(sorted(kinds))} state, which the {running.name} "
                                f"backend cannot restore; restore it with --state-backend "
                                f"{'/'.join(sorted(kinds))}")
    if backend is not None:
        backend_snapshots.restore(backend, restored.backend, path)
        if moves:
            renumber(backend, groups, moves)
        restored.backend = None
        return
    # the job runs on the memory backend now: read the (rocksdb) snapshot out into the dict tables
    scratch = _make(ROCKSDB, groups, plan, f"{vertex.id}-{subtask}-import", namespace="")
    try:
        backend_snapshots.restore(scratch, restored.backend, path)
        keyed = restored.keyed if restored.keyed is not None else {}
        for name, _, key, value in scratch.scan(groups):
            node, _, state = name.partition("/")
            target = moves.get(int(node), int(node))
            if target is not None:
                keyed.setdefault(target, {}).setdefault(state, {})[key] = value
        restored.keyed = keyed
        restored.backend = None
    finally:
        scratch.close()


def renumber(backend: StateBackend, groups: range, moves: dict[int, int | None]) -> None:
    """Move a restored backend's entries of old node id k to node id `moves[k]` (state names are
    "<node>/<name>", runtime/state/tables.py), or drop them (None): operators matched by uid under another
    node id, and old operators whose node id a new one now has. One pass over the task's entries, at restore."""
    moved = [(name, group, key, value) for name, group, key, value in backend.scan(groups)
             if name.partition("/")[0].isdigit() and int(name.partition("/")[0]) in moves]
    backend.delete_many([(name, group, key) for name, group, key, _ in moved])
    backend.put_many([(state_name(target, name.partition("/")[2]), group, key, value)
                      for name, group, key, value in moved
                      if (target := moves[int(name.partition("/")[0])]) is not None])
