"""The remote state backend: keyed state in a separate Redis-protocol server (needs the `remote` extra).

A stand-in for disaggregated state on remote storage (Flink 2.0's ForSt): the
task keeps no state, every read and write is a network round trip to a Valkey
server (any server speaking RESP with Lua scripting will do), batched so that
one round trip carries a whole batch of the asynchronous execution model.

Design: versioned writes, a checkpoint is a version number.

- An entry is one server hash, `sluice:<length>:<namespace>:e:<codec key>` (runtime/state/codec.py,
  key group first), whose fields are `version -> value` (an empty value is a
  tombstone). A write adds or replaces the field of the writer's current
  version; it never touches older ones.
- Versions come from one server counter per namespace, so they only grow,
  across writers, restores and rescales. A writer reserves them in blocks
  (`VERSION_BLOCK`, one `INCRBY`), so most checkpoints need no round trip.
- `begin_snapshot` takes the writer's current version as the checkpoint's *cut*
  and moves the writer to the next version: writes after the barrier land in a
  field the checkpoint does not see. It copies nothing and usually does no I/O
  at all, whatever the state size. `upload` writes a manifest of a few hundred
  bytes into the checkpoint store (namespace, cut, each key group's lineage:
  see runtime/state/versions.py) and collects garbage. A batch sent before the
  barrier that reaches the server after it still carries the cut's version,
  so it joins that checkpoint; the asynchronous controller also lists such
  in-flight writes in the checkpoint (TakeSnapshot.puts), and reapplying them
  is idempotent.
- `restore` reads the manifests, gives each owned group the lineage "the
  checkpoint's history up to its cut, then my new versions" and claims the
  groups (one script: a fresh block of versions and the owner tokens).
  Versions written after the cut are left in place but fall outside every
  lineage: invisible. No entry is read or written, so a restore, and a
  rescale (a handle covering more groups than this task owns, or several
  handles), takes a few round trips whatever the state size.
- Fencing: each key group has an owner token on the server (`<ns>:o:<group>`),
  set by the constructor and by `restore` to a fresh version. Writes and
  garbage collection run as Lua scripts that check, atomically with the
  write, that the caller's token still owns every group it touches; a zombie
  task of an older attempt gets a StateBackendError and changes nothing. Its
  writes from before the claim are in versions no lineage contains.
- Rescale reads only its ranges: each group has an index set of its entries
  (`<ns>:i:<group>`), so `scan` reads its groups' sets, not the keyspace.
- Garbage collection, in `upload`, over the owned groups. A *view* is a
  lineage a reader may still use: the live one, snapshots not yet uploaded,
  and every checkpoint the coordinator retains (its `_retained` record in the
  job's checkpoint directory, runtime/common/retention.py) or that is newer
  than all of those, and every savepoint whose manifest still exists. Each
  upload lists its manifest's path or URL on the server (`<ns>:manifests`);
  the coordinator retiring a checkpoint (or a user deleting a savepoint) is
  what ends its retention.
  A write that leaves its entry with one field puts the entry in the fresh
  set of (group, version), `<ns>:f:<group>:<version>`; once every view sees
  that version the whole set is forgotten at once (UNLINK), and once no view
  does (a restore went back before it) each of its entries loses that field.
  So a bulk load costs nothing to collect. A write that adds a field marks
  the entry in the group's collection set (`<ns>:c:<group>`); collection
  reads the marked entries and deletes the fields no view sees (an entry
  every view sees as absent goes whole, with its index entry). A marked
  entry leaves the set once one field is left and every view sees it. So
  collection costs in proportion to the overwrites of the retained window,
  not to the state size.

Why not copy at checkpoints (MULTI/DUMP, or the server's own RDB snapshot):
that costs in proportion to the state, or snapshots the whole server instead
of one job's ranges, and a restore would have to write everything back.

Durability is the server's: the tests and the default set-up run it with an
append-only file and `appendfsync always`, so an acknowledged write survives a
kill -9 of the server. While the server is down every operation fails with a
StateBackendError naming the address; nothing is retried silently past that
(one reconnect-and-retry absorbs a pooled connection gone stale).

Limits: a server that loses its data (no persistence) also loses the version
clock and the checkpoints' versions: restores then fail or see less, so run
it with persistence. Manifests are found by absolute path or URL: a savepoint
directory moved while the job runs counts as deleted.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Protocol

from runtime.common import objectstore
from runtime.common.extras import install_line
from runtime.common.retention import RetentionView
from runtime.state import lua, versions
from runtime.state.backend import (
    MISSING,
    PendingSnapshot,
    SnapshotHandle,
    StateAddress,
    StateBackend,
    StateBackendError,
    check_groups,
)
from runtime.state.codec import decode_key, decode_value, encode_key, encode_value
from runtime.state.files import SnapshotStore

try:
    import valkey
    from valkey.backoff import ExponentialBackoff
    from valkey.retry import Retry
except ImportError:  # pragma: no cover - depends on the install
    valkey = None  # type: ignore[assignment]

MANIFEST_FORMAT = 1
MANIFEST_SUFFIX = "-remote.json"
# Versions a writer reserves at once: a checkpoint takes the next one locally, without a round trip.
VERSION_BLOCK = 1024
SCAN_CHUNK = 1000  # entries per pipelined round trip when scanning or collecting

def available() -> bool:
    return valkey is not None


def parse_address(address: str) -> tuple[str, int]:
    """`host:port`, optionally with a `redis://` or `valkey://` scheme; a clear error otherwise."""
    rest = address
    for scheme in ("redis://", "valkey://"):
        if rest.startswith(scheme):
            rest = rest[len(scheme):]
    host, sep, port = rest.rstrip("/").rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise StateBackendError(f"remote state address {address!r} is not host:port")
    return host, int(port)


class RemoteBackend(StateBackend):
    name = "remote"

    def __init__(self, key_groups: range, *, address: str, namespace: str,
                 connect_timeout_s: float = 2.0, io_timeout_s: float = 10.0) -> None:
        if valkey is None:
            raise StateBackendError("the remote state backend needs the `remote` extra (the valkey client); "
                                    f"install it with scripts/bootstrap.sh or `{install_line('remote')}`")
        if not namespace:
            raise StateBackendError("the remote state backend needs a namespace (the job's id) to keep jobs apart")
        super().__init__(key_groups)
        self.address = address
        self.namespace = namespace
        host, port = parse_address(address)
        # One retry after a reconnect: a pooled connection is stale after a server restart. Every operation is
        # idempotent (a write sets the field of its version), so a retried one applies once.
        self._client = valkey.Valkey(host=host, port=port, socket_connect_timeout=connect_timeout_s,
                                     socket_timeout=io_timeout_s, retry=Retry(ExponentialBackoff(0.2, 0.02), 1),
                                     health_check_interval=0, lib_name=None, lib_version=None)
        # the server-side scripts, one file each with its KEYS/ARGV layout: runtime/state/lua/
        self._write_script = self._client.register_script(lua.source("write"))
        self._collect_script = self._client.register_script(lua.source("collect"))
        self._claim_script = self._client.register_script(lua.source("claim"))
        self._settle_script = self._client.register_script(lua.source("settle"))
        self._read_script = self._client.register_script(lua.source("read"))
        self._forget_script = self._client.register_script(lua.source("forget"))
        raw = namespace.encode()
        self._prefix = b"sluice:%d:%s:" % (len(raw), raw)  # length first: no namespace is a prefix of another
        self._owner = uuid.uuid4().hex[:12]
        self._lock = threading.Lock()  # guards _pending (uploads run on other threads)
        self._pending: dict[int, dict[int, versions.Lineage]] = {}  # snapshots begun, manifest not yet written
        self._claim({g: () for g in key_groups})

    # -- keys -----------------------------------------------------------------------------------------

    def _entry(self, name: str, group: int, key: Any) -> bytes:
        return self._prefix + b"e:" + encode_key(name, group, key)

    def _group_key(self, kind: bytes, group: int) -> bytes:
        return self._prefix + kind + b":" + str(group).encode()

    def _fresh_set(self, group: int, version: int) -> bytes:
        return self._prefix + b"f:%d:%d" % (group, version)

    def _write_keys(self, entry: bytes, group: int, version: int) -> tuple[bytes, ...]:
        return (entry, self._group_key(b"i", group), self._group_key(b"c", group), self._fresh_set(group, version),
                self._group_key(b"v", group))

    def _clock(self) -> bytes:
        return self._prefix + b"clock"

    # -- talking to the server ------------------------------------------------------------------------

    def _call(self, what: str, fn: Any, *args: Any) -> Any:
        """Run one round trip, turning the client's errors into StateBackendError naming the server."""
        assert valkey is not None
        self._stats.round_trips += 1
        try:
            return fn(*args)
        except valkey.exceptions.ResponseError as e:
            if "FENCED" in str(e):
                raise StateBackendError(f"remote state {self.namespace!r} at {self.address}: {what} refused, "
                                        f"this writer was fenced off by a newer attempt ({e})") from e
            raise StateBackendError(f"remote state at {self.address}: {what} failed: {e}") from e
        except valkey.exceptions.ValkeyError as e:
            raise StateBackendError(f"remote state server at {self.address} unreachable during {what}: "
                                    f"{type(e).__name__}: {e}") from e

    def _pipeline(self, what: str, commands: Iterable[tuple[str, tuple[Any, ...]]]) -> list[Any]:
        def run() -> list[Any]:
            pipe = self._client.pipeline(transaction=False)
            for command, args in commands:
                getattr(pipe, command)(*args)
            return pipe.execute()
        return list(self._call(what, run))

    def _fetch(self, what: str, entries: list[bytes]) -> list[dict[bytes, bytes]]:
        """Every field of each entry, in one round trip and one reply (a pipeline costs a reply per entry)."""
        replies = self._call(what, self._read_script, entries, [])
        return [dict(zip(flat[::2], flat[1::2], strict=True)) for flat in replies]

    def _claim(self, history: dict[int, versions.Lineage]) -> None:
        """Become the owner of the groups in `history` (group -> its restored lineage, () if none).

        One script, so no version can be allocated between taking the token and owning the groups: a
        zombie's write either comes before (its version is below the token, outside the new lineage) or
        after (refused by the owner check).
        """
        keys = [self._clock(), *(self._group_key(b"o", g) for g in history)]
        end = int(self._call("claiming key groups", self._claim_script, keys, [VERSION_BLOCK]))
        token = end - VERSION_BLOCK + 1
        self._token = str(token).encode()
        self._version, self._block_end = token, end
        self._lineages = {g: (*past, (token, versions.OPEN)) for g, past in history.items()}

    def _next_version(self) -> int:
        """A version above every one this writer used: from its block, or a new block (a round trip)."""
        if self._version < self._block_end:
            return self._version + 1
        end = int(self._call("allocating versions", self._client.incrby, self._clock(), VERSION_BLOCK))
        self._block_end = end
        return end - VERSION_BLOCK + 1

    # -- reads and writes -----------------------------------------------------------------------------

    def get_many(self, addresses: Sequence[StateAddress]) -> list[Any]:
        self._stats.reads += len(addresses)
        if not addresses:
            return []
        fields = self._fetch("read", [self._entry(*a) for a in addresses])
        return [self._resolve(group, found) for (_, group, _), found in zip(addresses, fields, strict=True)]

    def _resolve(self, group: int, fields: dict[bytes, bytes]) -> Any:
        lineage = self._lineages.get(group)
        if lineage is None or not fields:
            return MISSING
        version = versions.visible((int(v) for v in fields), lineage)
        if version is None:
            return MISSING
        raw = fields[str(version).encode()]
        return MISSING if raw == b"" else decode_value(raw)

    def put_many(self, entries: Sequence[tuple[str, int, Any, Any]]) -> None:
        self.write_many(entries, ())

    def delete_many(self, addresses: Sequence[StateAddress]) -> None:
        self.write_many((), addresses)

    def write_many(self, puts: Sequence[tuple[str, int, Any, Any]], deletes: Sequence[StateAddress]) -> None:
        groups = sorted({e[1] for e in puts} | {a[1] for a in deletes})
        check_groups(self, groups)
        self._stats.writes += len(puts)
        self._stats.deletes += len(deletes)
        if not groups:
            return
        keys: list[bytes] = [self._group_key(b"o", g) for g in groups]
        values: list[bytes] = []
        version = self._version  # read once: a snapshot on another thread may move it meanwhile
        for name, group, key, value in puts:
            keys += self._write_keys(self._entry(name, group, key), group, version)
            values.append(encode_value(value))
        for name, group, key in deletes:
            keys += self._write_keys(self._entry(name, group, key), group, version)
            values.append(b"")
        self._call("write", self._write_script, keys, [self._token, version, len(groups), *values])

    def scan(self, key_groups: range) -> Iterator[tuple[str, int, Any, Any]]:
        for group in key_groups:
            if group not in self._lineages:
                continue
            members = sorted(self._call("scan", self._client.smembers, self._group_key(b"i", group)))
            for start in range(0, len(members), SCAN_CHUNK):
                chunk = members[start:start + SCAN_CHUNK]
                found = self._fetch("scan", chunk)
                for member, fields in zip(chunk, found, strict=True):
                    value = self._resolve(group, fields)
                    if value is not MISSING:
                        name, _, key = decode_key(member[len(self._prefix) + 2:])
                        yield name, group, key, value

    # -- snapshots ------------------------------------------------------------------------------------

    def begin_snapshot(self, checkpoint_id: int) -> PendingSnapshot:
        started = time.perf_counter()
        cut = self._version
        views = {g: versions.clip(lineage, cut) for g, lineage in self._lineages.items()}
        with self._lock:
            self._pending[checkpoint_id] = views
        self._version = self._next_version()
        self._stats.snapshots += 1
        return _RemoteSnapshot(self, checkpoint_id, cut, views, self.key_groups, time.perf_counter() - started)

    def restore(self, store: SnapshotStore, handles: Sequence[SnapshotHandle]) -> None:
        history: dict[int, versions.Lineage] = {g: () for g in self.key_groups}
        paths = []
        for handle in handles:
            if handle.backend != self.name:
                raise StateBackendError(f"checkpoint {handle.checkpoint_id} was taken by the {handle.backend} "
                                        f"backend; the remote backend cannot restore it")
            for relative in handle.private_files:
                paths.append(store.path(relative))
                manifest = read_manifest(paths[-1])
                if manifest["namespace"] != self.namespace:
                    raise StateBackendError(f"checkpoint {handle.checkpoint_id} holds remote state of namespace "
                                            f"{manifest['namespace']!r}, not {self.namespace!r}")
                for group, lineage in manifest["lineages"].items():
                    if group in history:
                        history[group] = lineage
        self._claim(history)
        if paths:
            self.register_manifests(paths)  # a savepoint restored from stays protected while its files exist

    def close(self) -> None:
        self._client.close()

    # -- garbage collection ---------------------------------------------------------------------------

    # -- what a pending snapshot asks of its backend (SnapshotHost) ------------------------------------

    @property
    def owner(self) -> str:
        return self._owner

    def register_manifests(self, manifest_paths: list[str]) -> None:
        """List manifests in the namespace's registry on the server: every writer's collection reads it."""
        self._call("registering manifests", self._client.sadd, self._prefix + b"manifests", *manifest_paths)

    def snapshot_ended(self, checkpoint_id: int) -> None:
        with self._lock:
            self._pending.pop(checkpoint_id, None)

    def _views(self) -> dict[int, list[versions.Lineage]]:
        """Per owned group, every lineage a reader may still use.

        The retained checkpoints are the registered manifests of checkpoints the coordinator's record says it
        retains (runtime/common/retention.py), or newer than all of those (they may still be completing);
        savepoints are retained while their manifests exist (the user deletes them). Every other registered
        manifest is dropped from the registry: its versions become garbage.
        """
        views: dict[int, list[versions.Lineage]] = {g: [lineage] for g, lineage in self._lineages.items()}
        with self._lock:
            pending = list(self._pending.values())
        registered = sorted(self._call("reading manifests", self._client.smembers, self._prefix + b"manifests"))
        retained, vanished = [], []
        record = RetentionView()
        for raw in registered:
            path = raw.decode()
            try:
                if record.retained(path):
                    retained.append(read_manifest(path)["lineages"])
                    continue
            except OSError as e:  # unsure means keep: no collection this time
                raise StateBackendError(f"remote state: cannot tell whether {path} is retained: {e}") from e
            except StateBackendError as e:
                if "is missing" not in str(e):
                    raise
            vanished.append(raw)
        if vanished:
            self._call("forgetting manifests", self._client.srem, self._prefix + b"manifests", *vanished)
        for lineages in pending + retained:
            for group, lineage in lineages.items():
                if group in views and lineage not in views[group]:
                    views[group].append(lineage)
        return views

    def collect_garbage(self) -> int:
        """Delete the fields no view sees in the owned groups' marked entries; returns the fields deleted.

        Round trips: one for the marked sets of all groups, then per SCAN_CHUNK marked entries (of any groups
        whose views agree on the versions they all contain) one to unmark the settled ones on the server, and
        two more if some are left to decide.
        """
        views = self._views()
        groups = sorted(views)
        dropped = self._collect_fresh(views, groups)  # the fields of dead versions, then the marked entries'
        marks = self._pipeline("collection", (("smembers", (self._group_key(b"c", g),)) for g in groups))
        by_common: dict[versions.Lineage, list[tuple[int, bytes]]] = {}
        for group, members in zip(groups, marks, strict=True):
            by_common.setdefault(versions.common(views[group]), []).extend((group, m) for m in sorted(members))
        for common, marked in by_common.items():
            bounds = [bound for interval in common for bound in interval]
            for start in range(0, len(marked), SCAN_CHUNK):
                chunk = marked[start:start + SCAN_CHUNK]
                keys = [k for group, entry in chunk
                        for k in (self._group_key(b"o", group), self._group_key(b"c", group), entry)]
                undecided = self._call("collection", self._settle_script, keys, [self._token, *bounds])
                if undecided:
                    dropped += self._collect(views, [chunk[int(i) - 1] for i in undecided])
        return dropped

    def _collect_fresh(self, views: dict[int, list[versions.Lineage]], groups: list[int]) -> int:
        """The fresh sets: forget those of versions every view sees, drop the field of versions no view sees.

        A version some views see and others do not waits: a later collection decides it. Round trips: one
        for the fresh versions of all groups, one to forget, and per dead version its set and a collection.
        """
        fresh = self._pipeline("collection", (("zrange", (self._group_key(b"v", g), 0, -1)) for g in groups))
        forget: list[tuple[int, int]] = []
        dropped = 0
        for group, found in zip(groups, fresh, strict=True):
            for version in (int(v) for v in found):
                seen_by = sum(versions.contains(view, version) for view in views[group])
                if seen_by == len(views[group]):
                    forget.append((group, version))
                elif seen_by == 0:  # dead: written after a checkpoint some restore went back to
                    entries = sorted(self._call("collection", self._client.smembers, self._fresh_set(group, version)))
                    for start in range(0, len(entries), SCAN_CHUNK):
                        dropped += self._drop_version(group, version, entries[start:start + SCAN_CHUNK])
                    forget.append((group, version))
        for start in range(0, len(forget), SCAN_CHUNK):
            chunk = forget[start:start + SCAN_CHUNK]
            owners = sorted({g for g, _ in chunk})
            position = {g: i + 1 for i, g in enumerate(owners)}
            keys = [k for g in owners for k in (self._group_key(b"o", g), self._group_key(b"v", g))]
            keys += [self._fresh_set(g, v) for g, v in chunk]
            args: list[Any] = [self._token, len(owners), *(x for g, v in chunk for x in (position[g], v))]
            self._call("collection", self._forget_script, keys, args)
        return dropped

    def _drop_version(self, group: int, version: int, entries: list[bytes]) -> int:
        keys = [k for entry in entries for k in (self._group_key(b"o", group), entry, self._group_key(b"i", group),
                                                 self._group_key(b"c", group))]
        args = [self._token, *(x for _ in entries for x in (-1, 1, version))]
        return int(self._call("collection", self._collect_script, keys, args))

    def _collect(self, views: dict[int, list[versions.Lineage]], entries: list[tuple[int, bytes]]) -> int:
        """Two round trips: read the entries, then drop their unseen fields (Lua, fenced before any change)."""
        found = self._fetch("collection", [entry for _, entry in entries])
        keys: list[bytes] = []
        args: list[Any] = [self._token]
        for (group, entry), fields in zip(entries, found, strict=True):
            present = [int(v) for v in fields]
            keep = versions.needed(present, views[group])
            if any(fields[str(v).encode()] != b"" for v in keep):
                drop = [v for v in present if v not in keep]
            else:  # every view sees the entry absent: all of it can go
                keep, drop = set(), present
            # the entry leaves the collection set only if no write added a field since we read it
            left = len(keep) if versions.settled(keep, views[group]) else -1
            if not drop and left < 0 and fields:
                continue  # nothing to do yet: a later collection will decide
            keys += (self._group_key(b"o", group), entry, self._group_key(b"i", group), self._group_key(b"c", group))
            args += (left, len(drop), *drop)
        return int(self._call("collection", self._collect_script, keys, args)) if keys else 0


class SnapshotHost(Protocol):
    """What a pending snapshot asks of its backend, and nothing else of it."""

    @property
    def namespace(self) -> str: ...

    @property
    def owner(self) -> str: ...  # names this writer's manifests apart from another subtask's

    def register_manifests(self, manifest_paths: list[str]) -> None: ...

    def snapshot_ended(self, checkpoint_id: int) -> None: ...  # no longer a view that collection must keep

    def collect_garbage(self) -> int: ...


class _RemoteSnapshot(PendingSnapshot):
    def __init__(self, host: SnapshotHost, checkpoint_id: int, cut: int, lineages: dict[int, versions.Lineage],
                 key_groups: range, sync_seconds: float) -> None:
        self.checkpoint_id = checkpoint_id
        self.sync_seconds = sync_seconds
        self.cut = cut
        self.collected_fields = 0
        self._host = host
        self._lineages = lineages
        self._key_groups = key_groups

    def upload(self, store: SnapshotStore, *, share: bool = True) -> SnapshotHandle:  # its files are private
        host = self._host
        data = json.dumps({"format": MANIFEST_FORMAT, "namespace": host.namespace, "cut": self.cut,
                           "key_groups": [self._key_groups.start, self._key_groups.stop],
                           "lineages": _runs(self._lineages)}, separators=(",", ":")).encode()
        relative = f"{objectstore.basename(store.private_dir(self.checkpoint_id))}/{host.owner}{MANIFEST_SUFFIX}"
        store.write(relative, data)
        # registered before it stops being pending: a view is never unknown to collection
        host.register_manifests([store.path(relative)])
        host.snapshot_ended(self.checkpoint_id)
        self.collected_fields = host.collect_garbage()
        return SnapshotHandle(backend=RemoteBackend.name, checkpoint_id=self.checkpoint_id,
                              key_groups=self._key_groups, private_files=(relative,),
                              uploaded_bytes=len(data), total_bytes=len(data))

    def abort(self) -> None:
        self._host.snapshot_ended(self.checkpoint_id)


def _runs(lineages: dict[int, versions.Lineage]) -> list[list[Any]]:
    """[first group, stop, lineage] for each run of consecutive groups with the same lineage."""
    runs: list[list[Any]] = []
    for group in sorted(lineages):
        lineage = versions.encode(lineages[group])
        if runs and runs[-1][1] == group and runs[-1][2] == lineage:
            runs[-1][1] = group + 1
        else:
            runs.append([group, group + 1, lineage])
    return runs


def read_manifest(path: str) -> dict[str, Any]:
    """A manifest, by its path or URL (through the checkpoint-storage layer)."""
    try:
        data = json.loads(objectstore.read(path))
        if data.get("format") != MANIFEST_FORMAT:
            raise StateBackendError(f"{path}: remote state manifest format {data.get('format')!r}, "
                                    f"expected {MANIFEST_FORMAT}")
        lineages = {g: versions.decode(lineage) for start, stop, lineage in data["lineages"]
                    for g in range(int(start), int(stop))}
        return {"namespace": str(data["namespace"]), "cut": int(data["cut"]), "lineages": lineages}
    except FileNotFoundError as e:
        raise StateBackendError(f"{path}: remote state manifest is missing") from e
    except (ValueError, KeyError, TypeError) as e:
        raise StateBackendError(f"{path}: remote state manifest does not decode: {e}") from e


def create(key_groups: range, *, work_dir: str, options: Mapping[str, Any]) -> RemoteBackend:
    """The descriptor's factory (runtime/common/state_backends.py): the options `remote_address` HOST:PORT and
    `namespace` (keeps jobs and their keyed operators apart on one server; `job_id` when absent)."""
    namespace = str(options.get("namespace") or options.get("job_id") or "")
    return RemoteBackend(key_groups, address=str(options["remote_address"]), namespace=namespace)
