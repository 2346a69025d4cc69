"""Credit-based flow control and the two-lane send queue, without I/O.

One logical channel joins a producer's subpartition to a consumer's input
channel. The producer side is a `ChannelSender`: an in-band lane (data
buffers and ordinary events, in order) and a priority lane (events that
overtake every queued data buffer). A data buffer leaves only against a
credit; events never need one, so a barrier cannot deadlock behind exhausted
credit.

A fence is an in-band event that priority events must not overtake (a
savepoint's barrier: each channel then delivers it before a newer unaligned
barrier queued after it, and the buffers the unaligned barrier overtakes are
only those after it, never ones the savepoint's alignment will process; the
consumer's barrier handler is consistent in either order, checked by
tests/unit/test_barriers.py, so the fence keeps the emission order rather
than being what consistency rests on, and it costs the unaligned barrier the
wait until the fence has left: docs/BENCHMARKS.md). A priority
event queued while a fence is in the lane waits right behind the newest
fence, after the priority events already waiting there, and overtakes only
the buffers queued after that fence; it moves to the priority lane when the
fence is sent, or handed back when the fence is lifted (`lift_fence`: its
checkpoint was aborted). Flink stops its priority events at nothing, having
no aligned checkpoint beside an unaligned one.

The consumer side is a `CreditLedger` per input gate: each channel owns
`exclusive` buffers, and the gate lends `floating` buffers to channels whose
sender reports a backlog (with each data buffer). A sender left without credit
cannot report one, so a floating buffer it frees stays with it unless another
channel wants it. The invariant, checked by the tests, is

    granted[ch] + held[ch] == exclusive + floating_held[ch]   for each channel
    sum(floating_held) + floating_free == floating

so the memory a receiver commits is fixed, whatever the interleaving.

A channel blocked by an aligned checkpoint (its barrier taken, the others
awaited) borrows no floating buffer however large its backlog: the task will
not read it before the alignment ends, and a floating buffer it held would be
one less for the channels the alignment is waiting on.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from netstack.errors import CloseReason, LocalProtocolError, RemoteProtocolError


@dataclass(frozen=True, slots=True)
class Buffer:
    """A network buffer: records packed back to back.

    `first_record_offset` is where the first record that starts in this
    buffer begins (-1 when the whole buffer continues an earlier record), so
    a reader can cut a buffer sequence at record boundaries.
    """

    data: bytes
    first_record_offset: int = 0
    # Producer side only, never sent: the whole record this buffer begins by
    # continuing (None when it begins at a record boundary). A checkpoint that
    # persists overtaken buffers uses it to store whole records.
    continued_record: bytes | None = None


@dataclass(frozen=True, slots=True)
class Event:
    """A control message travelling with the data (barrier, end of partition, ...).

    `body` is a msgpack-able dict; netstack does not interpret it.
    """

    body: dict[str, Any]


@dataclass(frozen=True, slots=True)
class SendData:
    seq: int
    buffer: Buffer
    backlog: int


@dataclass(frozen=True, slots=True)
class SendEvent:
    seq: int
    event: Event
    priority: bool


Outbound = SendData | SendEvent


@dataclass(slots=True)
class SenderStatistics:
    credit: int
    queued_buffers: int
    queued_events: int
    queued_priority: int
    sent_buffers: int


class ChannelSender:
    """Producer end of one logical channel: two lanes and a credit counter."""

    __slots__ = ("channel_id", "credit", "_lane", "_priority", "_fences", "_last_inband_seq", "queued_buffers",
                 "sent_buffers")

    def __init__(self, channel_id: int) -> None:
        self.channel_id = channel_id
        self.credit = 0
        self._lane: deque[Buffer | Event] = deque()
        self._priority: deque[Event] = deque()
        # the fences queued in the lane, oldest first, each with the priority events waiting right behind it
        self._fences: deque[tuple[Event, list[Event]]] = deque()
        self._last_inband_seq = 0
        self.queued_buffers = 0
        self.sent_buffers = 0

    def add_buffer(self, buffer: Buffer) -> None:
        self._lane.append(buffer)
        self.queued_buffers += 1

    def add_event(self, event: Event, *, fence: bool = False) -> None:
        """An in-band event: it keeps its place behind the queued buffers. A `fence` is not overtaken by priority
        events queued after it."""
        self._lane.append(event)
        if fence:
            self._fences.append((event, []))

    def add_priority_event(self, event: Event) -> list[Buffer]:
        """Queue `event` ahead of all data, or right behind the newest fence still queued; return the data
        buffers it overtakes, in order."""
        if not self._fences:
            self._priority.append(event)
            return [item for item in self._lane if isinstance(item, Buffer)]
        fence, waiting = self._fences[-1]
        waiting.append(event)
        overtaken: list[Buffer] = []
        for item in reversed(self._lane):  # the buffers after the fence: few, at the lane's end
            if item is fence:
                break
            if isinstance(item, Buffer):
                overtaken.append(item)
        overtaken.reverse()
        return overtaken

    def convert_to_priority(self, event: Event) -> list[Buffer] | None:
        """Move a queued in-band `event` to the priority lane (an aligned barrier that waited too long).

        Returns the data buffers it overtakes, or None when the event is no
        longer queued (already sent).
        """
        for index, item in enumerate(self._lane):
            if item is event:
                overtaken = [b for b in list(self._lane)[:index] if isinstance(b, Buffer)]
                del self._lane[index]
                self._priority.append(event)
                self._release_fence(event)
                return overtaken
        return None

    def lift_fence(self, event: Event) -> list[Event]:
        """`event` is no fence any more (its checkpoint was aborted): later priority events overtake it. Returns
        the priority events that waited behind it, removed: they overtook only the buffers after it, so they
        cannot be sent ahead of it now (their checkpoints must be given up)."""
        for index, (fence, waiting) in enumerate(self._fences):
            if fence is event:
                del self._fences[index]
                return waiting
        return []

    def _release_fence(self, event: Event) -> None:
        """`event` left the lane: if it was a fence, the priority events waiting behind it go next."""
        fences = self._fences
        for index, (fence, waiting) in enumerate(fences):
            if fence is event:
                del fences[index]
                self._priority.extend(waiting)
                return

    def bytes_before(self, event: Event) -> int | None:
        """The data bytes queued ahead of in-band `event`, or None when it is no longer queued."""
        total = 0
        for item in self._lane:
            if item is event:
                return total
            if isinstance(item, Buffer):
                total += len(item.data)
        return None

    def holds(self, event: Event) -> bool:
        """Is `event` still queued in the in-band lane?"""
        return any(item is event for item in self._lane)

    def add_credit(self, credits: int) -> None:
        if credits <= 0:
            raise RemoteProtocolError(f"non-positive credit {credits}", CloseReason.BAD_PAYLOAD)
        self.credit += credits

    def has_priority(self) -> bool:
        """Is a priority event queued? `pop_sendable` returns those before anything else."""
        return bool(self._priority)

    def has_sendable(self) -> bool:
        if self._priority:
            return True
        if not self._lane:
            return False
        return self.credit > 0 or not isinstance(self._lane[0], Buffer)

    def pop_sendable(self) -> Outbound | None:
        """The next item the link may send now, or None (empty, or data waiting for credit)."""
        if self._priority:
            # Carries the last in-band sequence number sent: the receiver then
            # knows exactly which of its buffers precede this event.
            return SendEvent(self._last_inband_seq, self._priority.popleft(), True)
        if not self._lane:
            return None
        head = self._lane[0]
        if isinstance(head, Buffer):
            if self.credit <= 0:
                return None
            self.credit -= 1
            self.queued_buffers -= 1
            self.sent_buffers += 1
        self._lane.popleft()
        self._last_inband_seq += 1
        if isinstance(head, Buffer):
            return SendData(self._last_inband_seq, head, self.queued_buffers)
        if self._fences and self._fences[0][0] is head:
            self._priority.extend(self._fences.popleft()[1])  # sent right after it, with its seq
        return SendEvent(self._last_inband_seq, head, False)

    def statistics(self) -> SenderStatistics:
        return SenderStatistics(
            credit=self.credit,
            queued_buffers=self.queued_buffers,
            queued_events=len(self._lane) - self.queued_buffers,
            queued_priority=len(self._priority) + sum(len(waiting) for _, waiting in self._fences),
            sent_buffers=self.sent_buffers,
        )


@dataclass(slots=True)
class _ChannelCredit:
    granted: int = 0  # credits announced (or to be announced) and not yet used
    held: int = 0  # buffers received and not yet consumed by the task
    floating_held: int = 0
    backlog: int = 0
    expected_seq: int = 1
    unannounced: int = 0  # part of `granted` the sender has not been told yet


@dataclass(slots=True)
class LedgerStatistics:
    granted: int
    held: int
    floating_free: int
    floating_lent: int


@dataclass(slots=True)
class CreditLedger:
    """Consumer-side credit accounting for one input gate (many channels)."""

    channel_ids: list[int]
    exclusive: int = 2
    floating: int = 8
    _channels: dict[int, _ChannelCredit] = field(init=False)
    floating_free: int = field(init=False)
    blocked: set[int] = field(init=False, default_factory=set)  # channels that lend no floating buffer now
    lent: bool = field(init=False, default=False)  # floating credit lent since the last take_announcements

    def __post_init__(self) -> None:
        if self.exclusive < 1:
            raise LocalProtocolError("each channel needs at least one exclusive buffer, or it can deadlock")
        self._channels = {
            ch: _ChannelCredit(granted=self.exclusive, unannounced=self.exclusive) for ch in self.channel_ids
        }
        self.floating_free = self.floating

    def knows(self, channel_id: int) -> bool:
        return channel_id in self._channels

    def _get(self, channel_id: int) -> _ChannelCredit:
        try:
            return self._channels[channel_id]
        except KeyError:
            raise RemoteProtocolError(f"frame for unknown channel {channel_id}", CloseReason.UNKNOWN_CHANNEL) from None

    def _check_seq(self, ch: _ChannelCredit, channel_id: int, seq: int) -> None:
        if seq != ch.expected_seq:
            raise RemoteProtocolError(
                f"channel {channel_id}: sequence {seq}, expected {ch.expected_seq}", CloseReason.BAD_SEQUENCE
            )
        ch.expected_seq += 1

    def on_data(self, channel_id: int, seq: int, backlog: int) -> None:
        """A data buffer arrived: it must be covered by a credit."""
        ch = self._get(channel_id)
        if ch.granted - ch.unannounced <= 0:
            raise RemoteProtocolError(f"channel {channel_id}: data buffer without credit", CloseReason.NO_CREDIT)
        self._check_seq(ch, channel_id, seq)
        ch.granted -= 1
        ch.held += 1
        ch.backlog = backlog
        self._lend_floating()

    def on_event(self, channel_id: int, seq: int, priority: bool) -> None:
        ch = self._get(channel_id)
        if priority:
            if seq >= ch.expected_seq:
                raise RemoteProtocolError(
                    f"channel {channel_id}: priority event after seq {seq}, only {ch.expected_seq - 1} received",
                    CloseReason.BAD_SEQUENCE,
                )
        else:
            self._check_seq(ch, channel_id, seq)

    def on_consumed(self, channel_id: int) -> None:
        """The task finished with one buffer of `channel_id`: its memory is free again."""
        ch = self._channels[channel_id]
        if ch.held <= 0:
            raise LocalProtocolError(f"channel {channel_id}: consumed more buffers than received")
        ch.held -= 1
        if ch.floating_held > 0 and ch.granted >= ch.backlog:
            ch.floating_held -= 1
            self.floating_free += 1
            self._lend_floating()
            if ch.granted == 0 and self.floating_free and channel_id not in self.blocked:
                # Nobody else wants it, and this sender has no credit left: then it cannot tell us about data
                # it queued since its last buffer (whose backlog said 0 because credit covered its queue), and
                # would wait, with a buffer free here, until an exclusive one frees, then send in a burst.
                self.floating_free -= 1
                ch.floating_held += 1
                ch.granted += 1
                ch.unannounced += 1
        else:
            ch.granted += 1
            ch.unannounced += 1

    def block(self, channel_id: int) -> None:
        """An aligned checkpoint stopped reading `channel_id`: lend it no floating buffer until unblocked.

        Floating credit it holds but has not announced yet goes back to the pool (announced credit is the
        sender's and cannot be recalled).
        """
        ch = self._get(channel_id)
        self.blocked.add(channel_id)
        reclaim = min(ch.floating_held, ch.unannounced)
        if reclaim:
            ch.floating_held -= reclaim
            ch.granted -= reclaim
            ch.unannounced -= reclaim
            self.floating_free += reclaim
            self._lend_floating()

    def unblock_all(self, keep: frozenset[int] = frozenset()) -> None:
        """The alignment ended: blocked channels but `keep` may borrow again (announce what `take_announcements`
        returns)."""
        self.blocked.intersection_update(keep)
        self._lend_floating()

    def _lend_floating(self) -> None:
        if not self.floating_free:
            return
        blocked = self.blocked
        for cid, ch in self._channels.items():
            if cid in blocked:
                continue
            while self.floating_free and ch.backlog > ch.granted:
                self.floating_free -= 1
                ch.floating_held += 1
                ch.granted += 1
                ch.unannounced += 1
                self.lent = True

    def take_announcements(self) -> dict[int, int]:
        """Credits to send to the producers now, by channel; clears them."""
        self.lent = False
        out = {}
        for cid, ch in self._channels.items():
            if ch.unannounced:
                out[cid] = ch.unannounced
                ch.unannounced = 0
        return out

    def check_invariant(self) -> None:
        for cid, ch in self._channels.items():
            if ch.granted + ch.held != self.exclusive + ch.floating_held:
                raise AssertionError(f"channel {cid}: {ch} breaks the buffer budget")
        lent = sum(ch.floating_held for ch in self._channels.values())
        if lent + self.floating_free != self.floating:
            raise AssertionError(f"floating buffers: {lent} lent + {self.floating_free} free != {self.floating}")

    def statistics(self) -> LedgerStatistics:
        return LedgerStatistics(
            granted=sum(c.granted for c in self._channels.values()),
            held=sum(c.held for c in self._channels.values()),
            floating_free=self.floating_free,
            floating_lent=self.floating - self.floating_free,
        )
