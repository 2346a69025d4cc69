"""The state backends: the one table of their names, what each needs installed, and the place that builds one.

Every list of backend names derives from `BACKENDS`: the CLI's `--state-backend` choices and help, the
worker's validation, the error naming the extra to install. (runtime/api sits below this layer and keeps its
own tuple for `Job.state_backend`; a unit test holds it equal to `KINDS`.)

`memory` is the default and needs no backend object in a task (keyed state stays plain dicts, the fast
path); `make_backend` still builds a MemoryBackend for the callers that want the batched interface (the
asynchronous runner, benchmarks). The other backends' modules are imported only when a job asks for one, so a
worker without their client libraries runs every other job as before.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from typing import Any

from runtime.common.extras import install_line
from runtime.state.backend import StateBackend, StateBackendError


@dataclass(frozen=True)
class BackendSpec:
    name: str
    module: str  # defines the backend class and `available()`
    summary: str  # one line for --help
    extra: str | None = None  # the pyproject extra its libraries come from (None: always installed)

    @property
    def install_line(self) -> str:
        return install_line(self.extra) if self.extra else ""


BACKENDS = (
    BackendSpec("memory", "runtime.state.memory", "dicts in the task (the default)"),
    BackendSpec("rocksdb", "runtime.state.rocksdb", "on local disk, larger than memory, incremental checkpoints",
                extra="rocksdb"),
    BackendSpec("remote", "runtime.state.remote", "a Redis-protocol state server (--state-remote-address)",
                extra="remote"),
)
_BY_NAME = {spec.name: spec for spec in BACKENDS}
KINDS = tuple(_BY_NAME)
MEMORY, ROCKSDB, REMOTE = KINDS
DEFAULT = MEMORY


def check_kind(kind: str) -> str:
    """`kind` if it names a backend; a one-line error naming the choices otherwise."""
    if kind not in _BY_NAME:
        raise StateBackendError(f"unknown state backend {kind!r}: choose one of {', '.join(KINDS)}")
    return kind


def spec(kind: str) -> BackendSpec:
    return _BY_NAME[check_kind(kind)]


def help_text() -> str:
    return ", ".join(f"{s.name} ({s.summary})" for s in BACKENDS)


def missing_extra(kind: str) -> str | None:
    """Why backend `kind` cannot run in this installation (its module or libraries are missing, with the install
    line), or None if it can."""
    backend = spec(kind)
    try:
        module = importlib.import_module(backend.module)
    except ImportError as e:
        return f"the {kind} state backend is not available in this installation (importing {backend.module} " \
               f"failed: {e})"
    available = getattr(module, "available", None)
    if available is not None and not available():
        return f"the {kind} state backend needs the `{backend.extra}` extra: {backend.install_line}"
    return None


def make_backend(kind: str, key_groups: range, *, work_dir: str, options: dict[str, Any]) -> StateBackend:
    """A backend of `kind` for the key groups of one task.

    `work_dir`: a directory this backend may own (RocksDB keeps its instance there). `options`:
    `write_buffer_bytes` (rocksdb), `remote_address` HOST:PORT and `namespace` (remote: keeps jobs and their
    keyed operators apart on one server; `job_id` when absent).
    """
    check_kind(kind)
    if kind == REMOTE and not options.get("remote_address"):
        raise StateBackendError("the remote state backend needs the server's address: "
                                "--state-remote-address HOST:PORT")
    problem = missing_extra(kind)
    if problem is not None:
        raise StateBackendError(problem)
    if kind == MEMORY:
        from runtime.state.memory import MemoryBackend

        return MemoryBackend(key_groups)
    if kind == ROCKSDB:
        from runtime.state.rocksdb import DEFAULT_WRITE_BUFFER_BYTES, RocksDBBackend

        os.makedirs(work_dir, exist_ok=True)
        return RocksDBBackend(key_groups, directory=work_dir,
                              write_buffer_bytes=int(options.get("write_buffer_bytes") or DEFAULT_WRITE_BUFFER_BYTES))
    from runtime.state.remote import RemoteBackend  # type: ignore[import-not-found,unused-ignore]

    namespace = str(options.get("namespace") or options.get("job_id") or "")
    backend: StateBackend = RemoteBackend(key_groups, address=options["remote_address"], namespace=namespace)
    return backend
