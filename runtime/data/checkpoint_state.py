"""A checkpoint's state as rows, and savepoints written from rows: the state processor's core, without Spark.

Reading. `open_checkpoint` reads a checkpoint's or savepoint's `_metadata` (checked as a restore checks it);
an operator is found by uid (runtime/graph/operator_ids.py node_of_uid) and its state read from the files of
the tasks that ran it (checkpointing/snapshots.py): keyed tables in the operator-state file (memory backend,
and timers on every backend), else behind the state backend's snapshot handle, read as a restore would (a
scratch RocksDB or MemoryBackend instance opened on the files; the remote backend read-only from its server
with the checkpoint's lineages, never claiming key groups a running job owns). In-flight channel data comes
from the tasks' `.in` and `.out` files as whole msgpack records.

Rows, by kind (`ROW_FIELDS`):
- value:    key, key_group, state, value            one row per key and state, the value as stored
- list:     key, key_group, state, index, value      one row per element of list values
- map:      key, key_group, state, map_key, value    one row per entry of map values
- timers:   key, key_group, domain, timestamp        one row per registered timer
- channels: edge, producer, consumer, side, index, size, record
            side "in": received by the consumer, not yet processed; "out": still held by the producer

Writing. `savepoint_from_entries` cuts (state, key, value) entries into one operator-state file per subtask
by key group (runtime/graph/partitioning.py, the runtime's own functions) and describes them in `_metadata`
as a savepoint of the given job graph: the operator's tasks have state, every other task none (it starts
empty). `transform` copies a checkpoint into a new savepoint, with an operator's state dropped or its values
rewritten, or a uid renamed; state a backend held is materialised into the operator-state files (every
backend restores those), so the new savepoint is self-contained.
"""

from __future__ import annotations

import difflib
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

import msgpack

from runtime.checkpointing import backend_snapshots
from runtime.checkpointing.snapshots import (
    decode_operator_state,
    encode_channel_state,
    encode_operator_state,
    read_channel_state,
    read_task_file,
    task_file_path,
)
from runtime.common import objectstore
from runtime.common.checkpoint_metadata import (
    FORMAT_VERSION,
    METADATA_FILE,
    BadMetadata,
    encode_metadata,
    write_metadata_file,
)
from runtime.common.checksums import CorruptFile, checksum
from runtime.common.values import unpack_ext
from runtime.data.spark import DataError
from runtime.graph.checkpoint_metadata import CheckpointMetadata, read_checkpoint_metadata
from runtime.graph.operator_ids import UnknownUid, node_of_uid
from runtime.graph.partitioning import key_group, subtask_for_key_group
from runtime.graph.restore_spec import TaskFiles
from runtime.state.backend import StateBackendError
from runtime.state.codec import hashable

KINDS = ("value", "list", "map", "timers", "channels")
ROW_FIELDS = {
    "value": ("key", "key_group", "state", "value"),
    "list": ("key", "key_group", "state", "index", "value"),
    "map": ("key", "key_group", "state", "map_key", "value"),
    "timers": ("key", "key_group", "domain", "timestamp"),
    "channels": ("edge", "producer", "consumer", "side", "index", "size", "record"),
}
SINGLE_VALUE_KINDS = ("value", "reducing", "aggregating")  # one value per key: rows of --kind value
INTERNAL_PREFIX = "\0"  # tables of the runtime's own (timers), not a user's state
TIMER_DOMAINS = {"\0timers:event": "event_time", "\0timers:processing": "processing_time"}
BOOTSTRAP_CHECKPOINT_ID = 1


@dataclass(frozen=True)
class Checkpoint:
    directory: str
    metadata: CheckpointMetadata

    @property
    def checkpoint_id(self) -> int:
        return self.metadata.checkpoint_id

    def operator(self, uid: str) -> Mapping[str, Any]:
        """The recorded operator of `uid`; DataError naming the recorded uids (and the closest) if none."""
        try:
            node = node_of_uid({"checkpoint_id": self.metadata.checkpoint_id, **self.metadata.graph}, uid)
        except UnknownUid as exc:
            raise DataError(str(exc)) from None
        return next(op for op in self.metadata.operators if int(op["node"]) == node)

    def expected(self, name: str) -> Any:
        """The checksum `_metadata` recorded for task file `name` (None: none was, and the read refuses it)."""
        for state in self.metadata.task_states().values():
            sums = state.get("checksums") or {}
            if name in sums:
                return sums[name]
        return None

    def vertex(self, vertex_id: int) -> Mapping[str, Any]:
        return next(v for v in self.metadata.vertices if int(v["id"]) == vertex_id)

    def task_files(self, vertex_id: int) -> list[tuple[int, TaskFiles]]:
        """(subtask, files) of every task of the vertex that acknowledged, by subtask."""
        out = []
        for task, files in self.metadata.task_files().items():
            vertex, _, subtask = task.partition(":")
            if int(vertex) == vertex_id:
                out.append((int(subtask), files))
        return sorted(out, key=lambda pair: pair[0])


def open_checkpoint(path: str) -> Checkpoint:
    """A checkpoint or savepoint directory (or its `_metadata`), local or `s3://`; DataError if it is not one."""
    directory = objectstore.absolute(path)
    if objectstore.basename(directory) == METADATA_FILE:
        directory = objectstore.dirname(directory)
    try:  # the one reader of `_metadata` (runtime/graph/checkpoint_metadata.py), as a restore reads it
        return Checkpoint(directory, read_checkpoint_metadata(directory))
    except BadMetadata as exc:
        raise DataError(str(exc)) from None


def write_metadata(directory: str, metadata: Mapping[str, Any]) -> str:
    """Write `_metadata` last and whole (runtime/common/checkpoint_metadata.py)."""
    return write_metadata_file(directory, encode_metadata({**metadata, "format": FORMAT_VERSION}))


def _operator_state(cp: Checkpoint, name: str) -> dict[str, Any]:
    """A task's operator state, read as a restore reads it: confined to the checkpoint and checked against the
    checksum `_metadata` recorded (a state the runtime would refuse is refused here too, never read or copied)."""
    try:
        data = read_task_file(cp.directory, name, cp.expected(name))
        return decode_operator_state(data, task_file_path(cp.directory, name))
    except CorruptFile as exc:
        raise DataError(str(exc)) from None


def _channel_state(cp: Checkpoint, name: str) -> dict[str, bytes]:
    """A task's channel state with its shared segments, each checked as a restore checks them."""
    try:
        return read_channel_state(cp.directory, name, cp.expected(name), task_file_path(cp.directory, name))
    except CorruptFile as exc:
        raise DataError(str(exc)) from None


def verify_operator_files(cp: Checkpoint, uid: str) -> None:
    """Every task file of operator `uid`'s tasks (and the shared segments they name) read and checked as a
    restore reads them; DataError naming the first that is missing, corrupt or outside the checkpoint."""
    for _, files in cp.task_files(int(cp.operator(uid)["vertex"])):
        if files.state:
            _operator_state(cp, files.state)
        for name in (files.inputs, files.outputs):
            if name:
                _channel_state(cp, name)


# -- reading keyed state ---------------------------------------------------------------------------------------


def keyed_entries(cp: Checkpoint, uid: str, *, remote_address: str | None = None
                  ) -> Iterator[tuple[str, int, Any, Any]]:
    """Every (state name, key group, key, value) of operator `uid`, timer tables included (names "\\0...")."""
    op = cp.operator(uid)
    node = int(op["node"])
    for _, files in cp.task_files(int(op["vertex"])):
        if not files.state:
            continue
        doc = _operator_state(cp, files.state)
        for name, groups in (doc["keyed"].get(node) or {}).items():
            for group, pairs in groups.items():
                for key, value in pairs:
                    yield name, int(group), hashable(key), value
        handle = doc.get("backend")
        if handle:
            prefix = f"{node}/"
            for name, group, key, value in _backend_entries(cp, handle, int(doc["max_parallelism"]),
                                                            remote_address):
                if name.startswith(prefix):
                    yield name[len(prefix):], group, hashable(key), value


def _backend_entries(cp: Checkpoint, handle: dict[str, Any], max_parallelism: int,
                     remote_address: str | None) -> Iterator[tuple[str, int, Any, Any]]:
    """The entries behind a state backend's snapshot handle, read as a restore reads them."""
    kind = str(handle.get("backend"))
    groups = range(0, max_parallelism)
    if kind == "remote":
        yield from _remote_entries(cp, handle, remote_address)
        return
    from runtime.state.registry import make_backend

    work = tempfile.mkdtemp(prefix="sluice-state-read-")
    try:
        backend = make_backend(kind, groups, work_dir=os.path.join(work, "db"), options={})
        try:
            backend_snapshots.restore(backend, [handle], cp.directory)
            yield from backend.scan(groups)
        finally:
            backend.close()
    except (StateBackendError, objectstore.OutsideDirectory) as exc:
        raise DataError(str(exc)) from None
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _remote_entries(cp: Checkpoint, handle: dict[str, Any], address: str | None
                    ) -> Iterator[tuple[str, int, Any, Any]]:
    """A remote backend's entries as the checkpoint saw them: its manifest's lineages, read-only (no claim)."""
    from runtime.state import remote, versions
    from runtime.state.codec import decode_key, decode_value

    if address is None:
        raise DataError("the checkpoint holds remote state: give the state server with --state-remote-address "
                        "HOST:PORT")
    if remote.valkey is None:
        raise DataError("reading remote state needs the `remote` extra (the valkey client)")
    root = cp.directory if handle.get("store") == backend_snapshots.SELF_STORE else \
        backend_snapshots.store_root(cp.directory, savepoint=False)[0]
    try:
        host, port = remote.parse_address(address)
        client: Any = remote.valkey.Valkey(host=host, port=port, socket_connect_timeout=2.0, socket_timeout=10.0)
        for relative in handle.get("private_files") or ():
            manifest = remote.read_manifest(objectstore.join(root, str(relative)))
            raw = manifest["namespace"].encode()
            prefix = b"sluice:%d:%s:" % (len(raw), raw)
            for group, lineage in sorted(manifest["lineages"].items()):
                members = sorted(client.smembers(prefix + b"i:" + str(group).encode()))
                for start in range(0, len(members), remote.SCAN_CHUNK):
                    chunk = members[start:start + remote.SCAN_CHUNK]
                    pipe = client.pipeline(transaction=False)
                    for member in chunk:
                        pipe.hgetall(member)
                    for member, fields in zip(chunk, pipe.execute(), strict=True):
                        version = versions.visible((int(v) for v in fields), lineage)
                        if version is None or fields[str(version).encode()] == b"":
                            continue
                        name, _, key = decode_key(member[len(prefix) + 2:])
                        yield name, group, key, decode_value(fields[str(version).encode()])
        client.close()
    except StateBackendError as exc:
        raise DataError(str(exc)) from None
    except remote.valkey.exceptions.ValkeyError as exc:
        raise DataError(f"remote state server at {address}: {type(exc).__name__}: {exc}") from None


def state_rows(cp: Checkpoint, uid: str, kind: str, *, state_name: str | None = None,
               remote_address: str | None = None) -> Iterator[tuple[Any, ...]]:
    """The rows of one kind (module docstring) of operator `uid`."""
    if kind not in KINDS:
        raise DataError(f"--kind must be one of {', '.join(KINDS)}, not {kind!r}")
    if kind == "channels":
        yield from channel_rows(cp, uid)
        return
    # the kinds the operator's function declares, as the checkpoint recorded them (runtime/api/schema.py): a
    # map or list state is not value state, whatever its values look like; undeclared names go by their values
    declared = cp.operator(uid).get("states") or {}
    wanted = {"value": SINGLE_VALUE_KINDS, "list": ("list", "union list"), "map": ("map",)}.get(kind, ())
    for name, group, key, value in keyed_entries(cp, uid, remote_address=remote_address):
        if name in declared and declared[name] not in wanted and kind != "timers":
            continue
        if kind == "timers":
            if name in TIMER_DOMAINS:
                for ts in value:
                    yield key, group, TIMER_DOMAINS[name], ts
            continue
        if name.startswith(INTERNAL_PREFIX) or (state_name is not None and name != state_name):
            continue
        if kind == "value":
            yield key, group, name, value
        elif kind == "list" and isinstance(value, list):
            for i, item in enumerate(value):
                yield key, group, name, i, item
        elif kind == "map" and isinstance(value, dict):
            for map_key, item in value.items():
                yield key, group, name, map_key, item


def channel_rows(cp: Checkpoint, uid: str) -> Iterator[tuple[Any, ...]]:
    """The in-flight records an (unaligned) checkpoint persisted for the task running `uid`: what its inputs
    had received and not processed ("in"), and what its outputs still held ("out"), in channel order."""
    op = cp.operator(uid)
    for _, files in cp.task_files(int(op["vertex"])):
        for side, name in (("in", files.inputs), ("out", files.outputs)):
            if not name:
                continue
            channels = _channel_state(cp, name)
            for channel in sorted(channels, key=lambda c: tuple(int(p) for p in c.split(":"))):
                edge, producer, consumer = (int(p) for p in channel.split(":"))
                for i, (size, record) in enumerate(split_records(channels[channel])):
                    yield edge, producer, consumer, side, i, size, record


def split_records(stream: bytes) -> Iterator[tuple[int, Any]]:
    """(encoded size, record) of each whole msgpack record of a channel's stream."""
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=False, ext_hook=unpack_ext)
    unpacker.feed(stream)
    start = 0
    for record in unpacker:
        end = unpacker.tell()
        yield end - start, record
        start = end


# -- writing savepoints ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """Where an operator's state goes in a job graph: from a job module (`graph_of_job`) or a checkpoint."""

    uid: str
    node: int
    vertex: int
    parallelism: int  # of its task (vertex)
    max_parallelism: int


def graph_of_job(entry: str) -> tuple[dict[str, Any], int]:
    """The graph document (operators, vertices, edges) a checkpoint of job `entry` records, and its max
    parallelism; DataError if the module does not load."""
    from runtime.api import JobDefinitionError
    from runtime.graph.operator_ids import graph_document
    from runtime.graph.plan import JobLoadError, build_job, chain_graph

    try:
        job = build_job(entry)
        vertices, edges = chain_graph(job)
    except (JobLoadError, JobDefinitionError) as exc:
        raise DataError(str(exc)) from None
    return graph_document(job, vertices, edges), job.max_parallelism


def target_in(graph: Mapping[str, Any], uid: str, max_parallelism: int, what: str) -> Target:
    uids = [str(o["uid"]) for o in graph["operators"]]
    if uid not in uids:
        close = difflib.get_close_matches(uid, uids, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise DataError(f"{what} has no operator with uid {uid!r}{hint} (it has {', '.join(sorted(uids))})")
    node = node_of_uid(graph, uid)
    op = next(o for o in graph["operators"] if int(o["node"]) == node)
    vertex = next(v for v in graph["vertices"] if int(v["id"]) == int(op["vertex"]))
    return Target(uid, node, int(vertex["id"]), int(vertex["parallelism"]), max_parallelism)


def at_parallelism(graph: Mapping[str, Any], target: Target, parallelism: int) -> tuple[dict[str, Any], Target]:
    """The graph and target with the target's task (and its operators) at `parallelism`, as if it had run so:
    a restore at the job's own parallelism then redistributes the state by key group."""
    def rescaled(record: dict[str, Any], vertex: int) -> dict[str, Any]:
        return {**record, "parallelism": parallelism} if vertex == target.vertex else record

    doc = {**graph, "vertices": [rescaled(v, int(v["id"])) for v in graph["vertices"]],
           "operators": [rescaled(o, int(o["vertex"])) for o in graph["operators"]]}
    return doc, Target(target.uid, target.node, target.vertex, parallelism, target.max_parallelism)


def cut_by_subtask(entries: Iterable[tuple[str, Any, Any]], target: Target
                   ) -> list[dict[str, dict[int, dict[Any, Any]]]]:
    """(state, key, value) entries as per-subtask {state: {group: {key: value}}}, by the runtime's key groups.
    A key given twice for one state keeps its last value."""
    mp, p = target.max_parallelism, target.parallelism
    out: list[dict[str, dict[int, dict[Any, Any]]]] = [{} for _ in range(p)]
    for state, key, value in entries:
        key = hashable(key)
        group = key_group(key, mp)
        out[subtask_for_key_group(group, mp, p)].setdefault(state, {}).setdefault(group, {})[key] = value
    return out


def encode_subtask(tables: Mapping[str, Mapping[int, Mapping[Any, Any]]], target: Target) -> bytes:
    """One subtask's operator-state file holding `tables` as the operator's keyed state, nothing else."""
    keyed = {target.node: {state: {k: v for groups in by_group.values() for k, v in groups.items()}
                           for state, by_group in tables.items()}}
    return encode_operator_state(keyed, max_parallelism=target.max_parallelism, source=None, sinks=[])


def check_output(out: str) -> None:
    """Refuse an output that exists: a savepoint is written once, never over another (or the input)."""
    if objectstore.exists(objectstore.join(out, "_metadata")) or (not objectstore.is_url(out) and os.path.exists(out)):
        raise DataError(f"{out} exists: give a new directory for the savepoint")


def write_savepoint(out: str, files: Mapping[str, bytes], metadata: dict[str, Any]) -> str:
    """Write the task files, then `_metadata` last (atomically): a crash leaves no usable half savepoint."""
    objectstore.make_dir(out)
    for name, data in files.items():
        objectstore.write(objectstore.join(out, name), data)
    return write_metadata(out, metadata)


def savepoint_from_entries(out: str, entries: Iterable[tuple[str, Any, Any]], target: Target,
                           graph: Mapping[str, Any], *, entry: str, name: str) -> dict[str, int]:
    """Write a savepoint of the job graph `graph` whose only state is operator `target`'s keyed `entries`.
    Returns {"keys": entries written, "subtasks": files}."""
    check_output(out)
    parts = cut_by_subtask(entries, target)
    files: dict[str, bytes] = {}
    acks: dict[str, Any] = {}
    for subtask, tables in enumerate(parts):
        file = f"{target.vertex}-{subtask}.state"
        files[file] = encode_subtask(tables, target)
        acks[f"{target.vertex}:{subtask}"] = {"state": {"state": file, "checksums": {file: checksum(files[file])}},
                                              "figures": {"state_bytes": len(files[file])}}
    metadata = {"checkpoint_id": BOOTSTRAP_CHECKPOINT_ID, "job_id": "bootstrap", "attempt": 0, "savepoint": True,
                "mode": "aligned", "created_at": time.time(), "duration_s": 0.0, "acks": acks, "entry": entry,
                "name": name, **{k: graph[k] for k in ("operators", "vertices", "edges")},
                "bootstrapped": {"uid": target.uid, "max_parallelism": target.max_parallelism}}
    write_savepoint(out, files, metadata)
    keys = sum(len(g) for tables in parts for by_group in tables.values() for g in by_group.values())
    return {"keys": keys, "subtasks": len(parts)}


# -- transforming a checkpoint into a new savepoint --------------------------------------------------------------

ValueFn = Callable[[Any, str, Any], Any]  # (key, state name, value) -> new value


def transform(cp: Checkpoint, out: str, *, drop: Iterable[str] = (), rename: Mapping[str, str] | None = None,
              rewrite: Mapping[str, ValueFn] | None = None, remote_address: str | None = None) -> dict[str, int]:
    """A new savepoint at `out`: `cp` with the keyed and list state of operators `drop` removed, values of
    operators `rewrite` (uid -> function) replaced, uids renamed (old -> new). `cp` is only read."""
    check_output(out)
    rename, rewrite, drop = dict(rename or {}), dict(rewrite or {}), set(drop)
    for uid in (*drop, *rewrite, *rename):
        cp.operator(uid)  # a typo is one clear error, before anything is written
    known = {str(op["uid"]) for op in cp.metadata.operators}
    clash = sorted(set(rename.values()) & (known - set(rename)))
    if clash:
        raise DataError(f"cannot rename to {', '.join(map(repr, clash))}: the checkpoint has an operator with "
                        f"that uid already")
    nodes = {int(cp.operator(u)["node"]): u for u in known}
    files: dict[str, bytes] = {}
    acks: dict[str, Any] = {}
    counts = {"rewritten": 0, "dropped": 0}
    for task, ack in cp.metadata.acks.items():
        state = dict(ack.get("state") or {})
        state.pop("backend", None)
        sums: dict[str, Any] = {}
        state.pop("segments", None)
        for kind in ("in", "out"):  # inline: a savepoint is self-contained, it references no shared segment
            if state.get(kind):
                channels = _channel_state(cp, state[kind])
                files[state[kind]] = encode_channel_state(kind, channels)
                sums[state[kind]] = checksum(files[state[kind]])
        if state.get("state"):
            data = _transformed_state(cp, state["state"], nodes, drop, rewrite, remote_address, counts)
            files[state["state"]] = data
            sums[state["state"]] = checksum(data)
        state["checksums"] = sums
        acks[task] = {"state": state, "figures": ack.get("figures") or {}}
    def renamed(uid: Any) -> Any:
        return rename.get(uid, uid) if isinstance(uid, str) else uid

    metadata = replace(cp.metadata, acks=acks, savepoint=True, created_at=time.time(),
                       operators=tuple({**op, "uid": renamed(op["uid"])} for op in cp.metadata.operators),
                       edges=tuple({**e, "up_uid": renamed(e.get("up_uid")), "down_uid": renamed(e.get("down_uid"))}
                                   for e in cp.metadata.edges))
    write_savepoint(out, files, metadata.to_document())
    return counts


def _transformed_state(cp: Checkpoint, name: str, nodes: Mapping[int, str], drop: set[str],
                       rewrite: Mapping[str, ValueFn], remote_address: str | None, counts: dict[str, int]) -> bytes:
    """One operator-state file with backend state materialised, dropped operators' state removed and values
    rewritten."""
    doc = _operator_state(cp, name)
    mp = int(doc["max_parallelism"])
    keyed: dict[int, dict[str, dict[Any, Any]]] = {}
    for node, tables in doc["keyed"].items():
        for table, groups in tables.items():
            target = keyed.setdefault(int(node), {}).setdefault(table, {})
            for pairs in groups.values():
                for key, value in pairs:
                    target[hashable(key)] = value
    handle = doc.get("backend")
    if handle:
        for full, _, key, value in _backend_entries(cp, handle, mp, remote_address):
            node, _, table = full.partition("/")
            keyed.setdefault(int(node), {}).setdefault(table, {})[hashable(key)] = value
    for node in list(keyed):
        uid = nodes.get(node)
        if uid in drop:
            counts["dropped"] += sum(len(t) for n, t in keyed.pop(node).items() if not n.startswith(INTERNAL_PREFIX))
        elif uid is not None and uid in rewrite:
            fn = rewrite[uid]
            for table, entries in keyed[node].items():
                if not table.startswith(INTERNAL_PREFIX):
                    for key in list(entries):
                        entries[key] = fn(key, table, entries[key])
                        counts["rewritten"] += 1
    lists = {int(n): t for n, t in (doc.get("lists") or {}).items() if nodes.get(int(n)) not in drop}
    asyncs = {int(n): d for n, d in (doc.get("async") or {}).items() if nodes.get(int(n)) not in drop}
    return encode_operator_state(keyed, max_parallelism=mp, source=doc.get("source"), sinks=doc.get("sinks") or [],
                                 lists=lists, time=doc.get("time"), async_inflight=asyncs)
