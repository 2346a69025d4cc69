"""What a checkpoint of asynchronous keyed state holds, as bytes, and how a restore puts it back.

A TakeSnapshot instruction (runtime/execution/async_controller.py) leaves three
things beside the backend's snapshot handle: the committed writes the backend
had not acknowledged, and (capture mode) the records and watermarks still in
flight, to process before any channel input. `encode_async_state` makes one
msgpack document of them; `restore_async_state` restores a backend from the
handles of one or more old subtasks, applies their pending writes inside the
new key-group range, and returns the replay input that belongs to that range
(records by their key's group; watermarks go to every subtask, which is
harmless: a watermark never moves time backwards downstream). Replayed
records come back as msgpack decodes them (tuples as lists), like records
that crossed a channel; keys come back hashable (lists as tuples).

In a task the backend's handle is the chain's (the state file's "backend"), so
the task stores the rest as a document of its own: `inflight_document` (under
"async" in the `.state` file, by operator), and a restore calls
`restore_inflight` (pending writes into the backend, the replay input back).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgpack

from runtime.common.values import packer_default, unpack_ext
from runtime.execution.async_controller import Record, TakeSnapshot, Watermark
from runtime.graph.partitioning import key_group
from runtime.state.backend import SnapshotHandle, StateBackend, StateBackendError
from runtime.state.codec import hashable
from runtime.state.files import SnapshotStore

_DEFAULT = packer_default("an asynchronous operator's in-flight state")
FORMAT = 1


@dataclass(frozen=True)
class AsyncStateCheckpoint:
    handle: SnapshotHandle
    replay: tuple[Record | Watermark, ...]
    puts: tuple[tuple[str, int, Any, Any], ...]
    deletes: tuple[tuple[str, int, Any], ...]


def _replay_items(replay: Sequence[Record | Watermark]) -> list[list[Any]]:
    return [["r", e.key, e.value] if isinstance(e, Record) else ["w", e.timestamp] for e in replay]


def encode_async_state(snapshot: TakeSnapshot, handle: SnapshotHandle) -> bytes:
    return msgpack.packb({"format": FORMAT, "handle": handle.to_dict(), "replay": _replay_items(snapshot.replay),
                          "puts": [list(p) for p in snapshot.puts],
                          "deletes": [list(d) for d in snapshot.deletes]}, use_bin_type=True,
                         default=_DEFAULT)


def inflight_document(snapshot: TakeSnapshot, queued: Sequence[Record | Watermark] = ()) -> dict[str, Any]:
    """What a task's state file holds of one asynchronous operator (msgpack-ready): the controller's replay,
    then `queued` (input admitted to the operator but not yet to its controller, which came after), and the
    pending writes."""
    return {"format": FORMAT, "replay": _replay_items([*snapshot.replay, *queued]),
            "puts": [list(p) for p in snapshot.puts], "deletes": [list(d) for d in snapshot.deletes]}


def decode_inflight(doc: dict[str, Any], origin: str) -> AsyncStateCheckpoint:
    """An `inflight_document` read back (its handle is the chain's, elsewhere: an empty one here)."""
    return decode_async_state(msgpack.packb({**doc, "handle": SnapshotHandle("none", 0, range(0), ()).to_dict()},
                                            use_bin_type=True, default=_DEFAULT), origin)


def restore_inflight(backend: StateBackend, checkpoints: Sequence[AsyncStateCheckpoint], *,
                     max_parallelism: int) -> list[Record | Watermark]:
    """After `backend` was restored from the chain's handles: apply the old subtasks' pending writes inside its
    key groups, and return the input to replay first (records of its key groups, every watermark)."""
    groups = backend.key_groups
    puts = [p for c in checkpoints for p in c.puts if p[1] in groups]
    deletes = [d for c in checkpoints for d in c.deletes if d[1] in groups]
    if puts or deletes:
        backend.write_many(puts, deletes)
    replay: list[Record | Watermark] = []
    for c in checkpoints:
        replay += [e for e in c.replay
                   if isinstance(e, Watermark) or key_group(e.key, max_parallelism) in groups]
    return replay


def decode_async_state(data: bytes, origin: str) -> AsyncStateCheckpoint:
    try:
        doc = msgpack.unpackb(data, raw=False, ext_hook=unpack_ext)
        if doc.get("format") != FORMAT:
            raise StateBackendError(f"{origin}: async state format {doc.get('format')!r}, expected {FORMAT}")
        replay: list[Record | Watermark] = []
        for item in doc["replay"]:
            if item[0] == "r":
                replay.append(Record(hashable(item[1]), item[2]))
            elif item[0] == "w":
                replay.append(Watermark(int(item[1])))
            else:
                raise ValueError(f"replay element of kind {item[0]!r}")
        return AsyncStateCheckpoint(
            handle=SnapshotHandle.from_dict(doc["handle"]), replay=tuple(replay),
            puts=tuple((str(n), int(g), hashable(k), v) for n, g, k, v in doc["puts"]),
            deletes=tuple((str(n), int(g), hashable(k)) for n, g, k in doc["deletes"]))
    except StateBackendError:
        raise
    except (ValueError, KeyError, TypeError, IndexError, AttributeError, msgpack.UnpackException) as e:
        raise StateBackendError(f"{origin}: async state does not decode: {e}") from e


def restore_async_state(backend: StateBackend, store: SnapshotStore, checkpoints: Sequence[AsyncStateCheckpoint],
                        *, max_parallelism: int) -> list[Record | Watermark]:
    """Restore `backend` (its own key groups) from old subtasks' checkpoints; returns the input to replay first."""
    backend.restore(store, [c.handle for c in checkpoints])
    return restore_inflight(backend, checkpoints, max_parallelism=max_parallelism)
