"""Task-side ends of logical channels, on the worker's event loop.

`Subpartition` is the producer end: it packs records into fixed-capacity
buffers (a record that does not fit continues in the next buffer), hands
full buffers to its `ChannelSender`, and tells its `OutputGate` when its
queue reaches the per-channel limit, which is how a task learns it is
backpressured. `InputGate` is the consumer end of all of a task's input
channels: in-band buffers and events queue in arrival order, priority events
go straight to the task's mailbox, and consumed buffers turn into credit.

`LocalLink` joins a sender and a gate on the same worker with the same
credit rules as a TCP link, minus the sockets.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from netstack.credit import Buffer, ChannelSender, CreditLedger, Event, SendData

if TYPE_CHECKING:
    from runtime.task import Task

DEFAULT_BUFFER_BYTES = 32 * 1024


class Wakeable(Protocol):
    def wake(self, sender: ChannelSender) -> None: ...


class OutputGate:
    """How many of a task's subpartitions are at their queue limit; 0 means the task may start a record."""

    __slots__ = ("blocked", "_notify")

    def __init__(self, notify: Callable[[], None]) -> None:
        self.blocked = 0
        self._notify = notify

    def unblock_one(self) -> None:
        self.blocked -= 1
        if self.blocked == 0:
            self._notify()


class Subpartition:
    __slots__ = ("sender", "link", "limit", "capacity", "buf", "first", "gate", "full", "bytes_out", "buffers_out")

    def __init__(self, sender: ChannelSender, gate: OutputGate, *, limit: int, capacity: int) -> None:
        self.sender = sender
        self.link: Wakeable | None = None
        self.limit = limit
        self.capacity = capacity
        self.buf = bytearray()
        self.first = -1
        self.gate = gate
        self.full = False
        self.bytes_out = 0
        self.buffers_out = 0

    def append(self, data: bytes) -> None:
        buf = self.buf
        if self.first < 0:
            self.first = len(buf)
        buf += data
        if len(buf) >= self.capacity:
            self._cut()

    def _cut(self) -> None:
        buf = self.buf
        cap = self.capacity
        while len(buf) >= cap:
            self._enqueue(Buffer(bytes(buf[:cap]), self.first))
            del buf[:cap]
            self.first = -1  # what is left continues the last record

    def flush(self) -> None:
        if self.buf:
            self._enqueue(Buffer(bytes(self.buf), self.first))
            self.buf.clear()
            self.first = -1

    def _enqueue(self, buffer: Buffer) -> None:
        sender = self.sender
        sender.add_buffer(buffer)
        self.bytes_out += len(buffer.data)
        self.buffers_out += 1
        if not self.full and sender.queued_buffers >= self.limit:
            self.full = True
            self.gate.blocked += 1
        if self.link is not None:
            self.link.wake(sender)

    def add_event(self, event: Event, *, priority: bool = False) -> list[Buffer]:
        """Flush the partial buffer, then queue `event`; a priority event returns the buffers it overtook."""
        self.flush()
        overtaken = self.sender.add_priority_event(event) if priority else []
        if not priority:
            self.sender.add_event(event)
        if self.link is not None:
            self.link.wake(self.sender)
        return overtaken

    def on_sent(self) -> None:
        if self.full and self.sender.queued_buffers < self.limit:
            self.full = False
            self.gate.unblock_one()

    def drained(self) -> bool:
        return not self.buf and not self.sender.has_sendable() and self.sender.queued_buffers == 0


@dataclass
class InputChannel:
    channel_id: int
    index: int  # position among the gate's channels
    input_index: int  # which logical input of the task (for union / two-input operators)
    producer: str  # "vertex:subtask" of the upstream
    send_credit: Callable[[int], None] | None = None
    ended: bool = False


class InputGate:
    def __init__(self, task: Task, channels: list[InputChannel], *, exclusive: int, floating: int) -> None:
        self.task = task
        self.channels = {c.channel_id: c for c in channels}
        self.ledger = CreditLedger([c.channel_id for c in channels], exclusive=exclusive, floating=floating)
        self.queue: deque[tuple[int, Buffer | Event]] = deque()
        self.open_channels = len(channels)
        self.bytes_in = 0
        self.buffers_in = 0

    def deliver_data(self, channel_id: int, buffer: Buffer) -> None:
        """Called after the ledger accepted the buffer (credit and sequence checked)."""
        self.queue.append((channel_id, buffer))
        self.bytes_in += len(buffer.data)
        self.buffers_in += 1
        self.task.wake()

    def deliver_event(self, channel_id: int, seq: int, event: Event, priority: bool) -> None:
        if priority:
            self.task.post_priority(channel_id, seq, event)
        else:
            self.queue.append((channel_id, event))
            self.task.wake()

    def consumed(self, channel_id: int) -> None:
        self.ledger.on_consumed(channel_id)
        self.announce_credit()

    def announce_credit(self) -> None:
        for cid, credits in self.ledger.take_announcements().items():
            send = self.channels[cid].send_credit
            if send is not None:
                send(credits)

    def end_channel(self, channel_id: int) -> None:
        channel = self.channels[channel_id]
        if not channel.ended:
            channel.ended = True
            self.open_channels -= 1

    def queued_buffers(self) -> int:
        return len(self.queue)


class LocalLink:
    """Moves items from a sender to a gate on the same worker, honouring credit like a TCP link."""

    def __init__(self, channel_id: int, subpartition: Subpartition, gate: InputGate) -> None:
        self.channel_id = channel_id
        self.subpartition = subpartition
        self.gate = gate
        self._scheduled = False
        self.closed = False

    def wake(self, sender: ChannelSender) -> None:
        if not self._scheduled and not self.closed:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._drain)

    def send_credit(self, credits: int) -> None:
        if self.closed:
            return
        self.subpartition.sender.add_credit(credits)
        self.wake(self.subpartition.sender)

    def _drain(self) -> None:
        self._scheduled = False
        if self.closed:
            return
        sender = self.subpartition.sender
        ledger = self.gate.ledger
        cid = self.channel_id
        moved = False
        while True:
            item = sender.pop_sendable()
            if item is None:
                break
            moved = True
            if isinstance(item, SendData):
                ledger.on_data(cid, item.seq, item.backlog)
                self.gate.deliver_data(cid, item.buffer)
            else:
                ledger.on_event(cid, item.seq, item.priority)
                self.gate.deliver_event(cid, item.seq, item.event, item.priority)
        if moved:
            self.subpartition.on_sent()


def describe_event(event: Event) -> str:
    return str(event.body.get("t", "?"))


def event(kind: str, **fields: Any) -> Event:
    return Event({"t": kind, **fields})
