"""A worker's checkpoint acknowledgements, batched: the acknowledgements its tasks make within a millisecond of
the first travel to the coordinator as one AckCheckpoints per job attempt. At a checkpoint every task of a
worker acknowledges within a few milliseconds, so the coordinator handles one call per worker instead of one
per task (its per-message work was what limited it at 1,000 tasks: docs/BENCHMARKS.md, Coordinator at scale).
The window costs a checkpoint at most that millisecond."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from runtime.graph import protocol as p

WINDOW_S = 0.001


class AckBatcher:
    """`add(ack)` on the worker's loop; `send(batch)` is called on it with each job attempt's acknowledgements,
    in the order they were added."""

    def __init__(self, send: Callable[[p.AckCheckpoints], object], window_s: float = WINDOW_S) -> None:
        self.send = send
        self.window_s = window_s
        self._pending: dict[tuple[str, int], list[p.AckCheckpoint]] = {}
        self._flush_at: asyncio.TimerHandle | None = None

    def add(self, ack: p.AckCheckpoint) -> None:
        self._pending.setdefault((ack.job_id, ack.attempt), []).append(ack)
        if self._flush_at is None:
            self._flush_at = asyncio.get_running_loop().call_later(self.window_s, self.flush)

    def flush(self) -> None:
        if self._flush_at is not None:
            self._flush_at.cancel()
            self._flush_at = None
        pending, self._pending = self._pending, {}
        for (job_id, attempt), acks in pending.items():
            self.send(p.AckCheckpoints(job_id, attempt, acks))
