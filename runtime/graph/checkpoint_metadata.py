"""A checkpoint's `_metadata` document as one typed value: who took it, how, what every task acknowledged, and
the job graph it was taken of.

The coordinator's checkpoint runner writes it, the restore check (runtime/graph/restore_compatibility.py) and
the state processor (runtime/data/checkpoint_state.py) read it; the bytes, checksums and format version are
runtime/common/checkpoint_metadata.py's and the storage's (coordinator/storage.py). `from_document` checks the
fields a reader relies on and raises ValueError naming the first that is wrong; keys this version does not
know are kept in `extra` and written back as they were. `read_checkpoint_metadata` is the one reader of the
file: every problem is one BadMetadata naming it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any

from runtime.common.checkpoint_metadata import BadMetadata, metadata_file, read_metadata_document
from runtime.graph.restore_spec import TaskFiles

_STORAGE_KEYS = frozenset({"format", "checksum"})  # the file's, not the document's


@dataclass(frozen=True, slots=True)
class CheckpointMetadata:
    checkpoint_id: int
    acks: Mapping[str, Mapping[str, Any]]  # task "vertex:subtask" -> {"state": its files (TaskFiles), "figures"}
    job_id: str = ""
    attempt: int = 0
    savepoint: bool = False
    mode: str = ""
    created_at: float = 0.0  # wall clock
    duration_s: float | None = None
    entry: str = ""
    name: str = ""
    # the job graph (runtime/graph/operator_ids.py graph_document): "operators" by uid (empty for a checkpoint
    # taken before uids were recorded), the plan's "vertices" and "edges"
    vertices: tuple[Mapping[str, Any], ...] = ()
    operators: tuple[Mapping[str, Any], ...] = ()
    edges: tuple[Mapping[str, Any], ...] = ()
    extra: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def graph(self) -> dict[str, Any]:
        """The graph as `_metadata` holds it, for runtime/graph/operator_ids.py and evolution.py."""
        return {"operators": list(self.operators), "vertices": list(self.vertices), "edges": list(self.edges)}

    def task_files(self) -> dict[str, TaskFiles]:
        """Every acknowledged task's files, by "vertex:subtask"."""
        return {task: TaskFiles.from_wire(ack.get("state") or {}) for task, ack in self.acks.items()}

    def task_states(self) -> dict[str, Mapping[str, Any]]:
        """Every acknowledged task's "state" document (its files and marks), by "vertex:subtask"."""
        return {task: ack.get("state") or {} for task, ack in self.acks.items()}

    def to_document(self) -> dict[str, Any]:
        doc: dict[str, Any] = dict(self.extra)
        for f in fields(self):
            if f.name != "extra":
                value = getattr(self, f.name)
                doc[f.name] = list(value) if isinstance(value, tuple) else value
        doc["acks"] = {task: dict(ack) for task, ack in self.acks.items()}
        return doc

    @classmethod
    def from_document(cls, doc: Mapping[str, Any]) -> CheckpointMetadata:
        if not isinstance(doc, Mapping):
            raise ValueError(f"checkpoint metadata must be an object, got {type(doc).__name__}")
        checkpoint_id = doc.get("checkpoint_id")
        if type(checkpoint_id) is not int:
            raise ValueError(f"'checkpoint_id' must be an integer, got {checkpoint_id!r}")
        acks = doc.get("acks")
        if not isinstance(acks, Mapping) or not all(isinstance(a, Mapping) for a in acks.values()):
            raise ValueError("'acks' must be an object of task -> object")
        known = {f.name for f in fields(cls)} - {"extra"}
        values: dict[str, Any] = {"checkpoint_id": checkpoint_id, "acks": MappingProxyType(dict(acks))}
        for name in ("vertices", "operators", "edges"):
            items = doc.get(name)
            items = [] if items is None else items
            if not isinstance(items, list) or not all(isinstance(i, Mapping) for i in items):
                raise ValueError(f"'{name}' must be a list of objects")
            values[name] = tuple(items)
        for name in ("job_id", "mode", "entry", "name"):
            values[name] = str(doc.get(name) or "")
        values["savepoint"] = bool(doc.get("savepoint"))
        for name, kind in (("attempt", int), ("created_at", float), ("duration_s", float)):
            value = doc.get(name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
                raise ValueError(f"'{name}' must be a number, got {value!r}")
            values[name] = kind(value) if value is not None else (None if name == "duration_s" else kind(0))
        extra = {k: v for k, v in doc.items() if k not in known and k not in _STORAGE_KEYS}
        return cls(**values, extra=MappingProxyType(extra))


def read_checkpoint_metadata(path: str) -> CheckpointMetadata:
    """The `_metadata` of the checkpoint at `path` (its directory or the file), read and checked once; BadMetadata
    naming the file when it is missing, unreadable, corrupt, or a field is wrong."""
    document = read_metadata_document(path)
    try:
        return CheckpointMetadata.from_document(document)
    except ValueError as exc:
        raise BadMetadata(f"{metadata_file(path)}: {exc}") from None
