"""The state backends the worker builds: each is its descriptor's entry (runtime/common/state_backends.py).

A descriptor names the backend, the extra its libraries come from, its factory ("module:function") and the
backends whose checkpoints it restores; every list of backend names derives from that table: the CLI's
`--state-backend` choices and help, `Job.state_backend`, admission's extras, the worker's validation, the error
naming the extra to install. A new backend is a descriptor and its module's `create`; nothing here changes.

`memory` is the default and needs no backend object in a task (keyed state stays plain dicts, the fast
path); `make_backend` still builds a MemoryBackend for the callers that want the batched interface (the
asynchronous runner, benchmarks). The other backends' modules are imported only when a job asks for one, so a
worker without their client libraries runs every other job as before.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from runtime.common.state_backends import BACKENDS, BY_NAME, DEFAULT, NAMES, BackendDescriptor, help_text
from runtime.state.backend import StateBackend, StateBackendError

KINDS = NAMES
MEMORY, ROCKSDB, REMOTE = "memory", "rocksdb", "remote"
__all__ = ["BACKENDS", "DEFAULT", "KINDS", "MEMORY", "REMOTE", "ROCKSDB", "check_kind", "help_text", "make_backend",
           "missing_extra", "spec"]


def check_kind(kind: str) -> str:
    """`kind` if it names a backend; a one-line error naming the choices otherwise."""
    if kind not in BY_NAME:
        raise StateBackendError(f"unknown state backend {kind!r}: choose one of {', '.join(KINDS)}")
    return kind


def spec(kind: str) -> BackendDescriptor:
    return BY_NAME[check_kind(kind)]


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


def make_backend(kind: str, key_groups: range, *, work_dir: str, options: Mapping[str, Any]) -> StateBackend:
    """A backend of `kind` for the key groups of one task, built by its descriptor's factory.

    `work_dir`: a directory this backend may own (RocksDB keeps its instance there). `options`: the backend's
    own (`write_buffer_bytes` for rocksdb; `remote_address` HOST:PORT and `namespace` for remote).
    """
    backend = spec(kind)
    if backend.needs_address and not options.get("remote_address"):
        raise StateBackendError(f"the {kind} state backend needs the server's address: "
                                "--state-remote-address HOST:PORT")
    problem = missing_extra(kind)
    if problem is not None:
        raise StateBackendError(problem)
    module, _, function = backend.factory.partition(":")
    created: StateBackend = getattr(importlib.import_module(module), function)(key_groups, work_dir=work_dir,
                                                                                options=options)
    return created
