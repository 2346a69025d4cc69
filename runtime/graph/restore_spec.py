"""What the workers need to restore a job attempt from a checkpoint: built by the coordinator from the
checkpoint's metadata when it deploys the attempt, carried in the deploy RPC with the plan."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any


@dataclass(frozen=True, slots=True)
class TaskFiles:
    """What one task acknowledged for a checkpoint: its files (names in the checkpoint's directory) and marks.

    On the wire and in `_metadata` as the ack's "state" document: {"state", "in", "out": file names,
    "backend": the state backend's snapshot handle, "checksums": {file: checksum}, "ended"/"finished": marks}."""

    state: str | None = None  # operator state (checkpointing/snapshots.py)
    inputs: str | None = None  # input channel state ("in")
    outputs: str | None = None  # output channel state ("out")
    backend: Mapping[str, Any] | None = None
    checksums: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    ended: bool = False  # past its end of input: restored, it must not finish() again
    finished: bool = False  # finished before the checkpoint: nothing to restore or redo

    @classmethod
    def from_wire(cls, doc: Mapping[str, Any]) -> TaskFiles:
        return cls(state=doc.get("state") or None, inputs=doc.get("in") or None, outputs=doc.get("out") or None,
                   backend=doc.get("backend") or None, checksums=dict(doc.get("checksums") or {}),
                   ended=bool(doc.get("ended")), finished=bool(doc.get("finished")))

    def to_wire(self) -> dict[str, Any]:
        doc: dict[str, Any] = {k: v for k, v in (("state", self.state), ("in", self.inputs), ("out", self.outputs),
                                                  ("backend", self.backend)) if v}
        if self.checksums:
            doc["checksums"] = dict(self.checksums)
        for mark in ("ended", "finished"):
            if getattr(self, mark):
                doc[mark] = True
        return doc


@dataclass(frozen=True, slots=True)
class RestoreSpec:
    path: str  # the checkpoint's directory (or object-store URL)
    checkpoint_id: int
    tasks: Mapping[str, TaskFiles] = field(default_factory=lambda: MappingProxyType({}))  # by "vertex:subtask"
    parallelism: Mapping[int, int] = field(default_factory=lambda: MappingProxyType({}))  # vertex id -> then
    # operator (node) id -> its parallelism then; empty for a checkpoint restored before nodes were sent
    nodes: Mapping[int, int] = field(default_factory=lambda: MappingProxyType({}))
    # the checkpoint's job graph by operator uid ("operators", "vertices", "edges" of its `_metadata`, see
    # runtime/graph/operator_ids.py); empty for a checkpoint taken before uids were recorded
    graph: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))

    def file_checksums(self) -> dict[str, Any]:
        """The checksum `_metadata` recorded for each task file of the checkpoint, by file name (a rescaled task
        reads other tasks' files)."""
        return {name: sums for files in self.tasks.values() for name, sums in files.checksums.items()}

    def to_wire(self) -> dict[str, Any]:
        return {"path": self.path, "checkpoint_id": self.checkpoint_id,
                "tasks": {k: v.to_wire() for k, v in self.tasks.items()},
                "parallelism": {str(k): v for k, v in self.parallelism.items()},
                "nodes": {str(k): v for k, v in self.nodes.items()}, "graph": dict(self.graph)}

    @classmethod
    def from_wire(cls, doc: Mapping[str, Any]) -> RestoreSpec:
        return cls(path=str(doc["path"]), checkpoint_id=int(doc["checkpoint_id"]),
                   tasks={str(k): TaskFiles.from_wire(v) for k, v in (doc.get("tasks") or {}).items()},
                   parallelism={int(k): int(v) for k, v in (doc.get("parallelism") or {}).items()},
                   nodes={int(k): int(v) for k, v in (doc.get("nodes") or {}).items()},
                   graph=dict(doc.get("graph") or {}))
