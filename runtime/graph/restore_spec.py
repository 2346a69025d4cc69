"""What the workers need to restore a job attempt from a checkpoint: built by the coordinator from the
checkpoint's metadata when it deploys the attempt, carried in the deploy RPC with the plan."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any


@dataclass(frozen=True, slots=True)
class RestoreSpec:
    path: str  # the checkpoint's directory (or object-store URL)
    checkpoint_id: int
    # "vertex:subtask" -> the files that task acknowledged (runtime/checkpointing/snapshots.py, TaskFiles)
    tasks: Mapping[str, Mapping[str, Any]] = field(default_factory=lambda: MappingProxyType({}))
    parallelism: Mapping[int, int] = field(default_factory=lambda: MappingProxyType({}))  # vertex id -> then
    # operator (node) id -> its parallelism then; empty for a checkpoint restored before nodes were sent
    nodes: Mapping[int, int] = field(default_factory=lambda: MappingProxyType({}))

    def to_wire(self) -> dict[str, Any]:
        return {"path": self.path, "checkpoint_id": self.checkpoint_id,
                "tasks": {k: dict(v) for k, v in self.tasks.items()},
                "parallelism": {str(k): v for k, v in self.parallelism.items()},
                "nodes": {str(k): v for k, v in self.nodes.items()}}

    @classmethod
    def from_wire(cls, doc: Mapping[str, Any]) -> RestoreSpec:
        return cls(path=str(doc["path"]), checkpoint_id=int(doc["checkpoint_id"]),
                   tasks={str(k): dict(v) for k, v in (doc.get("tasks") or {}).items()},
                   parallelism={int(k): int(v) for k, v in (doc.get("parallelism") or {}).items()},
                   nodes={int(k): int(v) for k, v in (doc.get("nodes") or {}).items()})
