"""A backend wrapper that adds a fixed delay to every round trip: remote state, simulated.

It lets tests, the `round_trip_ms` state option and scripts/bench_state.py
show what batching and overlapping state requests buy when each round trip
costs a millisecond, on any backend (the real remote one is
runtime/state/remote.py). The delay is a
real sleep of the calling thread, as a blocking network call would be.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from typing import Any

from runtime.state.backend import BackendStatistics, PendingSnapshot, SnapshotHandle, StateAddress, StateBackend
from runtime.state.files import SnapshotStore


class LatencyBackend(StateBackend):
    def __init__(self, inner: StateBackend, *, round_trip_s: float) -> None:
        super().__init__(inner.key_groups)
        self.name = inner.name
        self._inner = inner
        self._round_trip_s = round_trip_s

    def statistics(self) -> BackendStatistics:
        return self._inner.statistics()

    def _wait(self) -> None:
        time.sleep(self._round_trip_s)

    def get_many(self, addresses: Sequence[StateAddress]) -> list[Any]:
        self._wait()
        return self._inner.get_many(addresses)

    def put_many(self, entries: Sequence[tuple[str, int, Any, Any]]) -> None:
        self._wait()
        self._inner.put_many(entries)

    def delete_many(self, addresses: Sequence[StateAddress]) -> None:
        self._wait()
        self._inner.delete_many(addresses)

    def write_many(self, puts: Sequence[tuple[str, int, Any, Any]], deletes: Sequence[StateAddress]) -> None:
        self._wait()
        self._inner.write_many(puts, deletes)

    def scan(self, key_groups: range) -> Iterator[tuple[str, int, Any, Any]]:
        return self._inner.scan(key_groups)

    def begin_snapshot(self, checkpoint_id: int) -> PendingSnapshot:
        return self._inner.begin_snapshot(checkpoint_id)

    def restore(self, store: SnapshotStore, handles: Sequence[SnapshotHandle]) -> None:
        self._inner.restore(store, handles)

    def close(self) -> None:
        self._inner.close()
