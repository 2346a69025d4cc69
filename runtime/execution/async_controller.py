"""The asynchronous state execution controller: a pure state machine, no I/O, no clock (FLIP-425's AEC).

A task that runs user code with asynchronous state access (`await
state.value()`) feeds this object events and executes the instructions it
returns, as dask's WorkerState does. The controller decides:

- which records may start: records of one key never overlap their state
  access. `KeyOrder.RECORD`: a record starts only after every earlier record
  of its key finished (Flink's strict mode, the default). `KeyOrder.
  FIRST_STATE_ACCESS`: a record starts at once and takes its key at its first
  state request, holding it until it finishes (Flink's original FLIP-425
  order). Records of different keys overlap;
- how many records are in flight: at `max_in_flight` it says `BlockInput`
  (the task stops reading input, which shows as backpressure) and
  `UnblockInput` once a record finishes;
- how state requests reach the backend: reads are collected into one batch
  per round trip (sent at `batch_size` requests or `batch_timeout_s` after
  the first, at once when nothing else can make progress), one batch in
  flight at a time so writes land in the order they were committed;
- when watermarks and checkpoints happen (epochs, below).

Writes are held per record and committed when the record finishes. The key
is held from first access to finish, so no other record could have seen them
earlier: deferring them changes nothing, and it means a record in flight has
no visible effect — which is what makes `InFlightAtBarrier.CAPTURE` exact.
Reads see the record's own writes, then committed writes not yet
acknowledged by the backend, then the backend.

Epochs: a watermark closes the current epoch; it is emitted once every
record before it has finished. `EpochMode.STRICT` also holds back the records
after it until then (Flink's only mode); `EpochMode.OUT_OF_ORDER` lets them
start. Checkpoint barriers: `InFlightAtBarrier.DRAIN` treats a barrier as a
strict epoch boundary (Flink: the snapshot waits for every record before
it); `InFlightAtBarrier.CAPTURE` snapshots at once, and the records (and
watermarks) still in flight become input to replay after a restore; the
committed writes the backend has not acknowledged go into the checkpoint too
(they are absolute values, so applying them again on restore is harmless).
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from runtime.graph.partitioning import key_group
from runtime.state.backend import MISSING

__all__ = ["MISSING", "AsyncExecutionController", "ControllerConfig"]  # and the event and instruction types


class KeyOrder(enum.Enum):
    RECORD = "record"
    FIRST_STATE_ACCESS = "first-state-access"


class EpochMode(enum.Enum):
    STRICT = "strict"
    OUT_OF_ORDER = "out-of-order"


class InFlightAtBarrier(enum.Enum):
    """What a barrier does with the records in flight (not the job's checkpoint mode, runtime/graph/enums.py)."""

    DRAIN = "drain"
    CAPTURE = "capture"


@dataclass(frozen=True)
class ControllerConfig:
    max_in_flight: int = 1000
    batch_size: int = 100
    batch_timeout_s: float = 0.001
    key_order: KeyOrder = KeyOrder.RECORD
    epoch_mode: EpochMode = EpochMode.STRICT
    checkpoint_mode: InFlightAtBarrier = InFlightAtBarrier.DRAIN
    max_parallelism: int = 128
    timers: bool = False  # say FireTimers before each watermark and run its timers as records of its epoch

    def __post_init__(self) -> None:
        if self.max_in_flight < 1 or self.batch_size < 1 or self.batch_timeout_s < 0:
            raise ValueError(f"bad async state settings: {self}")


class AsyncStateProtocolError(RuntimeError):
    """The task misused the controller (an event that makes no sense in its state)."""


class InputBlocked(AsyncStateProtocolError):
    """A record was submitted after BlockInput and before UnblockInput."""


class _Deleted:
    __slots__ = ()

    def __repr__(self) -> str:
        return "DELETED"


DELETED: Any = _Deleted()


Address = tuple[str, int, Any]  # (state name, key group, key)


# -- state requests a running record makes --------------------------------------------------------------

@dataclass(frozen=True)
class Get:
    state: str


@dataclass(frozen=True)
class Put:
    state: str
    value: Any


@dataclass(frozen=True)
class Delete:
    state: str


StateRequest = Get | Put | Delete


# -- input elements, as a replay list holds them ---------------------------------------------------------

@dataclass(frozen=True)
class Record:
    key: Any
    value: Any


@dataclass(frozen=True)
class Watermark:
    timestamp: int


@dataclass(frozen=True)
class Timer:
    """A due timer, run like a record of its key (StartRecord.record is this)."""

    timestamp: int
    payload: Any


# -- instructions --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class StartRecord:
    seq: int
    key: Any
    record: Any


@dataclass(frozen=True)
class AnswerRequest:
    request_id: int
    value: Any  # MISSING (the controller's or the backend's) when there is no value


@dataclass(frozen=True)
class ExecuteBatch:
    """One backend round trip: read `reads` (before the writes), then apply `puts` and `deletes`."""

    batch_id: int
    reads: tuple[Address, ...]
    puts: tuple[tuple[str, int, Any, Any], ...]
    deletes: tuple[Address, ...]


@dataclass(frozen=True)
class BlockInput:
    pass


@dataclass(frozen=True)
class UnblockInput:
    pass


@dataclass(frozen=True)
class EmitWatermark:
    timestamp: int


@dataclass(frozen=True)
class FireTimers:
    """Every record before the watermark finished: answer with `fire_timers(timestamp, due timers)`."""

    timestamp: int


@dataclass(frozen=True)
class TakeSnapshot:
    """Snapshot the backend now (before the next ExecuteBatch), then forward the barrier.

    The checkpoint holds the backend snapshot, `pending_writes` applied over it
    on restore, and `replay`, the input to process before the channels' input.
    """

    checkpoint_id: int
    replay: tuple[Record | Watermark, ...]
    puts: tuple[tuple[str, int, Any, Any], ...]
    deletes: tuple[Address, ...]


@dataclass(frozen=True)
class Drained:
    """After end_input: every record finished and every write acknowledged."""


Instruction = (StartRecord | AnswerRequest | ExecuteBatch | BlockInput | UnblockInput | EmitWatermark
               | FireTimers | TakeSnapshot | Drained)


@dataclass(frozen=True)
class ControllerStatistics:
    in_flight: int
    running: int
    waiting_for_key: int
    held_by_epoch: int
    buffered_requests: int
    batch_in_flight: bool
    blocked: bool
    pending_epochs: int
    batches_sent: int
    reads_sent: int
    writes_sent: int
    reads_answered_locally: int


# -- internal bookkeeping ----------------------------------------------------------------------------

_HELD, _WAITING_KEY, _RUNNING = "held", "waiting-key", "running"


@dataclass
class _Rec:
    seq: int
    key: Any
    group: int
    record: Any
    epoch: int
    status: str
    holds_key: bool = False
    outstanding: set[int] = field(default_factory=set)
    queued: list[tuple[int, StateRequest]] = field(default_factory=list)  # waiting for the key
    writes: dict[str, Any] = field(default_factory=dict)


@dataclass
class _Epoch:
    id: int
    records: set[int] = field(default_factory=set)  # unfinished records admitted in this epoch
    boundary: Watermark | int | None = None  # a watermark, a checkpoint id (drain), or None while open
    ends_input: bool = False
    timers: str = "none"  # for a watermark with config.timers: "none" -> "asked" (FireTimers) -> "submitted"


class AsyncExecutionController:
    def __init__(self, config: ControllerConfig) -> None:
        self.config = config
        self._records: dict[int, _Rec] = {}
        self._next_seq = 0
        self._key_owner: dict[Any, int] = {}
        self._key_waiters: dict[Any, deque[int]] = {}
        self._held: deque[int] = deque()
        self._epochs: deque[_Epoch] = deque([_Epoch(0)])
        self._blocked = False
        self._ended = False
        self._drained = False
        # the buffer of the next batch
        self._reads: dict[Address, list[int]] = {}
        self._writes: dict[Address, Any] = {}
        self._buffer_since: float | None = None
        # the batch the backend is working on
        self._batch_id = 0
        self._in_flight_batch: ExecuteBatch | None = None
        self._in_flight_reads: dict[Address, list[int]] = {}
        self._in_flight_writes: dict[Address, Any] = {}
        self._batches_sent = self._reads_sent = self._writes_sent = self._local_reads = 0

    # -- events ---------------------------------------------------------------------------------------

    def submit_record(self, record: Any, key: Any, *, now: float) -> list[Instruction]:
        if self._ended:
            raise AsyncStateProtocolError("a record was submitted after end_input")
        if self._blocked:
            raise InputBlocked(f"a record was submitted while {len(self._records)} records are in flight "
                               f"(max_in_flight {self.config.max_in_flight}): wait for UnblockInput")
        out: list[Instruction] = []
        seq = self._next_seq
        self._next_seq += 1
        epoch = self._epochs[-1]
        rec = _Rec(seq, key, key_group(key, self.config.max_parallelism), record, epoch.id, _HELD)
        self._records[seq] = rec
        epoch.records.add(seq)
        if self._startable(epoch.id) and not self._held:
            self._try_start(rec, out)
        else:
            self._held.append(seq)
        if len(self._records) >= self.config.max_in_flight:
            self._blocked = True
            out.append(BlockInput())
        self._maybe_flush(now, out)
        return out

    def request_state(self, seq: int, request_id: int, request: StateRequest, *, now: float) -> list[Instruction]:
        rec = self._running(seq, "make a state request")
        out: list[Instruction] = []
        rec.outstanding.add(request_id)
        if rec.holds_key:
            self._serve(rec, request_id, request, now, out)
        elif self._key_owner.get(rec.key) is None and not self._key_waiters.get(rec.key):
            self._take_key(rec)
            self._serve(rec, request_id, request, now, out)
        else:  # FIRST_STATE_ACCESS and another record holds the key: wait in line
            if not rec.queued:
                self._key_waiters.setdefault(rec.key, deque()).append(seq)
            rec.queued.append((request_id, request))
        self._maybe_flush(now, out)
        return out

    def finish_record(self, seq: int, *, now: float) -> list[Instruction]:
        rec = self._running(seq, "finish")
        if rec.outstanding:
            raise AsyncStateProtocolError(f"record {seq} finished with state requests {sorted(rec.outstanding)} "
                                          f"unanswered")
        out: list[Instruction] = []
        for state, value in rec.writes.items():
            self._writes[(state, rec.group, rec.key)] = value
            self._note_buffered(now)
        del self._records[seq]
        self._epoch(rec.epoch).records.discard(seq)
        if rec.holds_key:
            self._release_key(rec.key, now, out)
        if self._blocked and len(self._records) < self.config.max_in_flight:
            self._blocked = False
            out.append(UnblockInput())
        self._advance_epochs(out)
        self._maybe_flush(now, out)
        self._check_drained(out)
        return out

    def batch_done(self, batch_id: int, values: list[Any], *, now: float) -> list[Instruction]:
        batch = self._in_flight_batch
        if batch is None or batch.batch_id != batch_id:
            raise AsyncStateProtocolError(f"batch {batch_id} completed, but the batch in flight is "
                                          f"{None if batch is None else batch.batch_id}")
        if len(values) != len(batch.reads):
            raise AsyncStateProtocolError(f"batch {batch_id} read {len(batch.reads)} entries but "
                                          f"{len(values)} values came back")
        out: list[Instruction] = []
        self._in_flight_batch = None
        self._in_flight_writes = {}
        for address, value in zip(batch.reads, values, strict=True):
            for request_id in self._in_flight_reads.pop(address):
                self._answer(self._owner_record(address), request_id, value, out)
        # the requests that came during the round trip have waited long enough: send them now
        self._maybe_flush(now, out, force=True)
        self._check_drained(out)
        return out

    def tick(self, *, now: float) -> list[Instruction]:
        out: list[Instruction] = []
        self._maybe_flush(now, out)
        return out

    def watermark(self, timestamp: int, *, now: float) -> list[Instruction]:
        return self._close_epoch(Watermark(timestamp), now)

    def fire_timers(self, timestamp: int, timers: list[tuple[Any, Any]], *, now: float) -> list[Instruction]:
        """The timers (key, payload) due at the watermark FireTimers named; they run before it is emitted.

        They are admitted even while input is blocked (they count as in flight).
        """
        head = self._epochs[0]
        if head.timers != "asked" or not isinstance(head.boundary, Watermark) or head.boundary.timestamp != timestamp:
            raise AsyncStateProtocolError(f"fire_timers({timestamp}) without a FireTimers({timestamp}) to answer")
        head.timers = "submitted"
        out: list[Instruction] = []
        for key, payload in timers:
            seq = self._next_seq
            self._next_seq += 1
            rec = _Rec(seq, key, key_group(key, self.config.max_parallelism), Timer(timestamp, payload), head.id,
                       _HELD)
            self._records[seq] = rec
            head.records.add(seq)
            self._try_start(rec, out)
        if not self._blocked and len(self._records) >= self.config.max_in_flight:
            self._blocked = True
            out.append(BlockInput())
        self._advance_epochs(out)
        self._maybe_flush(now, out)
        self._check_drained(out)
        return out

    def barrier(self, checkpoint_id: int, *, now: float) -> list[Instruction]:
        if self.config.checkpoint_mode is InFlightAtBarrier.DRAIN:
            return self._close_epoch(checkpoint_id, now)
        return [self._snapshot(checkpoint_id, replay=True)]

    def end_input(self, *, now: float) -> list[Instruction]:
        if self._ended:
            raise AsyncStateProtocolError("end_input twice")
        self._ended = True
        self._epochs[-1].ends_input = True
        out: list[Instruction] = []
        self._maybe_flush(now, out)
        self._check_drained(out)
        return out

    def next_deadline(self) -> float | None:
        """When `tick` must be called at the latest, or None when no timer is needed."""
        if self._in_flight_batch is None and self._buffer_since is not None:
            return self._buffer_since + self.config.batch_timeout_s
        return None

    @property
    def in_flight(self) -> int:
        """Records (and timers) submitted and not finished: cheap, for a task's checks and gauges."""
        return len(self._records)

    def statistics(self) -> ControllerStatistics:
        statuses = [r.status for r in self._records.values()]
        return ControllerStatistics(
            in_flight=len(self._records), running=statuses.count(_RUNNING),
            waiting_for_key=statuses.count(_WAITING_KEY) + sum(1 for r in self._records.values() if r.queued),
            held_by_epoch=len(self._held), buffered_requests=self._buffered(),
            batch_in_flight=self._in_flight_batch is not None, blocked=self._blocked,
            pending_epochs=len(self._epochs) - 1, batches_sent=self._batches_sent, reads_sent=self._reads_sent,
            writes_sent=self._writes_sent, reads_answered_locally=self._local_reads)

    # -- records and keys -----------------------------------------------------------------------------

    def _running(self, seq: int, what: str) -> _Rec:
        rec = self._records.get(seq)
        if rec is None or rec.status != _RUNNING:
            state = "unknown or finished" if rec is None else rec.status
            raise AsyncStateProtocolError(f"record {seq} cannot {what}: it is {state}")
        return rec

    def _try_start(self, rec: _Rec, out: list[Instruction]) -> None:
        if self.config.key_order is KeyOrder.FIRST_STATE_ACCESS:
            rec.status = _RUNNING
            out.append(StartRecord(rec.seq, rec.key, rec.record))
        elif rec.key not in self._key_owner and not self._key_waiters.get(rec.key):
            self._take_key(rec)
            rec.status = _RUNNING
            out.append(StartRecord(rec.seq, rec.key, rec.record))
        else:
            rec.status = _WAITING_KEY
            self._key_waiters.setdefault(rec.key, deque()).append(rec.seq)

    def _take_key(self, rec: _Rec) -> None:
        self._key_owner[rec.key] = rec.seq
        rec.holds_key = True

    def _release_key(self, key: Any, now: float, out: list[Instruction]) -> None:
        del self._key_owner[key]
        waiters = self._key_waiters.get(key)
        if not waiters:
            return
        nxt = self._records[waiters.popleft()]
        if not waiters:
            del self._key_waiters[key]
        self._take_key(nxt)
        if nxt.status == _WAITING_KEY:  # KeyOrder.RECORD
            nxt.status = _RUNNING
            out.append(StartRecord(nxt.seq, nxt.key, nxt.record))
        queued, nxt.queued = nxt.queued, []
        for request_id, request in queued:  # KeyOrder.FIRST_STATE_ACCESS
            self._serve(nxt, request_id, request, now, out)

    def _owner_record(self, address: Address) -> _Rec:
        return self._records[self._key_owner[address[2]]]

    # -- requests and batches -------------------------------------------------------------------------

    def _serve(self, rec: _Rec, request_id: int, request: StateRequest, now: float,
               out: list[Instruction]) -> None:
        if isinstance(request, Put):
            rec.writes[request.state] = request.value
            self._answer(rec, request_id, None, out)
            return
        if isinstance(request, Delete):
            rec.writes[request.state] = DELETED
            self._answer(rec, request_id, None, out)
            return
        address = (request.state, rec.group, rec.key)
        if request.state in rec.writes:
            found = rec.writes[request.state]
        elif address in self._writes:
            found = self._writes[address]
        elif address in self._in_flight_writes:
            found = self._in_flight_writes[address]
        else:
            self._reads.setdefault(address, []).append(request_id)
            self._note_buffered(now)
            return
        self._local_reads += 1
        self._answer(rec, request_id, MISSING if found is DELETED else found, out)

    def _answer(self, rec: _Rec, request_id: int, value: Any, out: list[Instruction]) -> None:
        rec.outstanding.discard(request_id)
        out.append(AnswerRequest(request_id, value))

    def _buffered(self) -> int:
        return sum(len(ids) for ids in self._reads.values()) + len(self._writes)

    def _note_buffered(self, now: float) -> None:
        if self._buffer_since is None:
            self._buffer_since = now

    def _urgent(self) -> bool:
        """Nothing but this batch can make progress: waiting for more requests would only add latency."""
        return self._blocked or self._ended or len(self._epochs) > 1

    def _maybe_flush(self, now: float, out: list[Instruction], *, force: bool = False) -> None:
        if self._in_flight_batch is not None or not (self._reads or self._writes):
            return
        assert self._buffer_since is not None
        if not (force or self._urgent() or self._buffered() >= self.config.batch_size
                or now >= self._buffer_since + self.config.batch_timeout_s):
            return
        puts = tuple((a[0], a[1], a[2], v) for a, v in self._writes.items() if v is not DELETED)
        deletes = tuple(a for a, v in self._writes.items() if v is DELETED)
        self._batch_id += 1
        batch = ExecuteBatch(self._batch_id, tuple(self._reads), puts, deletes)
        self._in_flight_batch = batch
        self._in_flight_reads, self._reads = self._reads, {}
        self._in_flight_writes, self._writes = self._writes, {}
        self._buffer_since = None
        self._batches_sent += 1
        self._reads_sent += len(batch.reads)
        self._writes_sent += len(puts) + len(deletes)
        out.append(batch)

    # -- epochs, watermarks, checkpoints --------------------------------------------------------------

    def _epoch(self, epoch_id: int) -> _Epoch:
        return self._epochs[epoch_id - self._epochs[0].id]

    def _holds(self, boundary: Watermark | int | None) -> bool:
        if boundary is None:
            return False
        if isinstance(boundary, Watermark):
            return self.config.epoch_mode is EpochMode.STRICT
        return True  # a drained checkpoint: nothing after the barrier may run before the snapshot

    def _startable(self, epoch_id: int) -> bool:
        return not any(self._holds(e.boundary) for e in self._epochs if e.id < epoch_id)

    def _close_epoch(self, boundary: Watermark | int, now: float) -> list[Instruction]:
        if self._ended:
            raise AsyncStateProtocolError(f"{boundary!r} after end_input")
        out: list[Instruction] = []
        self._epochs[-1].boundary = boundary
        self._epochs.append(_Epoch(self._epochs[-1].id + 1))
        self._advance_epochs(out)
        self._maybe_flush(now, out)
        return out

    def _advance_epochs(self, out: list[Instruction]) -> None:
        while self._epochs[0].boundary is not None and not self._epochs[0].records:
            head = self._epochs[0]
            if isinstance(head.boundary, Watermark) and self.config.timers and head.timers != "submitted":
                if head.timers == "none":
                    head.timers = "asked"
                    out.append(FireTimers(head.boundary.timestamp))
                break
            done = self._epochs.popleft()
            if isinstance(done.boundary, Watermark):
                out.append(EmitWatermark(done.boundary.timestamp))
            else:
                assert done.boundary is not None
                out.append(self._snapshot(done.boundary, replay=False))  # all before the barrier finished
        while self._held and self._startable(self._records[self._held[0]].epoch):
            self._try_start(self._records[self._held.popleft()], out)

    def _snapshot(self, checkpoint_id: int, *, replay: bool) -> TakeSnapshot:
        elements: list[Record | Watermark] = []
        for epoch in self._epochs if replay else ():
            # a timer in flight is not replayed: the watermark after it is, and fires it again
            elements += [Record(self._records[s].key, self._records[s].record) for s in sorted(epoch.records)
                         if not isinstance(self._records[s].record, Timer)]
            if isinstance(epoch.boundary, Watermark):
                elements.append(epoch.boundary)
        pending = {**self._in_flight_writes, **self._writes}
        return TakeSnapshot(checkpoint_id, tuple(elements),
                            tuple((a[0], a[1], a[2], v) for a, v in pending.items() if v is not DELETED),
                            tuple(a for a, v in pending.items() if v is DELETED))

    def _check_drained(self, out: list[Instruction]) -> None:
        if (self._ended and not self._drained and not self._records and len(self._epochs) == 1
                and self._in_flight_batch is None and not self._reads and not self._writes):
            self._drained = True
            out.append(Drained())

