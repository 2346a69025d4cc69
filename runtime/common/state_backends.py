"""The state backends' descriptors: the one table of their names, what each needs installed, how to build one
and which checkpoints it can restore. Every list of backend names derives from it.

It sits below every layer (imports nothing of ours) so that the api (`Job.state_backend`), the job
configuration (`--state-backend`'s choices), admission (which extra a job needs) and the worker's registry
(runtime/state/registry.py, which builds backends) all read the same entries. A new backend is one entry here
and its module; the factory is named, not imported, so a worker without the backend's libraries runs every
other job as before.
"""

from __future__ import annotations

from dataclasses import dataclass

from runtime.common.extras import install_line


@dataclass(frozen=True, slots=True)
class BackendDescriptor:
    name: str
    summary: str  # one line for --help
    # "module:function" building it: function(key_groups, *, work_dir, options) -> StateBackend; the module
    # also defines `available()` when its libraries may be missing
    factory: str
    extra: str | None = None  # the pyproject extra its libraries come from (None: always installed)
    # the backends whose checkpoints a task on this one restores besides its own (runtime/worker/state_backends.py
    # converts between them as the task starts)
    restores_from: tuple[str, ...] = ()
    needs_address: bool = False  # a server's HOST:PORT (state.remote_address)

    @property
    def install_line(self) -> str:
        return install_line(self.extra) if self.extra else ""

    @property
    def module(self) -> str:
        return self.factory.partition(":")[0]

    def restores(self, taken_by: str) -> bool:
        """Whether a checkpoint taken on backend `taken_by` restores on this one."""
        return taken_by == self.name or taken_by in self.restores_from


# A memory checkpoint's keyed state is dict tables, which a task on any backend writes through its state tables
# as it starts; a rocksdb one is read out into dict tables by a task on memory (runtime/worker/state_backends.py).
BACKENDS = (
    BackendDescriptor("memory", "dicts in the task (the default)", "runtime.state.memory:create",
                      restores_from=("rocksdb",)),
    BackendDescriptor("rocksdb", "on local disk, larger than memory, incremental checkpoints",
                      "runtime.state.rocksdb:create", extra="rocksdb", restores_from=("memory",)),
    BackendDescriptor("remote", "a Redis-protocol state server (--state-remote-address)",
                      "runtime.state.remote:create", extra="remote", restores_from=("memory",), needs_address=True),
)
BY_NAME = {d.name: d for d in BACKENDS}
NAMES = tuple(BY_NAME)
DEFAULT = "memory"


def help_text() -> str:
    return ", ".join(f"{d.name} ({d.summary})" for d in BACKENDS)
