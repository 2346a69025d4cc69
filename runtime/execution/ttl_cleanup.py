"""Cleaning expired TTL state that nobody reads again: Flink's incremental cleanup, and a key-group sweep in the
manner of RocksDB's compaction filter.

A read deletes the expired entries it comes across (runtime/api/state.py), but a key that is never read or
written again would keep its entry for ever: in a keyed job whose key space moves (sessions, device ids, days)
state would grow without bound. So each keyed operator with TTL states has a `TtlCleanup`, which the operator
steps after every batch of records (`PER_RECORD` entries per record processed: faster than a record can add
keys, so the sweep keeps up) and the chain steps at every checkpoint, before the snapshot, with a larger budget
(`AT_CHECKPOINT`), so an idle operator is cleaned too and expired entries do not reach the checkpoint.

What it looks at, per TTL state, round robin:
- a dict table (the memory backend): a cursor over a copy of its keys, taken when the previous pass ended, so
  each pass visits every key once whatever the dict does meanwhile;
- a BackendTable (rocksdb, remote): one key group of the backend at a time (a range scan of that group), its
  expired entries deleted and its lists and maps trimmed in one batch write.
The decision for one stored value is `runtime.api.state.expired_action` (pure).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from runtime.api.state import DELETE, KEEP, expired_action

PER_RECORD = 4  # entries examined per record processed
AT_CHECKPOINT = 10_000  # entries examined per operator at every checkpoint
GROUPS_PER_BATCH = 1  # key groups of a backend table examined after a batch of records
GROUPS_AT_CHECKPOINT = 16  # ... and at a checkpoint (a pass over 128 groups in 8 checkpoints, without batches)


@dataclass(frozen=True, slots=True)
class TtlCleanupStatistics:
    examined: int
    deleted: int  # keys whose whole entry went
    trimmed: int  # lists and maps that lost expired elements


class TtlCleanup:
    """Sweeps the TTL states `ttl_states` (name -> shape) of one keyed operator; `tables(name)` gives a state's
    table and `clock()` the TTL clock in milliseconds."""

    def __init__(self, ttl_states: dict[str, str], tables: Callable[[str], Any], clock: Callable[[], int]) -> None:
        self.ttl_states = ttl_states  # the context's own dict: states declared later are swept too
        self._tables = tables
        self._clock = clock
        self._keys: dict[str, list[Any]] = {}  # dict tables: keys still to visit in this pass
        self._groups: dict[str, list[int]] = {}  # backend tables: key groups still to visit in this pass
        self._turn = 0
        self._examined = self._deleted = self._trimmed = 0

    def statistics(self) -> TtlCleanupStatistics:
        return TtlCleanupStatistics(self._examined, self._deleted, self._trimmed)

    def step(self, budget: int, groups: int = GROUPS_PER_BATCH) -> int:
        """Examine about `budget` entries of dict tables, and `groups` key groups of each backend table (whole);
        returns how many entries were examined."""
        names = list(self.ttl_states)
        if not names or budget <= 0:
            return 0
        now = self._clock()
        done = 0
        groups_left = dict.fromkeys(names, groups)
        for name in names:  # a pass that ended starts again, once per step: a small table is not swept repeatedly
            table = self._tables(name)
            if isinstance(table, dict) and not self._keys.get(name):
                self._keys[name] = list(reversed(table))  # popped from the end: oldest keys first
        idle = 0  # states in a row with nothing (more) to examine
        while done < budget and idle < len(names):
            name = names[self._turn % len(names)]
            self._turn += 1
            table = self._tables(name)
            if isinstance(table, dict):
                n = self._step_dict(name, table, budget - done, now)
                progressed = n > 0
            elif groups_left[name] > 0:
                groups_left[name] -= 1
                n, progressed = self._step_backend(name, table, now), True
            else:
                n, progressed = 0, False
            idle = 0 if progressed else idle + 1
            done += n
        self._examined += done
        return done

    def _step_dict(self, name: str, table: dict[Any, Any], budget: int, now: int) -> int:
        keys = self._keys.get(name)
        if keys is None:
            return 0
        shape = self.ttl_states[name]
        n = 0
        while keys and n < budget:
            key = keys.pop()
            stored = table.get(key, KEEP)
            if stored is KEEP:
                continue  # gone since the pass began
            n += 1
            action = expired_action(shape, stored, now)
            if action is DELETE:
                del table[key]
                self._deleted += 1
            elif action is not KEEP:
                table[key] = action
                self._trimmed += 1
        return n

    def _step_backend(self, name: str, table: Any, now: int) -> int:
        groups = self._groups.get(name)
        backend = table.backend
        if not groups:
            groups = self._groups[name] = list(reversed(backend.key_groups))
        group = groups.pop()
        shape = self.ttl_states[name]
        puts, deletes = [], []
        n = 0
        for stored_name, g, key, stored in backend.scan(range(group, group + 1)):
            if stored_name != table.name:
                continue
            n += 1
            action = expired_action(shape, stored, now)
            if action is DELETE:
                deletes.append((table.name, g, key))
            elif action is not KEEP:
                puts.append((table.name, g, key, action))
        if puts or deletes:
            backend.write_many(puts, deletes)
            self._deleted += len(deletes)
            self._trimmed += len(puts)
        return n
