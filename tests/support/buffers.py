"""Subpartitions with unlimited credit and the buffers they sent, and a sink that keeps what it got, for tests of
what operators emit."""

from __future__ import annotations

from typing import Any

from netstack.credit import ChannelSender, SendData
from runtime.connectors.sinks import Sink
from runtime.execution.channels import Subpartition


class ListSink(Sink):
    """Keeps the records written to it, in order (`out`)."""

    def __init__(self) -> None:
        super().__init__()
        self.out: list[Any] = []

    def write(self, record: Any) -> None:
        self.out.append(record)


def make_subs(n: int, capacity: int) -> list[Subpartition]:
    subs = []
    for c in range(n):
        sender = ChannelSender(c)
        sender.add_credit(1_000_000)
        subs.append(Subpartition(sender, limit=1_000_000, capacity=capacity))
    return subs


def sent(sub: Subpartition) -> list[tuple[bytes, int, bytes | None]]:
    sub.flush()
    out = []
    while (item := sub.sender.pop_sendable()) is not None:
        assert isinstance(item, SendData)
        b = item.buffer
        out.append((b.data, b.first_record_offset, b.continued_record))
    return out
