"""How many connections a listener holds, and which one gives way: the admission policy, pure.

Every listener (RPC, data, metrics) admits connections through an
`Admission`. A connection is *pending* until it proves itself (the cluster
handshake on RPC and data links; a request in progress on the metrics port)
and *active* after. Anyone who can reach a port can open pending
connections, so they are the ones that give way:

- when `max_pending` connections are pending, a new one evicts the oldest
  pending one (a flood of idle sockets churns among itself while a real
  peer, which completes its handshake in milliseconds, gets in);
- when `max_connections` are open, a new one evicts the oldest pending one
  if any, and is refused otherwise (only token holders can fill a listener
  with active links).

Each listener has its own `Admission`, so a flood of one port cannot starve
another of sockets; `raise_nofile_limit` at process start gives them room.
No I/O here except `raise_nofile_limit`, which the entry point calls once.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")

# Connections shed by a listener's admission, by why (for metrics): "refused" at max_connections with
# none pending, "evicted" (a pending one made room for a newer one).
SHED: collections.Counter[str] = collections.Counter()


@dataclass(frozen=True)
class ListenerLimits:
    """Per listener. `handshake_timeout_s`: a pending connection is closed after this long (None: the
    transport's default, 10 s)."""

    max_connections: int = 1024
    max_pending: int = 128
    handshake_timeout_s: float | None = None

    def __post_init__(self) -> None:
        if self.max_connections < 1 or self.max_pending < 1:
            raise ValueError("connection limits must be at least 1")
        if self.handshake_timeout_s is not None and self.handshake_timeout_s <= 0:
            raise ValueError("the handshake timeout must be positive")


@dataclass(frozen=True)
class AdmissionStatistics:
    pending: int
    active: int
    refused: int
    evicted: int


class Admission(Generic[T]):
    """Which connections a listener keeps. The caller closes what `admit` says to evict or refuse."""

    def __init__(self, max_connections: int, max_pending: int) -> None:
        self.max_connections = max_connections
        self.max_pending = min(max_pending, max_connections)
        self._pending: dict[T, None] = {}  # insertion order = age, oldest first
        self._active: set[T] = set()
        self.refused = 0
        self.evicted = 0

    def __len__(self) -> int:
        return len(self._pending) + len(self._active)

    def admit(self, conn: T) -> tuple[bool, list[T]]:
        """A new connection: (whether it is admitted as pending, the connections to close for it)."""
        evict: list[T] = []
        while self._pending and (len(self._pending) >= self.max_pending or len(self) >= self.max_connections):
            oldest = next(iter(self._pending))
            del self._pending[oldest]
            evict.append(oldest)
        self.evicted += len(evict)
        if len(self) >= self.max_connections:
            self.refused += 1
            return False, evict
        self._pending[conn] = None
        return True, evict

    def activate(self, conn: T) -> None:
        """`conn` proved itself (handshake done, request under way): it no longer gives way."""
        if conn in self._pending:
            del self._pending[conn]
            self._active.add(conn)

    def idle(self, conn: T) -> None:
        """`conn` is waiting again (a keep-alive HTTP connection between requests): youngest pending."""
        if conn in self._active:
            self._active.discard(conn)
            self._pending[conn] = None

    def release(self, conn: T) -> None:
        """`conn` closed, for whatever reason; unknown connections are ignored."""
        self._pending.pop(conn, None)
        self._active.discard(conn)

    def statistics(self) -> AdmissionStatistics:
        return AdmissionStatistics(len(self._pending), len(self._active), self.refused, self.evicted)


def raise_nofile_limit() -> tuple[int, int]:
    """Raise this process's soft open-files limit to the hard one; returns (soft, hard) after.

    The usual soft limit (1024) is what a thousand idle sockets used up; every
    listener is capped anyway, but the caps assume the hard limit is usable.
    """
    try:
        import resource
    except ImportError:  # not on this platform
        return (-1, -1)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):  # e.g. a hard limit of RLIM_INFINITY that the kernel caps lower
            pass
    return soft, hard
