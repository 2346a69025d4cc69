"""Reading one task's restored state from a checkpoint, at the parallelism it was taken or another one.

Blocking file I/O: run it in a thread. The pure runtime/checkpointing/restore_plan.py decides what the task
reads and how it combines it; this module only reads the files the plan names (each once, in the two small
read functions below) and hands them back to the plan's `assemble`.
"""

from __future__ import annotations

from typing import Any

from runtime.api import Job
from runtime.checkpointing import snapshots
from runtime.checkpointing.rescaling import RescaleError
from runtime.checkpointing.restore_plan import Channels, OldPlan, Operator, assemble, plan_restore
from runtime.checkpointing.snapshots import decode_operator_state, read_task_file
from runtime.connectors.source import Source
from runtime.connectors.splits import SplitReader, fold_emitted, is_split_position
from runtime.execution.channels import InputChannel
from runtime.execution.task import RestoredState
from runtime.graph.plan import Plan, Vertex
from runtime.graph.restore_spec import RestoreSpec

__all__ = ["OldPlan", "load_restored", "source_for"]


def load_restored(restore: RestoreSpec, plan: Plan, vertex: Vertex, subtask: int, inputs: list[InputChannel],
                  job: Job) -> RestoredState | None:
    try:
        steps = plan_restore(restore, plan, vertex, subtask, job)
        sums = restore.file_checksums()
        operators = {name: read_operator_state(restore.path, name, sums.get(name)) for name in steps.operator_files()}
        channels = {name: read_channel_state(restore.path, name, sums.get(name)) for name in steps.channel_files()}
        state = assemble(steps, operators, channels, {ch.key: ch.channel_id for ch in inputs})
    except RescaleError as exc:
        then = OldPlan(restore, plan, job).vertex(vertex)
        old = then.parallelism if then is not None else "-"
        raise RescaleError(f"cannot restore {vertex.name} subtask {subtask} at parallelism {vertex.parallelism} "
                           f"(checkpointed at {old}): {exc}") from None
    return _split_positions_whole(state)


def read_operator_state(directory: str, name: str, expected: Any) -> Operator:
    return decode_operator_state(read_task_file(directory, name, expected), name)  # checked against `expected`


def read_channel_state(directory: str, name: str, expected: Any) -> Channels:
    return snapshots.read_channel_state(directory, name, expected)  # with its shared segments, all checked


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
