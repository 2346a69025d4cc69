"""Keyed-state tables backed by a StateBackend, shaped like the dicts the memory path uses.

A task's operators read and write keyed state through tables: `table.get(key, default)`, `table[key] =
value`, `table.pop(key, None)`. On the memory backend a table is a plain dict (the fast path, untouched);
on rocksdb or remote it is a `BackendTable`, which turns each of those calls into a batch of one on the
backend, under the state name `<node id>/<name>` and the key's key group. So every state kind in
runtime/api/state.py runs unchanged on every backend.

Tables whose names start with "\\0" (the timer tables of runtime/execution/timers.py) stay plain dicts
even on a backend: timers are few, kept in memory, and checkpointed and rescaled with the task's
operator state file exactly as on the memory backend.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from runtime.graph.partitioning import key_group
from runtime.state.backend import MISSING, StateBackend

INTERNAL_PREFIX = "\0"


class BackendTable:
    """The entries of one keyed state (one operator, one name) in a backend, as a small dict-like object."""

    __slots__ = ("backend", "name", "_max_parallelism", "_get_one", "_put_one", "_delete_one")

    def __init__(self, backend: StateBackend, name: str, max_parallelism: int) -> None:
        self.backend = backend
        self.name = name
        self._max_parallelism = max_parallelism
        self._get_one = backend.get_one
        self._put_one = backend.put_one
        self._delete_one = backend.delete_one

    def get(self, key: Any, default: Any = None) -> Any:
        value = self._get_one(self.name, key_group(key, self._max_parallelism), key)
        return default if value is MISSING else value

    def __getitem__(self, key: Any) -> Any:
        value = self.get(key, MISSING)
        if value is MISSING:
            raise KeyError(key)
        return value

    def __setitem__(self, key: Any, value: Any) -> None:
        self._put_one(self.name, key_group(key, self._max_parallelism), key, value)

    def __delitem__(self, key: Any) -> None:
        if self.pop(key, MISSING) is MISSING:
            raise KeyError(key)

    def pop(self, key: Any, default: Any = None) -> Any:
        group = key_group(key, self._max_parallelism)
        value = self._get_one(self.name, group, key)
        if value is MISSING:
            return default
        self._delete_one(self.name, group, key)
        return value

    def __contains__(self, key: Any) -> bool:
        return self.get(key, MISSING) is not MISSING

    def setdefault(self, key: Any, default: Any = None) -> Any:
        value = self.get(key, MISSING)
        if value is MISSING:
            self[key] = default
            return default
        return value

    def items(self) -> Iterator[tuple[Any, Any]]:
        """Every entry of this state in the backend's key groups: a full scan, for tools and tests."""
        for name, _, key, value in self.backend.scan(self.backend.key_groups):
            if name == self.name:
                yield key, value

    def keys(self) -> Iterator[Any]:
        return (k for k, _ in self.items())

    def __iter__(self) -> Iterator[Any]:
        return self.keys()

    def __len__(self) -> int:
        return sum(1 for _ in self.items())

    def update(self, entries: dict[Any, Any]) -> None:
        mp = self._max_parallelism
        self.backend.put_many([(self.name, key_group(k, mp), k, v) for k, v in entries.items()])

    def clear(self) -> None:
        mp = self._max_parallelism
        self.backend.delete_many([(self.name, key_group(k, mp), k) for k in list(self.keys())])


class BackendTables(dict):  # type: ignore[type-arg]
    """The tables of one keyed operator (name -> table), as the chain and KeyedContext use them:
    `setdefault(name, {})` makes a BackendTable for a user's state and keeps internal tables as dicts."""

    def __init__(self, backend: StateBackend, node_id: int, max_parallelism: int) -> None:
        super().__init__()
        self.backend = backend
        self.node_id = node_id
        self.max_parallelism = max_parallelism

    def setdefault(self, name: str, default: Any = None) -> Any:
        table = self.get(name)
        if table is None:
            table = (default if default is not None else {}) if name.startswith(INTERNAL_PREFIX) else \
                BackendTable(self.backend, state_name(self.node_id, name), self.max_parallelism)
            self[name] = table
        return table

    def in_memory(self) -> dict[str, dict[Any, Any]]:
        """The tables kept in memory (timers): what the operator state file holds on a backend."""
        return {name: table for name, table in self.items() if isinstance(table, dict)}


def state_name(node_id: int, name: str) -> str:
    """The name a backend stores an operator's state under: node ids keep two operators' `count` apart."""
    return f"{node_id}/{name}"
