"""Barrier handling for one task, as a pure state machine (no I/O, no clock: `now` is passed in).

The task feeds it what happens to barriers of its input channels and gets
back a list of actions to carry out:

- aligned: a barrier taken from channel c blocks c; when every open channel
  has delivered the barrier, snapshot, forward the barrier in-band, unblock.
- unaligned: the first barrier (it arrives on the priority lane) triggers the
  snapshot at once; the barrier is forwarded on the priority lane, and the
  gate records, for every channel that has not delivered it yet, the buffers
  that precede it. Nothing is blocked. The inputs are complete when every
  channel has delivered it.
- aligned_timeout: starts aligned; at the deadline (checkpoint start plus the
  timeout) it switches to unaligned for whatever is still missing. A barrier
  that arrives on the priority lane (its sender switched already) switches
  too.
- at_least_once: nothing is blocked, nothing recorded; snapshot when every
  channel has delivered the barrier.

Ended channels count as having delivered every later barrier. A channel whose
end of partition has reached the gate but waits there behind data (its
producer finished while this task was backpressured) counts too, once a
checkpoint is unaligned: the data before the end is recorded as channel state,
as for a queued barrier (Flink's FLIP-147). An aligned checkpoint still waits
until the end is taken, since its snapshot must follow that data.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from runtime.graph.enums import CheckpointMode


@dataclass(frozen=True)
class BarrierSpec:
    """What a barrier carries: which checkpoint, how to take it, and when it started."""

    checkpoint_id: int
    mode: str
    started_at: float  # coordinator wall clock at trigger
    deadline: float | None = None  # aligned_timeout: when to switch to unaligned
    savepoint: bool = False
    directory: str = ""

    def to_body(self) -> dict[str, Any]:
        return {"t": "barrier", "id": self.checkpoint_id, "mode": self.mode, "start": self.started_at,
                "deadline": self.deadline, "sp": self.savepoint, "dir": self.directory}

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> BarrierSpec:
        return cls(int(body["id"]), str(body["mode"]), float(body["start"]),
                   None if body.get("deadline") is None else float(body["deadline"]), bool(body.get("sp")),
                   str(body.get("dir", "")))


@dataclass(frozen=True)
class Block:
    channel_id: int


@dataclass(frozen=True)
class UnblockAll:
    pass


@dataclass(frozen=True)
class Snapshot:
    """Snapshot operator state and forward the barrier: on the priority lane if `unaligned`."""

    spec: BarrierSpec
    unaligned: bool


@dataclass(frozen=True)
class InputsComplete:
    """Every input channel delivered the barrier: the input side of the checkpoint is done."""

    spec: BarrierSpec
    unaligned: bool


@dataclass(frozen=True)
class Abandon:
    """A newer barrier arrived before this checkpoint finished here: give it up."""

    checkpoint_id: int


Action = Block | UnblockAll | Snapshot | InputsComplete | Abandon


@dataclass
class _Pending:
    spec: BarrierSpec
    first_barrier_at: float
    seen: set[int] = field(default_factory=set)
    early: set[int] = field(default_factory=set)  # counted while their in-band barrier still waits in the gate
    snapshotted: bool = False
    unaligned: bool = False


class BarrierHandler:
    def __init__(self, channel_ids: list[int]) -> None:
        self.channels = frozenset(channel_ids)
        self.ended: set[int] = set()
        self.pending: _Pending | None = None
        self.last_finished = 0  # highest checkpoint id completed or abandoned here
        self.queued: dict[int, int] = {}  # channel -> id of an in-band barrier in the gate, not yet taken
        self.end_queued: set[int] = set()  # channels whose end of partition is in the gate, not yet taken

    @property
    def blocking(self) -> bool:
        p = self.pending
        return p is not None and not p.snapshotted

    def on_barrier(self, channel_id: int, spec: BarrierSpec, *, priority: bool, now: float) -> list[Action]:
        if channel_id not in self.channels:
            raise ValueError(f"barrier {spec.checkpoint_id} on channel {channel_id}, not an input of this task")
        if not priority:
            self.queued.pop(channel_id, None)
        if spec.checkpoint_id <= self.last_finished:
            return []  # a late barrier of a checkpoint this task already finished or gave up
        actions: list[Action] = []
        p = self.pending
        if p is not None and not priority and channel_id in p.early and spec.checkpoint_id == p.spec.checkpoint_id:
            p.early.discard(channel_id)  # counted when it reached the gate, after the switch to unaligned
            return []
        if p is not None and spec.checkpoint_id > p.spec.checkpoint_id:
            actions += self._abandon(p)
            p = None
        if p is None:
            p = self.pending = _Pending(spec, now)
        if channel_id in p.seen:
            raise ValueError(f"barrier {spec.checkpoint_id} twice on channel {channel_id}")
        p.seen.add(channel_id)
        mode = p.spec.mode
        if mode == CheckpointMode.AT_LEAST_ONCE:
            pass
        elif mode == CheckpointMode.UNALIGNED or priority or p.unaligned:
            if not p.snapshotted:
                actions += self._go_unaligned(p)
        elif not p.snapshotted:
            actions.append(Block(channel_id))
        return actions + self._check_complete(p)

    def on_arrival(self, channel_id: int, spec: BarrierSpec) -> list[Action]:
        """An in-band barrier reached the gate and waits there behind data.

        Once the checkpoint is unaligned, the data before it is recorded as
        channel state, so the channel counts as delivered now rather than when
        the barrier is taken, seconds later under backpressure.
        """
        if channel_id not in self.channels or spec.checkpoint_id <= self.last_finished:
            return []
        self.queued[channel_id] = spec.checkpoint_id
        p = self.pending
        if p is None or not p.unaligned or p.spec.checkpoint_id != spec.checkpoint_id or channel_id in p.seen:
            return []
        p.seen.add(channel_id)
        p.early.add(channel_id)
        return self._check_complete(p)

    def on_end_arrival(self, channel_id: int) -> list[Action]:
        """Channel `channel_id`'s end of partition reached the gate: no barrier will follow on it.

        An unaligned checkpoint records the data queued before the end and
        counts the channel as delivered now, not when the end is taken.
        """
        if channel_id not in self.channels:
            raise ValueError(f"end of partition on channel {channel_id}, not an input of this task")
        self.end_queued.add(channel_id)
        p = self.pending
        if p is None or not p.unaligned or channel_id in p.seen:
            return []
        p.seen.add(channel_id)
        return self._check_complete(p)

    def on_channel_ended(self, channel_id: int) -> list[Action]:
        self.ended.add(channel_id)
        self.end_queued.discard(channel_id)
        p = self.pending
        return self._check_complete(p) if p is not None else []

    def on_time(self, now: float, spec: BarrierSpec) -> list[Action]:
        """Switch checkpoint `spec` to unaligned once its deadline has passed.

        This also applies when none of its barriers has been taken yet: under
        backpressure they can sit in the input queues behind data, which is
        exactly when the switch matters.
        """
        if spec.mode != CheckpointMode.ALIGNED_TIMEOUT or spec.deadline is None or now < spec.deadline:
            return []
        if spec.checkpoint_id <= self.last_finished:
            return []
        actions: list[Action] = []
        p = self.pending
        if p is not None and spec.checkpoint_id > p.spec.checkpoint_id:
            actions += self._abandon(p)
            p = None
        if p is None:
            p = self.pending = _Pending(spec, now)
        if p.snapshotted:
            return actions
        return actions + self._go_unaligned(p) + self._check_complete(p)

    def abort(self, checkpoint_id: int) -> list[Action]:
        """The coordinator aborted `checkpoint_id`: stop aligning for it."""
        p = self.pending
        if p is None or p.spec.checkpoint_id != checkpoint_id:
            self.last_finished = max(self.last_finished, checkpoint_id)
            return []
        return self._abandon(p)

    def _go_unaligned(self, p: _Pending) -> list[Action]:
        p.unaligned = True
        p.snapshotted = True
        # barriers already in the gate: the snapshot records the data before them, so they count as delivered
        for channel_id, checkpoint_id in self.queued.items():
            if checkpoint_id == p.spec.checkpoint_id and channel_id not in p.seen:
                p.seen.add(channel_id)
                p.early.add(channel_id)
        p.seen |= self.end_queued  # ends already in the gate: the data before them is recorded too
        return [Snapshot(p.spec, unaligned=True), UnblockAll()]

    def _abandon(self, p: _Pending) -> list[Action]:
        self.pending = None
        self.last_finished = max(self.last_finished, p.spec.checkpoint_id)
        return [Abandon(p.spec.checkpoint_id), UnblockAll()]

    def _check_complete(self, p: _Pending) -> list[Action]:
        if not (self.channels - self.ended) <= p.seen:
            return []
        actions: list[Action] = []
        if not p.snapshotted:
            p.snapshotted = True
            actions += [Snapshot(p.spec, unaligned=False), UnblockAll()]
        actions.append(InputsComplete(p.spec, p.unaligned))
        self.pending = None
        self.last_finished = p.spec.checkpoint_id
        return actions
