"""Which state backend a job runs on: its name on the command line, and the one place that builds it.

`memory` is the default and needs no backend object in a task (keyed state stays plain dicts, the fast
path); `make_backend` still builds a MemoryBackend for the callers that want the batched interface (the
asynchronous runner, benchmarks). `remote` lives in runtime/state/remote.py, imported only when a job asks
for it, so a worker without that module (or its client library) runs every other job as before.
"""

from __future__ import annotations

import os
from typing import Any

from runtime.state.backend import StateBackend, StateBackendError

MEMORY = "memory"
ROCKSDB = "rocksdb"
REMOTE = "remote"
KINDS = (MEMORY, ROCKSDB, REMOTE)
DEFAULT = MEMORY


def check_kind(kind: str) -> str:
    """`kind` if it names a backend; a one-line error naming the choices otherwise."""
    if kind not in KINDS:
        raise StateBackendError(f"unknown state backend {kind!r}: choose one of {', '.join(KINDS)}")
    return kind


def make_backend(kind: str, key_groups: range, *, work_dir: str, options: dict[str, Any]) -> StateBackend:
    """A backend of `kind` for the key groups of one task.

    `work_dir`: a directory this backend may own (RocksDB keeps its instance there). `options`:
    `write_buffer_bytes` (rocksdb), `remote_address` HOST:PORT and `namespace` (remote: keeps jobs and their
    keyed operators apart on one server; `job_id` when absent).
    """
    check_kind(kind)
    if kind == MEMORY:
        from runtime.state.memory import MemoryBackend

        return MemoryBackend(key_groups)
    if kind == ROCKSDB:
        from runtime.state.rocksdb import DEFAULT_WRITE_BUFFER_BYTES, RocksDBBackend

        os.makedirs(work_dir, exist_ok=True)
        return RocksDBBackend(key_groups, directory=work_dir,
                              write_buffer_bytes=int(options.get("write_buffer_bytes") or DEFAULT_WRITE_BUFFER_BYTES))
    address = options.get("remote_address")
    if not address:
        raise StateBackendError("the remote state backend needs the server's address: "
                                "--state-remote-address HOST:PORT")
    try:
        from runtime.state.remote import RemoteBackend  # type: ignore[import-not-found,unused-ignore]
    except ImportError as e:
        raise StateBackendError(f"the remote state backend is not available in this installation "
                                f"(importing runtime.state.remote failed: {e})") from e
    namespace = str(options.get("namespace") or options.get("job_id") or "")
    backend: StateBackend = RemoteBackend(key_groups, address=address, namespace=namespace)
    return backend
