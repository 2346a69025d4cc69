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
- aligned with per-channel switching (`BarrierSpec.switching`: a channel
  timeout and/or a channel byte threshold): aligned, except that a channel
  whose barrier waits in the gate behind data is released from the alignment
  when it has waited `channel_timeout_s` there or the data ahead of it exceeds
  `channel_inflight_bytes` (seed 000: "barrier overtakes buffers if not
  flushed within 10 ms"). That data becomes input channel state; the other
  channels stay aligned, and the snapshot is taken once every channel is
  either aligned or switched. A barrier that arrives on the priority lane (its
  sender switched that channel at its output) switches its channel: the
  channel is blocked and what the gate holds before the barrier is recorded.
  The task's persisted in-flight bytes per checkpoint are capped
  (`max_inflight_bytes`, `InflightBudget`): a switch that does not fit stays
  aligned, so a checkpoint's channel state is bounded and its alignment is
  bounded by the in-flight bound of the channels that stayed aligned.

Concurrent checkpoints: a barrier of a newer checkpoint that arrives while
an unaligned one is still recording here (its snapshot is taken, some of its
barriers are missing) is held back: its channel is blocked, and the barrier
is handled as soon as the older checkpoint's inputs are complete, which for
unaligned barriers (on the priority lane) is soon. The older one then goes on
persisting while the newer one is taken (TaskCheckpointer keeps a run per
checkpoint). A newer barrier abandons an aligned checkpoint that is aligning
(it is subsumed, as in Flink), with one exception:

An unaligned barrier that reaches a task aligning a savepoint (always
aligned: `overtaken`) does not abandon it: the unaligned checkpoint is
taken at once beside it. Its snapshot is the task's state now, which holds
exactly the data before the savepoint's barrier on the channels that
delivered it (they are blocked, nothing after that barrier was processed)
and what was processed so far on the others; its channel state is what the
gate holds or still receives before the unaligned barrier on every channel,
which on a blocked channel is the data after the savepoint's barrier. That
is the Chandy-Lamport cut of seed 000 (no alignment, "only (async) logging
for in-flight records between the time the first barrier is processed until
the last barrier arrives", replayed first on restore: DESIGN.md section 6's
restore order); which other checkpoint keeps a channel blocked does not
enter into it, as long as nothing after the unaligned barrier is processed
before its snapshot. The savepoint's channels stay blocked (every unblock
keeps them: `UnblockAll.keep`), its barriers keep coming in-band, and it
snapshots when they are all in, after the unaligned one. Each snapshot is a
consistent cut on its own and processing order is unchanged. A savepoint
whose first barrier comes only after a newer unaligned checkpoint was taken
or finished here (its barriers are in-band, behind the data the unaligned
one overtook upstream) aligns beside it the same way, and is not late.

Holding the unaligned barrier until the savepoint has aligned here would be
consistent too, if every task did it (the sender stops a priority barrier
behind a savepoint's barrier still queued, netstack/credit.py, so it would
trail the savepoint in every channel), but the unaligned checkpoint would
then end after the savepoint, as if paused behind it: that is what periodic
checkpoints must not do. Taking it at once means a task snapshots the two
out of id order, which the sinks' pre-commits must not follow (seed 000:
aligned savepoints stay because of transactional sink commits):
TaskCheckpointer labels the savepoint's pre-commit with an id the
coordinator keeps free (coordinator/checkpointing.py).

Ended channels count as having delivered every later barrier. A channel whose
end of partition has reached the gate but waits there behind data (its
producer finished while this task was backpressured) counts too, once a
checkpoint is unaligned: the data before the end is recorded as channel state,
as for a queued barrier (Flink's FLIP-147). An aligned checkpoint still waits
until the end is taken, since its snapshot must follow that data. Once every
input's end has reached the gate no barrier can come at all: the worker
triggers the task directly (`on_trigger`), and an unaligned checkpoint is
taken at once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from runtime.graph.checkpoint_options import CheckpointOptions
from runtime.graph.enums import CheckpointMode


@dataclass(frozen=True)
class BarrierSpec:
    """What a barrier carries: which checkpoint, when it started, where it goes and how to take it."""

    checkpoint_id: int
    started_at: float  # coordinator wall clock at trigger
    options: CheckpointOptions = CheckpointOptions()
    directory: str = ""

    # the options' fields, read by name where barriers are handled
    @property
    def mode(self) -> CheckpointMode:
        return self.options.mode

    @property
    def savepoint(self) -> bool:
        return self.options.savepoint

    @property
    def channel_timeout_s(self) -> float | None:
        return self.options.channel_timeout_s

    @property
    def channel_inflight_bytes(self) -> int | None:
        return self.options.channel_inflight_bytes

    @property
    def max_inflight_bytes(self) -> int | None:
        return self.options.max_inflight_bytes

    @property
    def deadline(self) -> float | None:
        """aligned_timeout: when the task switches to unaligned (wall clock)."""
        timeout_s = self.options.aligned_timeout_s
        if self.options.mode != CheckpointMode.ALIGNED_TIMEOUT or timeout_s is None:
            return None
        return self.started_at + timeout_s

    @cached_property
    def switching(self) -> bool:
        """Whether channels of this (aligned) checkpoint switch to unaligned one by one (asked on each of its
        barriers: computed once per spec)."""
        return self.options.switching

    def channel_due(self, waited_s: float, bytes_ahead: int) -> bool:
        """Whether a barrier that has waited `waited_s` behind `bytes_ahead` bytes should overtake them."""
        if not self.switching or bytes_ahead <= 0:
            return False
        return ((self.channel_inflight_bytes is not None and bytes_ahead > self.channel_inflight_bytes)
                or (self.channel_timeout_s is not None and waited_s >= self.channel_timeout_s))

    def to_body(self) -> dict[str, Any]:
        return {"t": "barrier", "id": self.checkpoint_id, "start": self.started_at, "dir": self.directory,
                "options": self.options.to_wire()}

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> BarrierSpec:
        return cls(int(body["id"]), float(body["start"]), CheckpointOptions.from_wire(body["options"]),
                   str(body.get("dir", "")))


class InflightBudget:
    """One task's persisted in-flight bytes per checkpoint, against the checkpoint's cap.

    Shared by the input side (BarrierHandler's channel switches) and the output
    side (TaskCheckpointer's promoted barriers) of the same task. `charge`
    refuses what would exceed the cap; `force` counts what cannot be refused
    (what the gate holds before a barrier that arrived on the priority lane).
    """

    KEEP = 8  # checkpoints remembered (concurrent checkpoints each have their own account)

    def __init__(self) -> None:
        self.used: dict[int, int] = {}
        self.channels: dict[int, int] = {}  # checkpoint id -> channels switched for it (the ack reports it)
        # over the task's life, monotonic (exported as counters, runtime/worker/metrics.py): captures refused by
        # the cap, and channels switched to unaligned on the input and output side (a refund, a switched channel
        # found aligned after all, is taken off the checkpoint's count in `channels`, not off this one)
        self.refused = 0
        self.switched = 0

    def charge(self, spec: BarrierSpec, nbytes: int) -> bool:
        used = self.used.get(spec.checkpoint_id, 0)
        if spec.max_inflight_bytes is not None and used + nbytes > spec.max_inflight_bytes:
            self.refused += 1
            return False
        self.force(spec, nbytes)
        return True

    def force(self, spec: BarrierSpec, nbytes: int) -> None:
        self.used[spec.checkpoint_id] = self.used.get(spec.checkpoint_id, 0) + nbytes
        self.channels[spec.checkpoint_id] = self.channels.get(spec.checkpoint_id, 0) + 1
        self.switched += 1
        while len(self.used) > self.KEEP:
            oldest = min(self.used)
            del self.used[oldest]
            self.channels.pop(oldest, None)

    def refund(self, spec: BarrierSpec, nbytes: int) -> None:
        if spec.checkpoint_id in self.used:
            self.used[spec.checkpoint_id] = max(0, self.used[spec.checkpoint_id] - nbytes)
            self.channels[spec.checkpoint_id] = max(0, self.channels.get(spec.checkpoint_id, 0) - 1)


@dataclass(frozen=True)
class Block:
    channel_id: int


@dataclass(frozen=True)
class UnblockAll:
    """Unblock every channel but `keep` (the channels of a savepoint still aligning beside a newer unaligned
    checkpoint, and those of barriers held back)."""

    keep: frozenset[int] = frozenset()


@dataclass(frozen=True)
class Snapshot:
    """Snapshot operator state and forward the barrier: on the priority lane if `unaligned`.

    `record_inputs`: some channels switched (an aligned checkpoint with
    per-channel switching): record what the gate holds before their barriers,
    though the outputs stay aligned.
    """

    spec: BarrierSpec
    unaligned: bool
    record_inputs: bool = False


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
    switched: dict[int, int] = field(default_factory=dict)  # channel -> bytes charged when it switched


KEEP_IDS = 64  # checkpoint ids remembered as begun here or aborted (a few are ever in flight)


def _remember(ids: set[int], checkpoint_id: int) -> None:
    ids.add(checkpoint_id)
    if len(ids) > KEEP_IDS:
        ids.discard(min(ids))


class BarrierHandler:
    def __init__(self, channel_ids: list[int], *, budget: InflightBudget | None = None) -> None:
        self.channels = frozenset(channel_ids)
        self.budget = budget if budget is not None else InflightBudget()
        # channel -> (when its in-band barrier reached the gate, bytes queued ahead of it): for switching
        self.arrived: dict[int, tuple[float, int]] = {}
        self.ended: set[int] = set()
        self.pending: _Pending | None = None
        self.last_finished = 0  # highest checkpoint id completed or abandoned here
        self.queued: dict[int, int] = {}  # channel -> id of an in-band barrier in the gate, not yet taken
        self.end_queued: set[int] = set()  # channels whose end of partition is in the gate, not yet taken
        # barriers of newer checkpoints held back while an unaligned one records: (channel, spec, priority, bytes)
        self.deferred: list[tuple[int, BarrierSpec, bool, int]] = []
        self.aborted: set[int] = set()  # checkpoints aborted before this task finished them: barriers ignored
        # a savepoint still aligning here beside a newer unaligned checkpoint: its blocked
        # channels are those in its `seen`
        self.overtaken: _Pending | None = None
        self.begun: set[int] = set()  # checkpoints that had a pending here (recent ones)
        self.newest_aligned = 0  # the newest checkpoint begun here that was not unaligned

    @property
    def blocking(self) -> bool:
        p = self.pending
        return p is not None and not p.snapshotted

    def on_barrier(self, channel_id: int, spec: BarrierSpec, *, priority: bool, now: float,
                   queued_bytes: int = 0) -> list[Action]:
        """Barrier `spec` taken from channel `channel_id` (in-band), or arrived on its priority lane.

        `queued_bytes`: what the gate holds on that channel (the data before a
        priority barrier), charged to the budget when a switching checkpoint
        records it.
        """
        if channel_id not in self.channels:
            raise ValueError(f"barrier {spec.checkpoint_id} on channel {channel_id}, not an input of this task")
        if not priority:
            self.queued.pop(channel_id, None)
            self.arrived.pop(channel_id, None)
        if self._late(spec):
            return []  # a late barrier of a checkpoint this task already finished or gave up
        o = self.overtaken
        if o is not None and spec.checkpoint_id == o.spec.checkpoint_id:
            return self._overtaken_barrier(o, channel_id)
        actions: list[Action] = []
        p = self.pending
        if p is not None and spec.checkpoint_id < p.spec.checkpoint_id:
            # the first barrier of a savepoint after a newer unaligned checkpoint was taken here (`_late` let it by)
            if o is not None or not (p.snapshotted and p.unaligned) or not spec.savepoint:
                return []
            self.overtaken = o = self._begin(spec, now)
            return self._overtaken_barrier(o, channel_id)
        if p is None and self.last_finished > spec.checkpoint_id:  # the same, the newer one finished here
            if o is not None or not spec.savepoint:
                return []
            self.overtaken = o = self._begin(spec, now)
            return self._overtaken_barrier(o, channel_id)
        if p is not None and not priority and channel_id in p.early and spec.checkpoint_id == p.spec.checkpoint_id:
            p.early.discard(channel_id)  # counted when it reached the gate, after the switch to unaligned
            if p.snapshotted:
                return []
            # a switched channel whose data was all processed before the snapshot: aligned after all
            self.budget.refund(p.spec, p.switched.pop(channel_id, 0))
            return [Block(channel_id)]
        if p is not None and spec.checkpoint_id > p.spec.checkpoint_id:
            if p.snapshotted and p.unaligned:  # concurrent: wait until the older one's inputs are complete
                self.deferred.append((channel_id, spec, priority, queued_bytes))
                return [Block(channel_id)]
            if self._may_overtake(p, spec):
                self.overtaken = p  # it goes on aligning; this one is taken beside it (module docstring)
            else:
                actions += self._abandon(p)
            p = None
        if p is None:
            p = self.pending = self._begin(spec, now)
        if channel_id in p.seen:
            raise ValueError(f"barrier {spec.checkpoint_id} twice on channel {channel_id}")
        p.seen.add(channel_id)
        mode = p.spec.mode
        if mode == CheckpointMode.AT_LEAST_ONCE:
            pass
        elif p.spec.switching and not p.snapshotted:
            if priority:  # its sender switched the channel: record what the gate holds before the barrier
                self.budget.force(p.spec, queued_bytes)
                p.switched[channel_id] = queued_bytes
            actions.append(Block(channel_id))
        elif mode == CheckpointMode.UNALIGNED or priority or p.unaligned:
            if not p.snapshotted:
                actions += self._go_unaligned(p)
        elif not p.snapshotted:
            actions.append(Block(channel_id))
        return actions + self._check_complete(p)

    def on_arrival(self, channel_id: int, spec: BarrierSpec, *, now: float = 0.0,
                   bytes_ahead: int = 0) -> list[Action]:
        """An in-band barrier reached the gate (at `now`) and waits there behind `bytes_ahead` bytes of data.

        Once the checkpoint is unaligned, the data before it is recorded as
        channel state, so the channel counts as delivered now rather than when
        the barrier is taken, seconds later under backpressure. With
        per-channel switching, the channel switches now if the data ahead is
        over the threshold (later, at its timeout: `on_time`).
        """
        if channel_id not in self.channels or self.gave_up(spec.checkpoint_id):
            return []
        self.queued[channel_id] = spec.checkpoint_id
        if spec.switching:
            self.arrived[channel_id] = (now, bytes_ahead)
            return self._switch_due(spec, now)
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

    @property
    def inputs_ended(self) -> bool:
        """Every input channel's end of partition has reached the gate (taken or still queued behind data):
        no barrier can reach this task any more, so a checkpoint must be triggered here directly."""
        return self.channels <= self.ended | self.end_queued

    def on_trigger(self, spec: BarrierSpec, *, now: float) -> list[Action]:
        """Checkpoint `spec` triggered at this task directly, as at a source (FLIP-147's tasks whose inputs all
        ended). Only a task whose every input ended acts on it: no barrier will come, so an unaligned
        checkpoint is taken now, recording the data still queued before the ends as channel state, instead of
        when the task has taken that backlog and reached its own end of input, seconds later under
        backpressure. An aligned one still waits for the end of input (its snapshot follows the data)."""
        if not self.inputs_ended or spec.mode != CheckpointMode.UNALIGNED:
            return []
        if spec.checkpoint_id <= self.last_finished or spec.checkpoint_id in self.aborted:
            return []
        if self.pending is not None:
            return []  # one in progress completes by the ends it counts (on_end_arrival, on_channel_ended)
        p = self.pending = self._begin(spec, now)
        return self._go_unaligned(p) + self._check_complete(p)

    def on_channel_ended(self, channel_id: int) -> list[Action]:
        self.ended.add(channel_id)
        self.end_queued.discard(channel_id)
        actions = self._check_overtaken() if self.overtaken is not None else []
        p = self.pending
        return actions + (self._check_complete(p) if p is not None else [])

    def on_time(self, now: float, spec: BarrierSpec) -> list[Action]:
        """Switch checkpoint `spec` to unaligned once its deadline has passed.

        This also applies when none of its barriers has been taken yet: under
        backpressure they can sit in the input queues behind data, which is
        exactly when the switch matters.
        """
        if spec.switching:
            return self._switch_due(spec, now)
        if spec.mode != CheckpointMode.ALIGNED_TIMEOUT or spec.deadline is None or now < spec.deadline:
            return []
        if self.gave_up(spec.checkpoint_id):
            return []
        actions: list[Action] = []
        p = self.pending
        if p is not None and spec.checkpoint_id > p.spec.checkpoint_id:
            if p.snapshotted and p.unaligned:
                return []  # concurrent: the older one records; this one's barriers wait for it (on_barrier)
            actions += self._abandon(p)
            p = None
        if p is None:
            p = self.pending = self._begin(spec, now)
        if p.snapshotted:
            return actions
        return actions + self._go_unaligned(p) + self._check_complete(p)

    def abort(self, checkpoint_id: int) -> list[Action]:
        """The coordinator aborted `checkpoint_id`: stop aligning for it."""
        o = self.overtaken
        if o is not None and o.spec.checkpoint_id == checkpoint_id:  # a savepoint aligning beside a newer one
            self.overtaken = None
            _remember(self.aborted, checkpoint_id)
            return [Abandon(checkpoint_id), self._unblock()]
        p = self.pending
        if p is None or p.spec.checkpoint_id < checkpoint_id:
            # its barriers are ignored when they come; not `last_finished`, which would make the barriers of an
            # older checkpoint still on their way late too (a savepoint aborted beside a periodic checkpoint)
            if checkpoint_id > self.last_finished:
                _remember(self.aborted, checkpoint_id)
            return []
        if p.spec.checkpoint_id != checkpoint_id:
            self.last_finished = max(self.last_finished, checkpoint_id)
            _remember(self.aborted, checkpoint_id)  # older than the pending one: a savepoint's barriers may be late
            return []
        return self._abandon(p)

    def gave_up(self, checkpoint_id: int) -> bool:
        """Whether this task finished or gave up checkpoint `checkpoint_id` (completed, abandoned or aborted)."""
        o = self.overtaken
        if o is not None and o.spec.checkpoint_id == checkpoint_id:
            return False
        return checkpoint_id <= self.last_finished or checkpoint_id in self.aborted

    def _late(self, spec: BarrierSpec) -> bool:
        """A barrier of a checkpoint this task finished or gave up. A savepoint older than one finished here is
        not late if it never began here: a newer unaligned checkpoint overtook its barriers (module docstring)."""
        n = spec.checkpoint_id
        if not self.gave_up(n):
            return False
        # a newer aligned one came in-band behind its barrier: that one is late whatever it was
        overtaken = n > self.newest_aligned and spec.savepoint
        return n in self.aborted or n in self.begun or not overtaken

    def _begin(self, spec: BarrierSpec, now: float) -> _Pending:
        _remember(self.begun, spec.checkpoint_id)
        if spec.mode != CheckpointMode.UNALIGNED:
            self.newest_aligned = max(self.newest_aligned, spec.checkpoint_id)
        return _Pending(spec, now)

    def _may_overtake(self, p: _Pending, spec: BarrierSpec) -> bool:
        """Whether unaligned `spec` is taken beside the aligning `p` instead of abandoning it."""
        return (self.overtaken is None and not p.snapshotted and p.spec.savepoint
                and spec.mode == CheckpointMode.UNALIGNED)

    def _overtaken_barrier(self, o: _Pending, channel_id: int) -> list[Action]:
        """The savepoint aligning beside a newer unaligned checkpoint got its barrier from `channel_id`."""
        if channel_id in o.seen:
            raise ValueError(f"barrier {o.spec.checkpoint_id} twice on channel {channel_id}")
        o.seen.add(channel_id)
        return [Block(channel_id), *self._check_overtaken()]

    def _check_overtaken(self) -> list[Action]:
        o = self.overtaken
        assert o is not None
        if not (self.channels - self.ended) <= o.seen:
            return []
        self.overtaken = None
        o.snapshotted = True
        self.last_finished = max(self.last_finished, o.spec.checkpoint_id)
        return [Snapshot(o.spec, unaligned=False), self._unblock(), InputsComplete(o.spec, False)]

    def _unblock(self) -> UnblockAll:
        """Unblock what no checkpoint holds: the overtaken savepoint's channels and held-back barriers' stay."""
        keep = {channel_id for channel_id, _, _, _ in self.deferred}
        if self.overtaken is not None:
            keep |= self.overtaken.seen
        return UnblockAll(frozenset(keep))

    def _switch_due(self, spec: BarrierSpec, now: float) -> list[Action]:
        """Switch every channel of `spec` whose barrier waits in the gate and is due (time or bytes), while the
        budget lasts; then snapshot if nothing else is missing."""
        if self.gave_up(spec.checkpoint_id):
            return []
        p = self.pending
        if p is not None and (p.spec.checkpoint_id != spec.checkpoint_id or p.snapshotted):
            return []  # another checkpoint is aligning: this one's barriers are handled when taken
        for channel_id, checkpoint_id in sorted(self.queued.items()):
            if checkpoint_id != spec.checkpoint_id or (p is not None and channel_id in p.seen):
                continue
            arrived_at, nbytes = self.arrived.get(channel_id, (now, 0))
            # a channel the cap refused stays aligned; it is asked again at its next timer
            if not spec.channel_due(now - arrived_at, nbytes) or not self.budget.charge(spec, nbytes):
                continue
            if p is None:
                p = self.pending = self._begin(spec, now)
            p.seen.add(channel_id)
            p.early.add(channel_id)  # its in-band barrier is taken later: it counts now
            p.switched[channel_id] = nbytes
        return self._check_complete(p) if p is not None else []

    def _go_unaligned(self, p: _Pending) -> list[Action]:
        p.unaligned = True
        p.snapshotted = True
        # barriers already in the gate: the snapshot records the data before them, so they count as delivered
        for channel_id, checkpoint_id in self.queued.items():
            if checkpoint_id == p.spec.checkpoint_id and channel_id not in p.seen:
                p.seen.add(channel_id)
                p.early.add(channel_id)
        p.seen |= self.end_queued  # ends already in the gate: the data before them is recorded too
        return [Snapshot(p.spec, unaligned=True), self._unblock()]

    def _abandon(self, p: _Pending) -> list[Action]:
        self.pending = None
        self.last_finished = max(self.last_finished, p.spec.checkpoint_id)
        replay = self._replay_deferred(p.spec.checkpoint_id)
        return [Abandon(p.spec.checkpoint_id), *(replay or [self._unblock()])]

    def _replay_deferred(self, ended_id: int) -> list[Action]:
        """Handle the barriers held back while checkpoint `ended_id` recorded, in arrival order."""
        deferred, self.deferred = self.deferred, []
        if not deferred:
            return []
        # their channels were blocked while held back: unblock, then handle them (which may block again)
        actions: list[Action] = [self._unblock()]
        for channel_id, spec, priority, nbytes in deferred:
            actions += self.on_barrier(channel_id, spec, priority=priority, now=spec.started_at, queued_bytes=nbytes)
        return actions

    def _check_complete(self, p: _Pending) -> list[Action]:
        # `seen` and `ended` hold only this task's channels, so fewer seen than open channels means one is
        # still missing: counted, not compared set against set, on each of a checkpoint's barriers (O(1)
        # instead of O(channels): 500 barriers of 500 channels a checkpoint at parallelism 500)
        if len(p.seen) < len(self.channels) - len(self.ended) or not (self.channels - self.ended) <= p.seen:
            return []
        actions: list[Action] = []
        if not p.snapshotted:
            p.snapshotted = True
            if p.switched:  # a mixed checkpoint: outputs stay aligned, the switched channels are recorded
                p.unaligned = True
                actions += [Snapshot(p.spec, unaligned=False, record_inputs=True), self._unblock()]
            else:
                actions += [Snapshot(p.spec, unaligned=False), self._unblock()]
        actions.append(InputsComplete(p.spec, p.unaligned))
        self.pending = None
        self.last_finished = max(self.last_finished, p.spec.checkpoint_id)
        return actions + self._replay_deferred(p.spec.checkpoint_id)
