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
from itertools import islice
from typing import Any, Protocol

import msgpack

from netstack.credit import Buffer, ChannelSender, CreditLedger, Event, SendData
from runtime.common.values import unpack_ext


class GateListener(Protocol):
    """What an input gate tells its task; all three are called from network callbacks."""

    def wake(self) -> None: ...

    def on_priority_event(self, channel_id: int, seq: int, event: Event) -> None: ...

    def on_barrier_queued(self, channel_id: int, body: dict[str, Any]) -> None:
        """An in-band barrier, or the channel's end of partition, reached the gate (it may wait behind data)."""


class Wakeable(Protocol):
    def wake(self, sender: ChannelSender) -> None: ...


class OutputGate:
    """How many of a task's subpartitions are at their queue limit; 0 means the task may start a record.

    It also keeps which of them the task's flush tick must visit (`due`): those holding a partly filled
    buffer, and those the worker's buffer sizing left a new size for. A worker at parallelism 500 has 2,500
    subpartitions, nearly all empty at any tick: the tick visits the few in `due`, not all of them.
    """

    __slots__ = ("blocked", "would_block", "_notify", "due")

    def __init__(self) -> None:
        self.blocked = 0
        # in the order they became due; a subpartition whose builder holds data is always here (it is added
        # when a record starts in an empty builder, and leaves only when the tick flushes it)
        self.due: dict[Subpartition, None] = {}
        # the task's thread cut buffers that will fill a subpartition once queued (they wait in `deferred`):
        # its run stops there, as an inline one stops at `blocked`
        self.would_block = False
        self._notify: Callable[[], None] = lambda: None

    def bind(self, notify: Callable[[], None]) -> None:
        """Who to wake when the last blocked subpartition frees up (the task, once it exists)."""
        self._notify = notify

    def unblock_one(self) -> None:
        self.blocked -= 1
        if self.blocked == 0:
            self._notify()

    def take_due(self) -> list[Subpartition]:
        """The subpartitions the flush tick must visit, oldest first; none are due after this."""
        if not self.due:
            return []
        due = list(self.due)
        self.due.clear()
        return due


class Subpartition:
    __slots__ = ("sender", "link", "limit", "capacity", "buf", "first", "gate", "full", "bytes_out", "buffers_out",
                 "continued", "key", "end_event", "deferred", "deferred_n", "handed_n", "wanted_capacity")

    def __init__(self, sender: ChannelSender, *, limit: int, capacity: int) -> None:
        self.sender = sender
        self.link: Wakeable | None = None
        self.limit = limit
        self.capacity = capacity
        self.buf = bytearray()
        self.first = -1
        self.gate = OutputGate()  # the task's own gate replaces it when the task is built
        self.full = False
        self.bytes_out = 0
        self.buffers_out = 0
        self.continued: bytes | None = None  # the record the buffer being built begins by continuing
        self.key = ""  # "<edge>:<producer>:<consumer>", stable across attempts (checkpoint files use it)
        self.end_event: Event | None = None  # the end of partition, once queued (a checkpoint may overtake it)
        # while the task's chain runs on its own thread (runtime/execution/isolation.py): buffers cut meanwhile
        # wait here, and `hand_over` queues them on the loop, where the sender, credit and links live
        self.deferred: list[tuple[Subpartition, Buffer]] | None = None
        self.deferred_n = 0  # of them, this subpartition's
        # of those, handed over since (a task's loop hands them over while it runs: each count has one writer)
        self.handed_n = 0
        self.wanted_capacity = 0  # a size the worker's buffer sizing chose while the builder was busy (0: none)

    def append(self, data: bytes) -> None:
        buf = self.buf
        if self.first < 0:  # a record starts in this buffer (an empty builder always takes this branch)
            self.first = len(buf)
            self.gate.due[self] = None
        buf += data
        if len(buf) >= self.capacity:
            self._cut(data)

    def append_run(self, data: bytes) -> bool:
        """Append whole records packed back to back, if they all fit before the next cut.

        Returns False, having appended nothing, when they would reach the capacity: a cut must know where the
        record it splits starts, so the caller then appends them one by one.
        """
        buf = self.buf
        if len(buf) + len(data) >= self.capacity:
            return False
        if self.first < 0:
            self.first = len(buf)
            self.gate.due[self] = None
        buf += data
        return True

    def _cut(self, last_record: bytes) -> None:
        # A record never starts at or past the first cut (the builder held less
        # than one buffer before it), so every byte left over after a cut
        # belongs to `last_record`.
        buf = self.buf
        cap = self.capacity
        while len(buf) >= cap:
            self._enqueue(Buffer(bytes(buf[:cap]), self.first, self.continued))
            del buf[:cap]
            self.first = -1
            self.continued = last_record if buf else None

    def flush(self) -> None:
        if self.buf:
            self._enqueue(Buffer(bytes(self.buf), self.first, self.continued))
            self.buf.clear()
            self.first = -1
            self.continued = None

    def _enqueue(self, buffer: Buffer) -> None:
        self.bytes_out += len(buffer.data)
        self.buffers_out += 1  # at the cut, also when deferred: the record writer counts cuts with it
        if self.deferred is not None:
            self.deferred.append((self, buffer))
            self.deferred_n += 1
            if self.sender.queued_buffers + self.deferred_n - self.handed_n >= self.limit:
                self.gate.would_block = True
            return
        self.hand_over(buffer)

    def hand_over(self, buffer: Buffer) -> None:
        """Queue a cut buffer for sending (on the event loop)."""
        sender = self.sender
        sender.add_buffer(buffer)
        if not self.full and sender.queued_buffers >= self.limit:
            self.full = True
            self.gate.blocked += 1
        if self.link is not None:
            self.link.wake(sender)

    def add_event(self, event: Event, *, priority: bool = False, fence: bool = False) -> list[Buffer]:
        """Flush the partial buffer, then queue `event`; a priority event returns the buffers it overtook (those
        after the newest `fence` still queued: netstack/credit.py)."""
        self.flush()
        overtaken = self.sender.add_priority_event(event) if priority else []
        if not priority:
            self.sender.add_event(event, fence=fence)
            if event.body.get("t") == "end":
                self.end_event = event
        if self.link is not None:
            self.link.wake(self.sender)
        return overtaken

    def lift_fence(self, event: Event) -> list[Event]:
        """The fence `event` no longer holds priority events back; returns those that waited behind it, dropped."""
        return self.sender.lift_fence(event)

    def promote(self, event: Event) -> list[Buffer] | None:
        """Let a queued in-band event overtake the data ahead of it; None if it was already sent."""
        overtaken = self.sender.convert_to_priority(event)
        if overtaken is not None and self.link is not None:
            self.link.wake(self.sender)
        return overtaken

    def append_records(self, stream: bytes) -> int:
        """Append a stream of whole msgpack records one by one (restored output state); returns the count."""
        n = 0
        for record_bytes in split_records(stream):
            self.append(record_bytes)
            n += 1
        return n

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
    key: str = ""  # "<edge>:<producer>:<consumer>", stable across attempts (checkpoint files use it)
    send_credit: Callable[[int], None] | None = None
    ended: bool = False


@dataclass
class BarrierArrival:
    checkpoint_id: int
    seq: int  # in-band: the barrier's own seq; priority: the last in-band seq before it
    priority: bool


class InputGate:
    """The consumer end of a task's input channels.

    Each channel has its own FIFO of (seq, item); `ready` lists the channels
    that have something to take, round robin. A blocked channel (aligned
    checkpoint, barrier already taken) leaves `ready` until unblocked.

    For unaligned checkpoints the gate records, at arrival, the buffers that
    precede a barrier on channels that have not delivered it yet: a barrier's
    arrival (priority or in-band) ends the recording of its channel exactly,
    because every buffer before it arrived before it.
    """

    def __init__(self, listener: GateListener, channels: list[InputChannel], *, exclusive: int,
                 floating: int) -> None:
        self.listener = listener
        self.channels = {c.channel_id: c for c in channels}
        self.ledger = CreditLedger([c.channel_id for c in channels], exclusive=exclusive, floating=floating)
        self.queues: dict[int, deque[tuple[int, Buffer | Event]]] = {c.channel_id: deque() for c in channels}
        self.ready: deque[int] = deque()
        self.blocked: set[int] = set()
        self.open_channels = len(channels)
        self.bytes_in = 0
        self.buffers_in = 0
        self.queued = 0
        self.arrivals: dict[int, BarrierArrival] = {}  # latest barrier to reach the gate, per channel
        # the last few, per channel: with concurrent checkpoints a later barrier may arrive before the snapshot
        # of an earlier one, which must still end at its own barrier
        self.arrival_log: dict[int, deque[BarrierArrival]] = {c.channel_id: deque(maxlen=4) for c in channels}
        self.recording_id: int | None = None
        self.recorders: dict[int, list[Buffer]] = {}

    # -- arrival (network callbacks) ---------------------------------------------

    def _enqueue(self, channel_id: int, seq: int, item: Buffer | Event) -> None:
        queue = self.queues[channel_id]
        if not queue and channel_id not in self.blocked:
            self.ready.append(channel_id)
        queue.append((seq, item))
        self.queued += 1
        self.listener.wake()

    def deliver_data(self, channel_id: int, seq: int, buffer: Buffer) -> None:
        """Called after the ledger accepted the buffer (credit and sequence checked)."""
        self.bytes_in += len(buffer.data)
        self.buffers_in += 1
        recorder = self.recorders.get(channel_id)
        if recorder is not None:
            recorder.append(buffer)
        self._enqueue(channel_id, seq, buffer)
        if self.ledger.lent:  # its backlog won floating credit: announce it now, not with the next consumed buffer
            self.announce_credit()

    def deliver_event(self, channel_id: int, seq: int, event: Event, priority: bool) -> None:
        body = event.body
        if body.get("t") == "barrier":
            checkpoint_id = int(body["id"])
            self.arrivals[channel_id] = arrival = BarrierArrival(checkpoint_id, seq, priority)
            self.arrival_log[channel_id].append(arrival)
            if self.recording_id is not None and checkpoint_id >= self.recording_id:
                self.recorders.pop(channel_id, None)  # everything before the barrier is recorded
            if not priority:
                self.listener.on_barrier_queued(channel_id, body)
        elif body.get("t") == "end":  # nothing follows it: the channel's recording is complete
            self.recorders.pop(channel_id, None)
            self.listener.on_barrier_queued(channel_id, body)  # the checkpoints count it as delivered (FLIP-147)
        if priority:
            self.listener.on_priority_event(channel_id, seq, event)
        else:
            self._enqueue(channel_id, seq, event)

    # -- taking input (the task) ---------------------------------------------------

    def poll(self) -> tuple[int, Buffer | Event] | None:
        while self.ready:
            channel_id = self.ready.popleft()
            if channel_id in self.blocked:
                continue
            queue = self.queues[channel_id]
            if not queue:
                continue
            _, item = queue.popleft()
            self.queued -= 1
            if queue:
                self.ready.append(channel_id)
            return channel_id, item
        return None

    def poll_buffer(self) -> tuple[int, Buffer] | None:
        """`poll`, but only when the next item is a buffer: an event stays queued where it is (the checkpoint
        layer finds an in-band barrier in the gate until the task takes it)."""
        while self.ready:
            channel_id = self.ready[0]
            queue = self.queues[channel_id]
            if channel_id in self.blocked or not queue:
                self.ready.popleft()
                continue
            item = queue[0][1]
            if not isinstance(item, Buffer):
                return None
            self.ready.popleft()
            queue.popleft()
            self.queued -= 1
            if queue:
                self.ready.append(channel_id)
            return channel_id, item
        return None

    def block(self, channel_id: int) -> None:
        self.blocked.add(channel_id)
        self.ledger.block(channel_id)  # a blocked channel borrows no floating credit

    def unblock_all(self, keep: frozenset[int] = frozenset()) -> None:
        """Unblock every channel but `keep` (a savepoint still aligning beside a newer unaligned checkpoint)."""
        for channel_id in self.blocked - keep:
            if self.queues[channel_id]:
                self.ready.append(channel_id)
        self.blocked.intersection_update(keep)
        self.ledger.unblock_all(keep)
        self.announce_credit()
        self.listener.wake()

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
        return self.queued

    # -- unaligned checkpoints -------------------------------------------------------

    def start_recording(self, checkpoint_id: int) -> dict[int, list[Buffer]]:
        """The queued buffers that precede barrier `checkpoint_id`, per channel; keep recording where it is
        still to come. The returned lists keep growing until each channel's barrier arrives."""
        self.recording_id = checkpoint_id
        self.recorders = {}
        captured: dict[int, list[Buffer]] = {}
        arrival_log = self.arrival_log
        for channel_id, queue in self.queues.items():
            # the first barrier of this checkpoint or a later one to reach the gate on that channel
            arrival = None
            for logged in arrival_log[channel_id]:  # a plain loop: this runs for each of the gate's channels
                if logged.checkpoint_id >= checkpoint_id:
                    arrival = logged
                    break
            if not queue:  # nothing queued on it: nothing to capture, whatever the arrival
                captured[channel_id] = []
                if arrival is None and not self.channels[channel_id].ended:
                    self.recorders[channel_id] = captured[channel_id]
            elif arrival is not None:
                if arrival.priority:
                    captured[channel_id] = [b for seq, b in queue if isinstance(b, Buffer) and seq <= arrival.seq]
                else:
                    captured[channel_id] = [b for seq, b in queue if isinstance(b, Buffer) and seq < arrival.seq]
            else:
                captured[channel_id] = [b for _, b in queue if isinstance(b, Buffer)]
                if not self.channels[channel_id].ended:
                    self.recorders[channel_id] = captured[channel_id]
        return captured

    def stop_recording(self, checkpoint_id: int | None = None) -> None:
        """Stop recording (for `checkpoint_id` only: an aligned checkpoint completing beside an unaligned one that
        records leaves it recording)."""
        if checkpoint_id is not None and checkpoint_id != self.recording_id:
            return
        self.recording_id = None
        self.recorders = {}


class ChannelReader:
    """Decodes one input channel's buffers into records, joining records that span buffers.

    It also knows which bytes it holds unconsumed (records not yet processed
    and a partial record), which an unaligned snapshot taken between records
    must store as the start of that channel's state.
    """

    __slots__ = ("unpacker", "consumed", "fetched", "_fed", "_recent")

    def __init__(self) -> None:
        self.unpacker = msgpack.Unpacker(use_list=False, raw=False, strict_map_key=False, ext_hook=unpack_ext)
        # Stream position after the last record the task *processed*. Not unpacker.tell(): that moves into a
        # partly parsed record at the end of a buffer, and past a record fetched but not yet processed.
        self.consumed = 0
        self.fetched = 0  # stream position after the last record `take` returned
        self._fed = 0
        self._recent: deque[bytes] = deque()  # trailing buffers covering the unconsumed bytes

    def feed(self, data: bytes) -> None:
        self.unpacker.feed(data)
        self._fed += len(data)
        self._recent.append(data)

    def take(self, n: int) -> list[Any]:
        """Up to `n` whole records, decoded in one call; `fetched` becomes the position after them."""
        records = list(islice(self.unpacker, n))
        if len(records) == n:
            self.fetched = self.unpacker.tell()  # islice stopped without trying a record more: exact
        elif records:
            # The unpacker ran out of data: its tell() moved into the partial record it began (if any). Find
            # the exact end by skipping the same records again in the bytes held since `fetched` (at most
            # one chunk and a partial record; this happens about once per buffer).
            pending = self._fed - self.fetched
            scan = msgpack.Unpacker(raw=False, strict_map_key=False)
            scan.feed(b"".join(self._recent)[-pending:])
            for _ in records:
                scan.skip()
            self.fetched += scan.tell()
        return records

    def trim(self) -> None:
        """After a buffer is processed: keep only the buffers that still hold unconsumed bytes."""
        pending = self._fed - self.consumed
        recent = self._recent
        held = sum(len(b) for b in recent)
        while recent and held - len(recent[0]) >= pending:
            held -= len(recent.popleft())

    def unconsumed(self) -> bytes:
        pending = self._fed - self.consumed
        return b"".join(self._recent)[-pending:] if pending else b""


def split_records(stream: bytes) -> list[bytes]:
    """Cut a byte stream of msgpack records into one bytes object per whole record (a partial tail is dropped)."""
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=False)
    unpacker.feed(stream)
    out = []
    start = 0
    while True:
        try:
            unpacker.skip()
        except msgpack.OutOfData:
            break
        end = unpacker.tell()
        out.append(stream[start:end])
        start = end
    return out


def whole_records_length(stream: bytes) -> int:
    """Length of the longest prefix of `stream` made of whole msgpack records."""
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=False)
    unpacker.feed(stream)
    end = 0
    while True:
        try:
            unpacker.skip()
        except msgpack.OutOfData:
            return end
        end = unpacker.tell()


def whole_records(prefix: bytes, buffers: list[Buffer]) -> bytes:
    """`prefix` (starting at a record) then `buffers`, cut after the last whole record.

    The consumer drops the partial record at the end: its producer stores it
    whole. Only the tail is scanned, from the last record start a buffer
    declares, so the cost does not grow with the amount of channel state.
    """
    stream = prefix + b"".join(b.data for b in buffers)
    start = 0
    position = len(stream)
    for buffer in reversed(buffers):
        position -= len(buffer.data)
        if buffer.first_record_offset >= 0:
            start = position + buffer.first_record_offset
            break
    return stream[: start + whole_records_length(stream[start:])]


def overtaken_records(overtaken: list[Buffer]) -> bytes:
    """The whole records held by buffers a priority event overtook at the producer.

    The first overtaken buffer may begin with the tail of a record whose head
    was already sent: the consumer drops that partial record from its own
    state, so the producer stores it whole (see DESIGN.md section 5).
    """
    if not overtaken:
        return b""
    head = overtaken[0]
    if head.continued_record is None:
        return b"".join(b.data for b in overtaken)
    parts = [head.continued_record]
    rest = iter(overtaken)
    for buffer in rest:
        if buffer.first_record_offset < 0:
            continue  # still inside the continued record
        parts.append(buffer.data[buffer.first_record_offset:])
        break
    parts.extend(b.data for b in rest)
    return b"".join(parts)


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
                self.gate.deliver_data(cid, item.seq, item.buffer)
            else:
                ledger.on_event(cid, item.seq, item.priority)
                self.gate.deliver_event(cid, item.seq, item.event, item.priority)
        if moved:
            self.subpartition.on_sent()


def event(kind: str, **fields: Any) -> Event:
    return Event({"t": kind, **fields})
