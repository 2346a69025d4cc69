"""What a task's checkpoint holds, and the file formats it is stored in.

Three files per task and checkpoint, each a msgpack map with a format
version, written by the checkpoint writer off the event loop:

- `<vertex>-<subtask>.state`: operator state. Keyed state grouped by key
  group (so it can be split along group boundaries when rescaling; timers
  are keyed state too), the source position, the sinks' pre-committed files,
  the functions' list state ("lists": node -> name -> [mode, items], absent
  when there is none), and with event time the task's watermark state
  ("time": per input channel watermark and idleness, the combined and the
  forwarded watermark, or a source's generator), absent in checkpoints of
  jobs without event time. On a state backend (rocksdb, remote) "keyed" holds only the tables
  kept in memory (timers) and "backend" the backend's snapshot handle
  (runtime/checkpointing/backend_snapshots.py); absent on the memory backend.
  An asynchronous keyed operator adds "async": node -> its in-flight document
  (runtime/execution/async_checkpoint.py inflight_document: the input to
  replay before the channel state, and the writes the backend had not
  acknowledged); absent otherwise.
- `<vertex>-<subtask>.in`: input channel state, per channel, as a stream of
  whole msgpack records: the records that preceded the barrier and that the
  task had not processed when it took its snapshot.
- `<vertex>-<subtask>.out`: output channel state, per channel: the whole
  records of the buffers the barrier overtook.

A channel-state file holds its channels inline ("channels": key -> bytes), or, written incrementally
(runtime/checkpointing/channel_segments.py), as pieces ("pieces": key -> [bytes | [segment, offset, length]])
with "segments": name -> CRC-32 and size of every shared segment (`<job dir>/shared/<name>`) they name.
`read_channel_state` gives both as key -> bytes.

Channels are named `<edge>:<producer subtask>:<consumer subtask>`, which
stays the same across attempts (channel ids do not).
"""

from __future__ import annotations

import os
from typing import Any

import msgpack

from runtime.checkpointing.channel_segments import Piece, Ref, resolve, segments_of
from runtime.common import objectstore
from runtime.common.checksums import CorruptFile, read_checked, read_segments
from runtime.common.gcpause import gc_paused
from runtime.common.values import UnpicklableValue, packer_default, unpack_ext
from runtime.graph.partitioning import key_group

FORMAT = 1
SHARED_DIR = "shared"  # in the job's checkpoint directory: files later checkpoints reference again
_STATE_DEFAULT = packer_default("a checkpoint's operator state")


class CorruptState(CorruptFile):
    """A checkpoint file is missing, truncated or not what it claims to be."""


def channel_key(edge: int, producer: int, consumer: int) -> str:
    return f"{edge}:{producer}:{consumer}"


def encode_operator_state(keyed: dict[int, dict[str, dict[Any, Any]]], *, max_parallelism: int,
                          source: Any, sinks: list[Any], lists: dict[int, dict[str, list[Any]]] | None = None,
                          time: dict[str, Any] | None = None, backend: dict[str, Any] | None = None,
                          async_inflight: dict[int, Any] | None = None) -> bytes:
    grouped: dict[int, dict[str, dict[int, list[list[Any]]]]] = {}
    for node, tables in keyed.items():
        for name, table in tables.items():
            by_group: dict[int, list[list[Any]]] = {}
            for key, value in table.items():
                by_group.setdefault(key_group(key, max_parallelism), []).append([key, value])
            grouped.setdefault(node, {})[name] = by_group
    state = {"format": FORMAT, "max_parallelism": max_parallelism, "keyed": grouped, "source": source,
             "sinks": sinks}
    if lists:
        state["lists"] = lists
    if time is not None:
        state["time"] = time
    if backend is not None:
        state["backend"] = backend
    if async_inflight:
        state["async"] = async_inflight
    try:
        return msgpack.packb(state, use_bin_type=True, default=_STATE_DEFAULT)
    except UnpicklableValue as exc:
        raise UnpicklableValue(f"{_holder_of_unpicklable(keyed, lists)}: {exc}") from None


def _holder_of_unpicklable(keyed: dict[int, dict[str, dict[Any, Any]]],
                           lists: dict[int, dict[str, list[Any]]] | None) -> str:
    """Which state holds the value pickle refused (only looked for when one did)."""
    for kind, by_node in (("keyed state", keyed), ("list state", lists or {})):
        for node, tables in by_node.items():
            for name, table in tables.items():
                try:
                    msgpack.packb(table, use_bin_type=True, default=_STATE_DEFAULT)
                except UnpicklableValue:
                    return f"{kind} {name!r} of operator {node}"
    return "operator state"


def async_documents(state: dict[str, Any]) -> dict[int, dict[str, Any]]:
    """An asynchronous operator's in-flight document by node id (empty without one)."""
    return {int(node): doc for node, doc in (state.get("async") or {}).items()}


def decode_operator_state(data: bytes, origin: str) -> dict[str, Any]:
    state = _decode(data, origin)
    for field in ("keyed", "source", "sinks"):
        if field not in state:
            raise CorruptState(f"{origin}: operator state without {field!r}")
    return state


def keyed_tables(state: dict[str, Any], key_groups: range | None = None) -> dict[int, dict[str, dict[Any, Any]]]:
    """Keyed state as {node: {name: {key: value}}}, keeping only `key_groups` when given."""
    out: dict[int, dict[str, dict[Any, Any]]] = {}
    for node, tables in state["keyed"].items():
        for name, groups in tables.items():
            table = out.setdefault(int(node), {}).setdefault(name, {})
            for group, pairs in groups.items():
                if key_groups is None or int(group) in key_groups:
                    for key, value in pairs:
                        table[_hashable(key)] = value
    return out


def list_tables(state: dict[str, Any]) -> dict[int, dict[str, list[Any]]]:
    """The functions' list state as {node: {name: [mode, items]}} (empty in checkpoints without any); a broadcast
    state's items are a map (its keys hashable again, as keyed state's)."""
    return {int(node): {name: [mode, {_hashable(k): v for k, v in items.items()} if isinstance(items, dict)
                               else list(items)] for name, (mode, items) in tables.items()}
            for node, tables in (state.get("lists") or {}).items()}


def _hashable(key: Any) -> Any:
    return tuple(_hashable(k) for k in key) if isinstance(key, list) else key


def encode_channel_state(kind: str, channels: dict[str, bytes]) -> bytes:
    return msgpack.packb({"format": FORMAT, "kind": kind, "channels": channels}, use_bin_type=True)


def decode_channel_state(data: bytes, origin: str) -> dict[str, bytes]:
    state = _decode(data, origin)
    channels = state.get("channels")
    if not isinstance(channels, dict) or not all(isinstance(v, bytes) for v in channels.values()):
        raise CorruptState(f"{origin}: channel state is not a map of channel -> bytes")
    return channels


def encode_channel_pieces(kind: str, pieces: dict[str, list[Piece]], segments: dict[str, dict[str, int]]) -> bytes:
    """A channel-state file whose channels are pieces; inline (the older shape) when no piece is a reference."""
    if not segments:
        return encode_channel_state(kind, {key: b"".join(p for p in ps if isinstance(p, bytes))
                                           for key, ps in pieces.items()})
    doc = {key: [p if isinstance(p, bytes) else [p.segment, p.offset, p.length] for p in ps]
           for key, ps in pieces.items()}
    return msgpack.packb({"format": FORMAT, "kind": kind, "channels": {}, "pieces": doc, "segments": segments},
                         use_bin_type=True)


def read_channel_state(directory: str, name: str, expected: Any,
                       origin: str | None = None) -> dict[str, bytes]:
    """A task's channel-state file as channel -> bytes, checked against its recorded checksum `expected`, its
    shared segments read and checked too (CRC-32): a missing or corrupt file or segment is a CorruptFile
    naming it."""
    origin = origin or name
    state = _decode(read_task_file(directory, name, expected), origin)
    channels = state.get("channels")
    if not isinstance(channels, dict) or not all(isinstance(v, bytes) for v in channels.values()):
        raise CorruptState(f"{origin}: channel state is not a map of channel -> bytes")
    if "pieces" not in state:
        return channels
    try:
        pieces = {str(key): [p if isinstance(p, bytes) else Ref(str(p[0]), int(p[1]), int(p[2])) for p in ps]
                  for key, ps in state["pieces"].items()}
        sums = dict(state["segments"])
    except (TypeError, ValueError, IndexError, AttributeError, KeyError):
        raise CorruptState(f"{origin}: channel state pieces are malformed") from None
    segments = read_segments(shared_dir(directory), sums, segments_of(pieces), owner=origin, error=CorruptState)
    try:
        return {**channels, **{key: resolve(ps, segments) for key, ps in pieces.items()}}
    except (KeyError, ValueError) as exc:
        raise CorruptState(f"{origin}: channel state names a missing range: {exc}") from None


def _decode(data: bytes, origin: str) -> dict[str, Any]:
    try:
        with gc_paused():  # one container per key, none of them garbage: collections would only walk them
            state = msgpack.unpackb(data, raw=False, strict_map_key=False, use_list=True, ext_hook=unpack_ext)
    except Exception as exc:
        raise CorruptState(f"{origin}: does not decode ({type(exc).__name__}: {exc})") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise CorruptState(f"{origin}: not a sluice state file of format {FORMAT}")
    return state


def shared_dir(directory: str) -> str:
    """The job's shared directory, given the checkpoint directory that references it: `<job dir>/shared`."""
    if objectstore.basename(directory) == "_metadata":
        directory = objectstore.dirname(directory)
    parent = objectstore.dirname(directory) if objectstore.is_url(directory) else os.path.dirname(
        os.path.normpath(directory))
    return objectstore.join(parent, SHARED_DIR)


def task_file_path(directory: str, name: Any) -> str:
    """The path of a task file a checkpoint names, confined to the checkpoint's directory (a name with `..` or
    an absolute one is refused before anything is read)."""
    return objectstore.confined_join(directory, name, what="task file", error=CorruptState)


def read_task_file(directory: str, name: str, expected: Any) -> bytes:
    """A task file of a checkpoint (local directory or `s3://`), confined to it and checked against the
    checksum `_metadata` recorded for it: the one verified read of restore, rescale and the state processor."""
    return read_checked(task_file_path(directory, name), expected, error=CorruptState)


def segment_path(directory: str, name: str) -> str:
    """A segment's path, given the checkpoint directory that references it: `<job dir>/shared/<name>`."""
    return objectstore.confined_join(shared_dir(directory), name, what="channel state segment", error=CorruptState)
