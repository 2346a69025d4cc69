"""The registered workers: one owner for their records, read by everyone else.

The server registers workers, records their heartbeats and removes lost ones;
the job manager reads the records to place tasks and reach the workers; the
metrics collector sees only `statistics()`, a frozen snapshot.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from coordinator.heartbeat_reports import ReportMirror

if TYPE_CHECKING:
    from netstack.transport import Link


@dataclass
class WorkerRecord:
    worker_id: str
    link: Link
    slots: int
    host: str
    data_port: int
    metrics_port: int | None
    pid: int | None
    registered_at: float = field(default_factory=time.monotonic)
    last_heartbeat: float = field(default_factory=time.monotonic)
    process: dict[str, Any] = field(default_factory=dict)  # memory and CPU from its heartbeats (rest_views)
    reports: ReportMirror = field(default_factory=ReportMirror)  # its tasks' last reports, for heartbeat deltas

    def describe(self) -> dict[str, Any]:
        return {"id": self.worker_id, "slots": self.slots, "data": f"{self.host}:{self.data_port}",
                "metrics_port": self.metrics_port, "pid": self.pid,
                "last_heartbeat_s_ago": round(time.monotonic() - self.last_heartbeat, 2)}


@dataclass(frozen=True)
class WorkerStatistics:
    worker_id: str
    slots: int
    heartbeat_age_s: float


@dataclass(frozen=True)
class RegistryStatistics:
    workers: tuple[WorkerStatistics, ...]  # in registration order

    @property
    def registered(self) -> int:
        return len(self.workers)

    @property
    def slots_total(self) -> int:
        return sum(w.slots for w in self.workers)


class WorkerRegistry(Mapping[str, WorkerRecord]):
    """Worker id -> record. Read it as a mapping; change it only through the methods below."""

    def __init__(self) -> None:
        self._workers: dict[str, WorkerRecord] = {}

    def __getitem__(self, worker_id: str) -> WorkerRecord:
        return self._workers[worker_id]

    def __iter__(self) -> Iterator[str]:
        return iter(self._workers)

    def __len__(self) -> int:
        return len(self._workers)

    def register(self, record: WorkerRecord) -> WorkerRecord | None:
        """Add or replace the record of `record.worker_id`; returns the one it replaced."""
        old = self._workers.get(record.worker_id)
        self._workers[record.worker_id] = record
        return old

    def heartbeat(self, worker_id: str, link: Link, *, now: float) -> bool:
        """Record a heartbeat; False if `worker_id` is not registered on this link."""
        record = self._workers.get(worker_id)
        if record is None or record.link is not link:
            return False
        record.last_heartbeat = now
        return True

    def registered_on(self, worker_id: str, link: Link) -> bool:
        record = self._workers.get(worker_id)
        return record is not None and record.link is link

    def remove(self, worker_id: str) -> WorkerRecord | None:
        return self._workers.pop(worker_id, None)

    def overdue(self, *, now: float, timeout_s: float) -> list[WorkerRecord]:
        """Workers whose last heartbeat is more than `timeout_s` old."""
        return [w for w in self._workers.values() if now - w.last_heartbeat > timeout_s]

    def statistics(self, *, now: float | None = None) -> RegistryStatistics:
        now = time.monotonic() if now is None else now
        return RegistryStatistics(tuple(WorkerStatistics(w.worker_id, w.slots, now - w.last_heartbeat)
                                        for w in self._workers.values()))
