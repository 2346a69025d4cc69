"""The asynchronous state execution controller: exact instruction lists, then random interleavings."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.execution.async_controller import (
    MISSING,
    AnswerRequest,
    AsyncExecutionController,
    AsyncStateProtocolError,
    BlockInput,
    ControllerConfig,
    Delete,
    Drained,
    EmitWatermark,
    EpochMode,
    ExecuteBatch,
    FireTimers,
    Get,
    InFlightAtBarrier,
    InputBlocked,
    KeyOrder,
    Put,
    Record,
    StartRecord,
    TakeSnapshot,
    Timer,
    UnblockInput,
    Watermark,
)
from runtime.graph.partitioning import key_group

MP = 128


def g(key: Any) -> int:
    return key_group(key, MP)


def controller(**overrides: Any) -> AsyncExecutionController:
    return AsyncExecutionController(ControllerConfig(**{"max_parallelism": MP, **overrides}))


# -- exact instruction lists --------------------------------------------------------------------------

def test_records_of_one_key_run_in_arrival_order_and_other_keys_overlap() -> None:
    c = controller(batch_size=2, batch_timeout_s=1.0)
    assert c.submit_record("a1", "a", now=0) == [StartRecord(0, "a", "a1")]
    assert c.submit_record("a2", "a", now=0) == []  # waits for a1
    assert c.submit_record("b1", "b", now=0) == [StartRecord(2, "b", "b1")]
    assert c.request_state(0, 100, Get("count"), now=0) == []  # buffered: 1 of 2
    assert c.request_state(2, 101, Get("count"), now=0) == [
        ExecuteBatch(1, (("count", g("a"), "a"), ("count", g("b"), "b")), (), ())]
    assert c.batch_done(1, [MISSING, 5], now=0.1) == [AnswerRequest(100, MISSING), AnswerRequest(101, 5)]
    assert c.request_state(0, 102, Put("count", 1), now=0.1) == [AnswerRequest(102, None)]
    # a1 finishes: its write is committed to the buffer and a2 starts; a2 reads a1's write without a round trip
    assert c.finish_record(0, now=0.1) == [StartRecord(1, "a", "a2")]
    assert c.request_state(1, 103, Get("count"), now=0.1) == [AnswerRequest(103, 1)]
    assert c.request_state(1, 104, Delete("count"), now=0.1) == [AnswerRequest(104, None)]
    assert c.request_state(1, 105, Get("count"), now=0.1) == [AnswerRequest(105, MISSING)]
    assert c.finish_record(1, now=0.1) == []  # one write in the buffer (a2's delete replaced a1's put): not full
    assert c.end_input(now=0.1) == [ExecuteBatch(2, (), (), (("count", g("a"), "a"),))]
    assert c.statistics().reads_answered_locally == 2


def test_first_state_access_order_lets_records_start_and_orders_their_state_access() -> None:
    c = controller(key_order=KeyOrder.FIRST_STATE_ACCESS, batch_size=1)
    assert c.submit_record("a1", "a", now=0) == [StartRecord(0, "a", "a1")]
    assert c.submit_record("a2", "a", now=0) == [StartRecord(1, "a", "a2")]  # starts at once
    # a2 touches state first: it takes the key; a1's request waits until a2 finishes
    assert c.request_state(1, 10, Get("n"), now=0) == [ExecuteBatch(1, (("n", g("a"), "a"),), (), ())]
    assert c.request_state(0, 11, Get("n"), now=0) == []
    assert c.statistics().waiting_for_key == 1
    with pytest.raises(AsyncStateProtocolError, match="unanswered"):
        c.finish_record(0, now=0)
    assert c.batch_done(1, [3], now=0) == [AnswerRequest(10, 3)]
    assert c.request_state(1, 12, Put("n", 4), now=0) == [AnswerRequest(12, None)]
    assert c.finish_record(1, now=0) == [AnswerRequest(11, 4), ExecuteBatch(2, (), (("n", g("a"), "a", 4),), ())]


def test_a_record_without_state_access_does_not_wait_for_the_key_in_first_state_access_order() -> None:
    c = controller(key_order=KeyOrder.FIRST_STATE_ACCESS, batch_size=10, batch_timeout_s=1.0)
    c.submit_record("a1", "a", now=0)
    c.request_state(0, 1, Get("n"), now=0)
    assert c.submit_record("a2", "a", now=0) == [StartRecord(1, "a", "a2")]
    assert c.finish_record(1, now=0) == []  # done before a1: it never touched the state


def test_the_in_flight_bound_blocks_input_and_flushes_the_buffer() -> None:
    c = controller(max_in_flight=2, batch_size=100, batch_timeout_s=1.0)
    c.submit_record("a1", "a", now=0)
    assert c.request_state(0, 1, Get("n"), now=0) == []
    # the second record fills the bound: input blocks, and nothing more can arrive, so the batch goes out now
    assert c.submit_record("b1", "b", now=0) == [StartRecord(1, "b", "b1"), BlockInput(),
                                                 ExecuteBatch(1, (("n", g("a"), "a"),), (), ())]
    with pytest.raises(InputBlocked, match="max_in_flight 2"):
        c.submit_record("c1", "c", now=0)
    assert c.statistics().blocked
    assert c.finish_record(1, now=0) == [UnblockInput()]
    assert c.submit_record("c1", "c", now=0) == [StartRecord(2, "c", "c1"), BlockInput()]


def test_requests_wait_for_the_batch_timeout_and_one_batch_at_a_time() -> None:
    c = controller(batch_size=3, batch_timeout_s=0.005)
    c.submit_record("a1", "a", now=0)
    c.submit_record("b1", "b", now=0)
    assert c.request_state(0, 1, Get("n"), now=1.000) == []
    assert c.next_deadline() == pytest.approx(1.005)
    assert c.tick(now=1.004) == []
    assert c.tick(now=1.005) == [ExecuteBatch(1, (("n", g("a"), "a"),), (), ())]
    assert c.next_deadline() is None  # one batch in flight: the next waits for its return
    assert c.request_state(1, 2, Get("n"), now=1.006) == []
    assert c.tick(now=2.0) == []
    assert c.batch_done(1, [1], now=2.0) == [AnswerRequest(1, 1), ExecuteBatch(2, (("n", g("b"), "b"),), (), ())]


def test_strict_epochs_emit_the_watermark_after_earlier_records_and_hold_later_ones() -> None:
    c = controller(batch_size=10, batch_timeout_s=1.0)
    c.submit_record("a1", "a", now=0)
    assert c.watermark(10, now=0) == []
    assert c.submit_record("b1", "b", now=0) == []  # held: the epoch before the watermark is not done
    assert c.statistics().held_by_epoch == 1
    assert c.finish_record(0, now=0) == [EmitWatermark(10), StartRecord(1, "b", "b1")]
    assert c.watermark(20, now=0) == []
    assert c.finish_record(1, now=0) == [EmitWatermark(20)]
    assert c.watermark(30, now=0) == [EmitWatermark(30)]


def test_timers_run_as_records_of_the_epoch_their_watermark_closes() -> None:
    c = controller(timers=True, batch_size=10, batch_timeout_s=1.0)
    c.submit_record("a1", "a", now=0)
    assert c.watermark(10, now=0) == []
    assert c.submit_record("a2", "a", now=0) == []  # held: strict epochs
    assert c.finish_record(0, now=0) == [FireTimers(10)]
    with pytest.raises(AsyncStateProtocolError, match="without a FireTimers"):
        c.fire_timers(11, [], now=0)
    # a timer of key a and one of key b: both run before the watermark and before a2
    assert c.fire_timers(10, [("a", "ta"), ("b", "tb")], now=0) == [StartRecord(2, "a", Timer(10, "ta")),
                                                                    StartRecord(3, "b", Timer(10, "tb"))]
    assert c.request_state(2, 1, Put("n", 5), now=0) == [AnswerRequest(1, None)]
    assert c.finish_record(3, now=0) == []
    assert c.finish_record(2, now=0) == [EmitWatermark(10), StartRecord(1, "a", "a2")]
    assert c.request_state(1, 2, Get("n"), now=0) == [AnswerRequest(2, 5)]  # the timer's write, seen locally
    # a watermark with no timers due goes on at once
    # a pending watermark makes the buffered write urgent
    assert c.watermark(20, now=0) == [ExecuteBatch(1, (), (("n", g("a"), "a", 5),), ())]
    assert c.finish_record(1, now=0) == [FireTimers(20)]
    assert c.fire_timers(20, [], now=0) == [EmitWatermark(20)]


def test_the_end_of_input_waits_for_the_timers_of_the_last_watermark() -> None:
    c = controller(timers=True)
    assert c.watermark(10, now=0) == [FireTimers(10)]
    assert c.end_input(now=0) == []
    assert c.fire_timers(10, [], now=0) == [EmitWatermark(10), Drained()]


def test_a_capture_while_timers_run_replays_the_watermark_not_the_timers() -> None:
    c = controller(timers=True, checkpoint_mode=InFlightAtBarrier.CAPTURE, batch_size=10, batch_timeout_s=1.0)
    assert c.watermark(10, now=0) == [FireTimers(10)]
    c.fire_timers(10, [("a", "ta")], now=0)
    c.submit_record("b1", "b", now=0)
    assert c.barrier(1, now=0) == [TakeSnapshot(1, (Watermark(10), Record("b", "b1")), (), ())]


def test_out_of_order_epochs_start_later_records_but_keep_the_watermark_behind_earlier_ones() -> None:
    c = controller(epoch_mode=EpochMode.OUT_OF_ORDER, batch_size=10, batch_timeout_s=1.0)
    c.submit_record("a1", "a", now=0)
    c.watermark(10, now=0)
    assert c.submit_record("b1", "b", now=0) == [StartRecord(1, "b", "b1")]
    assert c.watermark(20, now=0) == []
    assert c.finish_record(1, now=0) == []  # b1 is after watermark 10, which still waits for a1
    assert c.finish_record(0, now=0) == [EmitWatermark(10), EmitWatermark(20)]


def test_drain_waits_for_records_before_the_barrier_and_holds_those_after() -> None:
    c = controller(batch_size=10, batch_timeout_s=1.0)
    c.submit_record("a1", "a", now=0)
    c.request_state(0, 1, Put("n", 1), now=0)
    assert c.barrier(7, now=0) == []
    assert c.submit_record("a2", "a", now=0) == []
    # the committed write is not acknowledged yet: it goes into the checkpoint instead of being waited for
    assert c.finish_record(0, now=0) == [TakeSnapshot(7, (), (("n", g("a"), "a", 1),), ()),
                                         StartRecord(1, "a", "a2")]


def test_capture_snapshots_at_once_and_returns_what_is_in_flight_as_replay() -> None:
    c = controller(checkpoint_mode=InFlightAtBarrier.CAPTURE, batch_size=1)
    c.submit_record("a1", "a", now=0)
    c.request_state(0, 1, Put("n", 1), now=0)
    assert c.finish_record(0, now=0) == [ExecuteBatch(1, (), (("n", g("a"), "a", 1),), ())]
    c.submit_record("a2", "a", now=0)
    c.request_state(1, 2, Put("n", 2), now=0)  # a2's write is not committed: it is in flight
    c.watermark(5, now=0)
    c.submit_record("b1", "b", now=0)
    assert c.barrier(9, now=0) == [TakeSnapshot(9, (Record("a", "a2"), Watermark(5), Record("b", "b1")),
                                                (("n", g("a"), "a", 1),), ())]
    # processing goes on: the barrier changed nothing
    assert c.finish_record(1, now=0) == [EmitWatermark(5), StartRecord(2, "b", "b1")]


def test_end_input_flushes_and_says_drained_once_every_write_is_acknowledged() -> None:
    c = controller(batch_size=10, batch_timeout_s=1.0)
    c.submit_record("a1", "a", now=0)
    c.request_state(0, 1, Put("n", 1), now=0)
    assert c.end_input(now=0) == []
    assert c.finish_record(0, now=0) == [ExecuteBatch(1, (), (("n", g("a"), "a", 1),), ())]
    assert c.batch_done(1, [], now=0) == [Drained()]
    with pytest.raises(AsyncStateProtocolError, match="after end_input"):
        c.submit_record("x", "x", now=0)


def test_misuse_is_refused_with_a_clear_error() -> None:
    c = controller()
    with pytest.raises(AsyncStateProtocolError, match="record 3 cannot finish: it is unknown"):
        c.finish_record(3, now=0)
    c.submit_record("a1", "a", now=0)
    c.submit_record("a2", "a", now=0)
    with pytest.raises(AsyncStateProtocolError, match="record 1 cannot make a state request: it is waiting-key"):
        c.request_state(1, 1, Get("n"), now=0)
    with pytest.raises(AsyncStateProtocolError, match="batch 4 completed"):
        c.batch_done(4, [], now=0)
    with pytest.raises(ValueError, match="bad async state settings"):
        ControllerConfig(max_in_flight=0)


# -- random interleavings -----------------------------------------------------------------------------
# A simulated task: each record of key k reads state "n" of k, writes n + 1, and outputs (k, n + 1, record).
# Records whose value is odd first do a step of work without state (so FIRST_STATE_ACCESS order matters).
# Hypothesis picks, at every step, which of the possible things happens next: the next input arrives, a
# running record takes its next step, the backend completes the batch, or time passes.

Element = Record | Watermark | int  # an int is a checkpoint barrier


@dataclass
class Sim:
    config: ControllerConfig
    backend: dict[tuple[str, int, Any], Any] = field(default_factory=dict)
    output: list[Any] = field(default_factory=list)  # (key, n, record) or ("wm", ts) or ("barrier", id)
    snapshots: dict[int, tuple[dict[Any, Any], list[Any], tuple[Any, ...]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.c = AsyncExecutionController(self.config)
        self.now = 0.0
        self.steps: dict[int, list[Any]] = {}  # running record -> [key, record, step, answer]
        self.answers: dict[int, tuple[int, Any]] = {}  # request id -> (seq, value)
        self.waiting: dict[int, int] = {}  # request id -> seq
        self.batch: ExecuteBatch | None = None
        self.blocked = False
        self.drained = False
        self.next_request = 0
        self.started: list[tuple[Any, int]] = []  # (key, seq) in start order
        self.finished: list[int] = []
        self.submitted: list[tuple[Any, int]] = []
        self.watermarks_in = self.watermarks_out = self.barriers_in = self.barriers_out = 0
        self.watermarks_before: list[int] = []  # by seq: watermarks submitted before the record
        self.barriers_before: list[int] = []

    def run(self, instructions: list[Any]) -> None:
        fire = []
        for i in instructions:
            assert self.c.statistics().in_flight <= self.config.max_in_flight
            if isinstance(i, StartRecord):
                if self.config.key_order is KeyOrder.RECORD:
                    assert all(k != i.key for k, _, _, _ in self.steps.values()), "two records of a key overlap"
                self.steps[i.seq] = [i.key, i.record, 0, None]
                self.started.append((i.key, i.seq))
                if self.config.epoch_mode is EpochMode.STRICT:
                    assert self.watermarks_out >= self.watermarks_before[i.seq], "started before its watermark"
                if self.config.checkpoint_mode is InFlightAtBarrier.DRAIN:
                    assert self.barriers_out >= self.barriers_before[i.seq], "started before the drained barrier"
            elif isinstance(i, AnswerRequest):
                seq = self.waiting.pop(i.request_id)
                if self.steps[seq][2] == 2:  # the answer to the read; a write's answer is None
                    self.steps[seq][3] = i.value
            elif isinstance(i, ExecuteBatch):
                assert self.batch is None, "two batches in flight"
                self.batch = i
            elif isinstance(i, BlockInput):
                self.blocked = True
            elif isinstance(i, UnblockInput):
                self.blocked = False
            elif isinstance(i, EmitWatermark):
                self.output.append(("wm", i.timestamp))
                self.watermarks_out += 1
            elif isinstance(i, TakeSnapshot):
                state = dict(self.backend)
                state.update({(n, grp, k): v for n, grp, k, v in i.puts})
                for address in i.deletes:
                    state.pop(address, None)
                self.snapshots[i.checkpoint_id] = (state, list(self.output), i.replay)
                self.output.append(("barrier", i.checkpoint_id))
                self.barriers_out += 1
            elif isinstance(i, Drained):
                self.drained = True
            elif isinstance(i, FireTimers):
                fire.append(i.timestamp)
        for timestamp in fire:  # no timer is ever due here: the handshake alone
            self.run(self.c.fire_timers(timestamp, [], now=self.now))

    def choices(self, inputs: list[Element]) -> list[tuple[str, Any]]:
        out: list[tuple[str, Any]] = []
        if inputs and not (self.blocked and isinstance(inputs[0], Record)):
            out.append(("input", None))
        out += [("step", seq) for seq, s in self.steps.items()
                if not any(w == seq for w in self.waiting.values())]
        if self.batch is not None:
            out.append(("batch", None))
        if self.c.next_deadline() is not None:
            out.append(("tick", None))
        return out

    def act(self, kind: str, arg: Any, inputs: list[Element]) -> None:
        if kind == "input":
            element = inputs.pop(0)
            if isinstance(element, Record):
                self.submitted.append((element.key, len(self.submitted)))
                self.watermarks_before.append(self.watermarks_in)
                self.barriers_before.append(self.barriers_in)
                self.run(self.c.submit_record(element.value, element.key, now=self.now))
            elif isinstance(element, Watermark):
                self.watermarks_in += 1
                self.run(self.c.watermark(element.timestamp, now=self.now))
            else:
                self.barriers_in += 1
                self.run(self.c.barrier(element, now=self.now))
            if not inputs:
                self.run(self.c.end_input(now=self.now))
        elif kind == "step":
            key, record, step, answer = self.steps[arg]
            if step == 0 and record % 2 == 1:
                self.steps[arg][2] = 1
                return
            if step <= 1:
                self.steps[arg][2] = 2
                self.request(arg, Get("n"))
            elif step == 2:
                value = (0 if answer is MISSING else answer) + 1
                self.steps[arg][2:] = [3, value]
                self.request(arg, Put("n", value))
            else:
                del self.steps[arg]
                self.output.append((key, answer, record))
                self.finished.append(arg)
                self.run(self.c.finish_record(arg, now=self.now))
        elif kind == "batch":
            batch, self.batch = self.batch, None
            assert batch is not None
            values = [self.backend.get(address, MISSING) for address in batch.reads]
            self.backend.update({(n, grp, k): v for n, grp, k, v in batch.puts})
            for address in batch.deletes:
                self.backend.pop(address, None)
            self.run(self.c.batch_done(batch.batch_id, values, now=self.now))
        else:
            deadline = self.c.next_deadline()
            assert deadline is not None
            self.now = deadline
            self.run(self.c.tick(now=self.now))

    def request(self, seq: int, request: Any) -> None:
        rid = self.next_request
        self.next_request += 1
        self.waiting[rid] = seq
        self.run(self.c.request_state(seq, rid, request, now=self.now))
        if isinstance(request, Put):
            assert rid not in self.waiting, "a write is answered at once"


def simulate(config: ControllerConfig, inputs: list[Element], data: st.DataObject,
             backend: dict[Any, Any] | None = None) -> Sim:
    sim = Sim(config, backend=dict(backend or {}))
    pending = list(inputs)
    if not pending:
        sim.run(sim.c.end_input(now=0))
    for _ in range(10_000):
        options = sim.choices(pending)
        if not options:
            break
        kind, arg = data.draw(st.sampled_from(options))
        sim.act(kind, arg, pending)
    assert sim.drained, f"stuck: {sim.c.statistics()}"
    assert not sim.steps and sim.batch is None
    assert sorted(sim.finished) == list(range(len(sim.submitted)))  # every record finished exactly once
    return sim


def per_key(output: list[Any]) -> dict[Any, list[Any]]:
    out: dict[Any, list[Any]] = {}
    for item in output:
        if item[0] not in ("wm", "barrier"):
            out.setdefault(item[0], []).append(item[1:])
    return out


def expected(inputs: list[Element]) -> dict[Any, list[Any]]:
    counts: dict[Any, int] = {}
    out: dict[Any, list[Any]] = {}
    for e in inputs:
        if isinstance(e, Record):
            counts[e.key] = counts.get(e.key, 0) + 1
            out.setdefault(e.key, []).append((counts[e.key], e.value))
    return out


def inputs_strategy(with_barrier: bool) -> st.SearchStrategy[list[Element]]:
    record = st.builds(Record, st.sampled_from("abcd"), st.integers(0, 9))
    element = st.one_of(record, record, record, st.builds(Watermark, st.integers(0, 5)))
    base = st.lists(element, max_size=25).map(
        lambda es: [Watermark(i) if isinstance(e, Watermark) else e for i, e in enumerate(es)])
    if not with_barrier:
        return base
    return st.tuples(base, st.integers(0, 25)).map(lambda t: t[0][:t[1]] + [1000] + t[0][t[1]:])


CONFIGS = st.builds(ControllerConfig, max_in_flight=st.integers(1, 6), batch_size=st.integers(1, 4),
                    batch_timeout_s=st.sampled_from([0.0, 0.001, 1.0]), key_order=st.sampled_from(KeyOrder),
                    epoch_mode=st.sampled_from(EpochMode), checkpoint_mode=st.sampled_from(InFlightAtBarrier),
                    max_parallelism=st.just(MP), timers=st.booleans())


@given(CONFIGS, inputs_strategy(with_barrier=True), st.data())
@settings(max_examples=300, deadline=None)
def test_any_interleaving_keeps_key_order_the_bound_and_the_watermarks(
        config: ControllerConfig, inputs: list[Element], data: st.DataObject) -> None:
    sim = simulate(config, inputs, data)
    got = per_key(sim.output)
    if config.key_order is KeyOrder.RECORD:
        assert got == expected(inputs)  # exactly the sequential result, key by key
        starts: dict[Any, list[int]] = {}
        for key, seq in sim.started:
            starts.setdefault(key, []).append(seq)
        assert all(seqs == sorted(seqs) for seqs in starts.values())
    else:  # serialisable: each key's counts are 1..n, in some order of the records
        want = expected(inputs)
        assert {k: [n for n, _ in v] for k, v in got.items()} == {k: [n for n, _ in v] for k, v in want.items()}
        assert {k: sorted(r for _, r in v) for k, v in got.items()} == {k: sorted(r for _, r in v)
                                                                       for k, v in want.items()}
    # a watermark comes out after the output of every record before it, in order
    emitted = [e for e in sim.output if e[0] == "wm"]
    assert emitted == [("wm", w.timestamp) for w in inputs if isinstance(w, Watermark)]
    for position, item in enumerate(sim.output):
        if item[0] == "wm":
            before = next(i for i, e in enumerate(inputs) if isinstance(e, Watermark) and e.timestamp == item[1])
            records_before = sum(1 for e in inputs[:before] if isinstance(e, Record))
            assert sum(1 for e in sim.output[:position] if e[0] not in ("wm", "barrier")) >= records_before
    final = {k: v for (_, _, k), v in sim.backend.items()}
    assert final == {k: len(v) for k, v in expected(inputs).items()}


@given(CONFIGS, inputs_strategy(with_barrier=True), st.data())
@settings(max_examples=300, deadline=None)
def test_a_checkpoint_then_a_restore_with_replay_gives_the_output_of_no_checkpoint(
        config: ControllerConfig, inputs: list[Element], data: st.DataObject) -> None:
    sim = simulate(config, inputs, data)
    state, before, replay = sim.snapshots[1000]
    if config.checkpoint_mode is InFlightAtBarrier.DRAIN:
        assert replay == ()
    # a crash right after the checkpoint: restore the snapshot, process the replay, then the input after the barrier
    after_barrier = inputs[inputs.index(1000) + 1:]
    restored = simulate(config, list(replay) + after_barrier, data, backend=state)
    combined = per_key(before)
    for key, items in per_key(restored.output).items():
        combined.setdefault(key, []).extend(items)
    want = expected([e for e in inputs if e != 1000])
    if config.key_order is KeyOrder.RECORD:
        assert combined == want
    else:  # no record lost or repeated, and each key's counts are 1..n: a serial order of its records
        assert {k: [n for n, _ in v] for k, v in combined.items()} == {k: [n for n, _ in v] for k, v in want.items()}
        assert {k: sorted(r for _, r in v) for k, v in combined.items()} == {k: sorted(r for _, r in v)
                                                                            for k, v in want.items()}
    # watermarks: those emitted before the barrier plus those after the restore are each watermark once
    wms = [e for e in before if e[0] == "wm"] + [e for e in restored.output if e[0] == "wm"]
    assert wms == [("wm", w.timestamp) for w in inputs if isinstance(w, Watermark)]
