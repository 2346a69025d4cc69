"""Key groups and record routing.

A key's group is a stable hash of the key modulo the job's max parallelism;
a subtask owns a contiguous range of groups (as in Flink), so keyed state can
later be split or merged along group boundaries when rescaling. The hash must
not be Python's `hash()`, which differs between processes.
"""

from __future__ import annotations

import zlib
from typing import Any

import msgpack

from runtime.common.values import packer_default

_PICKLED = packer_default("a key")


def _key_default(obj: Any) -> Any:
    """A key msgpack does not know hashes by its pickle (runtime/common/values.py), the same in every process;
    except a set, whose iteration order (and so its pickle) depends on the process's string hash seed: it hashes
    by its elements' packed bytes, sorted."""
    if isinstance(obj, set | frozenset):
        return sorted(msgpack.packb(item, default=_key_default) for item in obj)
    return _PICKLED(obj)


def stable_hash(key: Any) -> int:
    if isinstance(key, str):
        return zlib.crc32(key.encode("utf-8"))
    if isinstance(key, bytes):
        return zlib.crc32(key)
    return zlib.crc32(msgpack.packb(key, default=_key_default))


def key_group(key: Any, max_parallelism: int) -> int:
    return stable_hash(key) % max_parallelism


def subtask_for_key_group(group: int, max_parallelism: int, parallelism: int) -> int:
    return group * parallelism // max_parallelism


def key_group_range(max_parallelism: int, parallelism: int, subtask: int) -> range:
    """The key groups `subtask` of `parallelism` owns: exactly those g with subtask_for_key_group(g) == subtask."""
    start = -(-subtask * max_parallelism // parallelism)
    end = -(-(subtask + 1) * max_parallelism // parallelism)
    return range(start, end)


class KeyRouter:
    """key -> consumer subtask, with a bounded cache because the hash is the hot part."""

    __slots__ = ("max_parallelism", "parallelism", "_cache")

    CACHE_LIMIT = 65536

    def __init__(self, max_parallelism: int, parallelism: int) -> None:
        self.max_parallelism = max_parallelism
        self.parallelism = parallelism
        self._cache: dict[Any, int] = {}

    def route(self, key: Any) -> int:
        try:
            return self._cache[key]
        except KeyError:
            pass
        except TypeError:  # unhashable key (a list from a JSON record): route without caching
            return subtask_for_key_group(key_group(key, self.max_parallelism), self.max_parallelism,
                                         self.parallelism)
        target = subtask_for_key_group(key_group(key, self.max_parallelism), self.max_parallelism, self.parallelism)
        if len(self._cache) >= self.CACHE_LIMIT:
            self._cache.clear()
        self._cache[key] = target
        return target
