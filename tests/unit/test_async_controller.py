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
    CheckpointMode,
    ControllerConfig,
    Delete,
    Drained,
    EmitWatermark,
    EpochMode,
    ExecuteBatch,
    Get,
    InputBlocked,
    KeyOrder,
    Put,
    Record,
    StartRecord,
    TakeSnapshot,
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
    c = controller(checkpoint_mode=CheckpointMode.CAPTURE, batch_size=1)
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
