"""BarrierHandler: the exact list of actions for each sequence of barriers, arrivals, timeouts and ends.

The property test in test_barriers.py checks that the records add up; these pin down what the
handler tells the task to do, step by step, the way test_checkpointing.py does for the coordinator.
"""

from __future__ import annotations

import pytest

from runtime.checkpointing.barriers import (
    Abandon,
    BarrierHandler,
    BarrierSpec,
    Block,
    InputsComplete,
    Snapshot,
    UnblockAll,
)
from runtime.graph.checkpoint_options import CheckpointOptions
from runtime.graph.enums import CheckpointMode

CHANNELS = [0, 1, 2]


def spec(checkpoint_id: int = 1, mode: str = "aligned", *, deadline: float | None = None) -> BarrierSpec:
    # aligned_timeout: started at 0, so the deadline is the timeout
    return BarrierSpec(checkpoint_id, 0.0, CheckpointOptions(CheckpointMode(mode), aligned_timeout_s=deadline))


def handler(channels: list[int] = CHANNELS) -> BarrierHandler:
    return BarrierHandler(channels)


def done(s: BarrierSpec, *, unaligned: bool = False) -> list:
    """What closes an aligned or at-least-once checkpoint: snapshot, unblock, inputs complete."""
    return [Snapshot(s, unaligned=unaligned), UnblockAll(), InputsComplete(s, unaligned)]


# --- aligned ---------------------------------------------------------------------------------------


def test_aligned_blocks_each_channel_until_the_last_barrier_then_snapshots():
    h, s = handler(), spec()
    assert h.on_barrier(0, s, priority=False, now=1.0) == [Block(0)]
    assert h.blocking
    assert h.on_barrier(1, s, priority=False, now=1.1) == [Block(1)]
    assert h.on_barrier(2, s, priority=False, now=1.2) == [Block(2), *done(s)]
    assert not h.blocking
    assert h.pending is None and h.last_finished == 1


def test_aligned_single_channel_snapshots_at_once():
    h, s = handler([7]), spec()
    assert h.on_barrier(7, s, priority=False, now=0.0) == [Block(7), *done(s)]


def test_aligned_channel_ending_while_aligning_completes_the_checkpoint():
    h, s = handler(), spec()
    assert h.on_barrier(0, s, priority=False, now=0.0) == [Block(0)]
    assert h.on_barrier(1, s, priority=False, now=0.0) == [Block(1)]
    assert h.on_channel_ended(2) == done(s)


def test_aligned_channel_ended_before_the_checkpoint_is_not_waited_for():
    h, s = handler(), spec()
    assert h.on_channel_ended(2) == []
    assert h.on_barrier(0, s, priority=False, now=0.0) == [Block(0)]
    assert h.on_barrier(1, s, priority=False, now=0.0) == [Block(1), *done(s)]


def test_end_of_every_partition_without_a_checkpoint_does_nothing():
    h = handler()
    assert [h.on_channel_ended(c) for c in CHANNELS] == [[], [], []]
    assert h.pending is None


def test_newer_barrier_abandons_the_checkpoint_being_aligned():
    h, s1, s2 = handler(), spec(1), spec(2)
    assert h.on_barrier(0, s1, priority=False, now=0.0) == [Block(0)]
    assert h.on_barrier(1, s2, priority=False, now=0.0) == [Abandon(1), UnblockAll(), Block(1)]
    assert h.on_barrier(0, s1, priority=False, now=0.0) == []  # a late one of the abandoned checkpoint
    assert h.on_barrier(0, s2, priority=False, now=0.0) == [Block(0)]
    assert h.on_barrier(2, s2, priority=False, now=0.0) == [Block(2), *done(s2)]


def test_late_barrier_of_a_finished_checkpoint_is_ignored():
    h, s = handler([0]), spec(3)
    assert h.on_barrier(0, s, priority=False, now=0.0) == [Block(0), *done(s)]
    assert h.on_barrier(0, spec(2), priority=False, now=0.0) == []
    assert h.on_barrier(0, s, priority=True, now=0.0) == []


def test_cancellation_of_the_pending_checkpoint_unblocks_and_ignores_its_later_barriers():
    h, s = handler(), spec(1)
    assert h.on_barrier(0, s, priority=False, now=0.0) == [Block(0)]
    assert h.abort(1) == [Abandon(1), UnblockAll()]
    assert not h.blocking
    assert h.on_barrier(1, s, priority=False, now=0.0) == []
    assert h.on_barrier(2, s, priority=False, now=0.0) == []


def test_cancellation_before_any_barrier_arrived_makes_its_barriers_late():
    h, s = handler(), spec(4)
    assert h.abort(4) == []
    assert h.on_barrier(0, s, priority=False, now=0.0) == []
    assert h.on_barrier(0, spec(5), priority=False, now=0.0) == [Block(0)]


def test_cancellation_of_another_checkpoint_leaves_the_pending_one_alone():
    h, s = handler(), spec(2)
    assert h.on_barrier(0, s, priority=False, now=0.0) == [Block(0)]
    assert h.abort(1) == []
    assert h.blocking
    assert h.on_barrier(1, s, priority=False, now=0.0) == [Block(1)]


def test_barrier_twice_on_one_channel_and_barrier_on_an_unknown_channel_are_errors():
    h, s = handler(), spec()
    h.on_barrier(0, s, priority=False, now=0.0)
    with pytest.raises(ValueError, match="twice on channel 0"):
        h.on_barrier(0, s, priority=False, now=0.0)
    with pytest.raises(ValueError, match="channel 9, not an input"):
        h.on_barrier(9, s, priority=False, now=0.0)


# --- unaligned -------------------------------------------------------------------------------------


def test_unaligned_first_barrier_snapshots_at_once_and_blocks_nothing():
    h, s = handler(), spec(mode="unaligned")
    assert h.on_barrier(1, s, priority=True, now=0.0) == [Snapshot(s, unaligned=True), UnblockAll()]
    assert not h.blocking
    assert h.on_barrier(0, s, priority=True, now=0.0) == []
    assert h.on_barrier(2, s, priority=True, now=0.0) == [InputsComplete(s, True)]
    assert h.last_finished == 1


def test_unaligned_single_channel_completes_with_the_first_barrier():
    h, s = handler([0]), spec(mode="unaligned")
    assert h.on_barrier(0, s, priority=True, now=0.0) == [Snapshot(s, unaligned=True), UnblockAll(),
                                                          InputsComplete(s, True)]


def test_unaligned_channel_ending_after_the_snapshot_completes_the_inputs():
    h, s = handler(), spec(mode="unaligned")
    assert h.on_barrier(0, s, priority=True, now=0.0) == [Snapshot(s, unaligned=True), UnblockAll()]
    assert h.on_channel_ended(1) == []
    assert h.on_channel_ended(2) == [InputsComplete(s, True)]


def test_unaligned_in_band_barrier_reaching_the_gate_counts_as_delivered_and_is_not_counted_twice():
    h, s = handler(), spec(mode="unaligned")
    assert h.on_barrier(0, s, priority=True, now=0.0) == [Snapshot(s, unaligned=True), UnblockAll()]
    assert h.on_arrival(1, s) == []  # counted now: the data before it is channel state
    assert h.on_barrier(1, s, priority=False, now=0.0) == []  # taken later: already counted
    assert h.on_arrival(2, s) == [InputsComplete(s, True)]


# --- an end of partition waiting in the gate (FLIP-147: a finished input) ----------------------------


def test_unaligned_end_waiting_in_the_gate_counts_as_delivered_for_this_and_later_checkpoints():
    h, s1, s2 = handler(), spec(1, "unaligned"), spec(2, "unaligned")
    assert h.on_end_arrival(2) == []  # no checkpoint yet
    assert h.on_barrier(0, s1, priority=True, now=0.0) == [Snapshot(s1, unaligned=True), UnblockAll()]
    assert h.on_barrier(1, s1, priority=True, now=0.1) == [InputsComplete(s1, True)]  # channel 2 not waited for
    assert h.on_barrier(0, s2, priority=True, now=1.0) == [Snapshot(s2, unaligned=True), UnblockAll()]
    assert h.on_channel_ended(2) == []  # taken at last: ended from now on
    assert h.on_barrier(1, s2, priority=True, now=1.1) == [InputsComplete(s2, True)]


def test_unaligned_end_arriving_after_the_snapshot_completes_the_inputs():
    h, s = handler(), spec(mode="unaligned")
    assert h.on_barrier(0, s, priority=True, now=0.0) == [Snapshot(s, unaligned=True), UnblockAll()]
    assert h.on_barrier(1, s, priority=True, now=0.0) == []
    assert h.on_end_arrival(2) == [InputsComplete(s, True)]
    assert h.on_end_arrival(1) == []  # its barrier came first (it overtook the end at the producer)


def test_aligned_waits_for_an_end_waiting_in_the_gate_to_be_taken():
    h, s = handler(), spec()
    assert h.on_end_arrival(2) == []
    assert h.on_barrier(0, s, priority=False, now=0.0) == [Block(0)]
    assert h.on_barrier(1, s, priority=False, now=0.0) == [Block(1)]  # the data before the end comes first
    assert h.on_channel_ended(2) == done(s)


def test_aligned_timeout_counts_an_end_waiting_in_the_gate_when_it_switches():
    h, s = handler(), spec(mode="aligned_timeout", deadline=5.0)
    assert h.on_end_arrival(2) == []
    assert h.on_barrier(0, s, priority=False, now=1.0) == [Block(0)]
    assert h.on_time(5.0, s) == [Snapshot(s, unaligned=True), UnblockAll()]
    assert h.on_barrier(1, s, priority=False, now=5.1) == [InputsComplete(s, True)]


def test_a_trigger_with_every_input_ended_takes_an_unaligned_checkpoint_at_once():
    # issue 32: both sources past their end, their ends queued behind seconds of data: no barrier can come
    h, s1, s2 = handler(), spec(1, "unaligned"), spec(2, "unaligned")
    assert h.on_channel_ended(0) == []  # taken already
    assert h.on_end_arrival(1) == []
    assert not h.inputs_ended
    assert h.on_trigger(s1, now=0.0) == []  # channel 2 is open: its barrier will come
    assert h.on_end_arrival(2) == []
    assert h.inputs_ended
    assert h.on_trigger(s1, now=0.5) == [Snapshot(s1, unaligned=True), UnblockAll(), InputsComplete(s1, True)]
    assert h.pending is None and h.last_finished == 1
    assert h.on_trigger(s1, now=0.6) == []  # taken once
    assert h.on_channel_ended(1) == []  # the data before the end processed meanwhile
    assert h.on_trigger(s2, now=1.0) == [Snapshot(s2, unaligned=True), UnblockAll(), InputsComplete(s2, True)]


def test_a_trigger_with_every_input_ended_leaves_aligned_and_aborted_checkpoints_to_the_end_of_input():
    h, a1, u2 = handler([0, 1]), spec(1), spec(2, "unaligned")
    h.on_end_arrival(0)
    h.on_end_arrival(1)
    assert h.on_trigger(a1, now=0.0) == []  # its snapshot must follow the queued data
    assert h.on_trigger(spec(1, "at_least_once"), now=0.0) == []
    assert h.abort(2) == []
    assert h.on_trigger(u2, now=0.1) == []
    assert h.pending is None


def test_a_trigger_with_every_input_ended_leaves_a_checkpoint_in_progress_to_its_ends():
    h, a1, u2 = handler([0, 1]), spec(1), spec(2, "unaligned")
    assert h.on_barrier(0, a1, priority=False, now=0.0) == [Block(0)]
    assert h.on_end_arrival(1) == []  # aligned: waits until the end is taken
    assert h.on_channel_ended(0) == []
    assert h.inputs_ended
    assert h.on_trigger(u2, now=0.1) == []
    assert h.on_channel_ended(1) == done(a1)


def test_end_of_partition_on_an_unknown_channel_is_an_error():
    with pytest.raises(ValueError, match="not an input"):
        handler().on_end_arrival(9)


# --- aligned with timeout --------------------------------------------------------------------------


def test_aligned_timeout_before_the_deadline_aligns():
    h, s = handler(), spec(mode="aligned_timeout", deadline=5.0)
    assert h.on_barrier(0, s, priority=False, now=1.0) == [Block(0)]
    assert h.on_time(4.9, s) == []
    assert h.on_barrier(1, s, priority=False, now=2.0) == [Block(1)]
    assert h.on_barrier(2, s, priority=False, now=3.0) == [Block(2), *done(s)]
    assert h.on_time(6.0, s) == []  # finished: the deadline no longer matters


def test_aligned_timeout_switches_to_unaligned_at_the_deadline():
    h, s = handler(), spec(mode="aligned_timeout", deadline=5.0)
    assert h.on_barrier(0, s, priority=False, now=1.0) == [Block(0)]
    assert h.on_time(5.0, s) == [Snapshot(s, unaligned=True), UnblockAll()]
    assert h.on_time(5.5, s) == []  # already switched
    assert h.on_barrier(1, s, priority=False, now=6.0) == []
    assert h.on_barrier(2, s, priority=False, now=6.1) == [InputsComplete(s, True)]


def test_aligned_timeout_switches_even_when_no_barrier_was_taken_yet():
    h, s = handler(), spec(mode="aligned_timeout", deadline=5.0)
    assert h.on_time(5.0, s) == [Snapshot(s, unaligned=True), UnblockAll()]
    assert [h.on_barrier(c, s, priority=False, now=6.0) for c in CHANNELS] == [[], [], [InputsComplete(s, True)]]


def test_aligned_timeout_barriers_queued_in_the_gate_count_when_it_switches():
    h, s = handler(), spec(mode="aligned_timeout", deadline=5.0)
    assert h.on_arrival(1, s) == []  # waits behind data, not taken yet
    assert h.on_arrival(2, s) == []
    assert h.on_time(5.0, s) == [Snapshot(s, unaligned=True), UnblockAll()]
    assert h.on_barrier(0, s, priority=False, now=5.1) == [InputsComplete(s, True)]
    assert h.on_barrier(1, s, priority=False, now=5.2) == []  # late: the checkpoint finished here


def test_aligned_timeout_priority_barrier_switches_before_the_deadline():
    h, s = handler(), spec(mode="aligned_timeout", deadline=5.0)
    assert h.on_barrier(0, s, priority=False, now=1.0) == [Block(0)]
    assert h.on_barrier(1, s, priority=True, now=1.5) == [Snapshot(s, unaligned=True), UnblockAll()]
    assert h.on_barrier(2, s, priority=False, now=2.0) == [InputsComplete(s, True)]


def test_deadline_of_a_newer_checkpoint_abandons_the_older_one():
    h, s1, s2 = handler(), spec(1, "aligned_timeout", deadline=5.0), spec(2, "aligned_timeout", deadline=8.0)
    assert h.on_barrier(0, s1, priority=False, now=1.0) == [Block(0)]
    assert h.on_time(8.0, s2) == [Abandon(1), UnblockAll(), Snapshot(s2, unaligned=True), UnblockAll()]


def test_on_time_ignores_other_modes_and_specs_without_a_deadline():
    h = handler()
    assert h.on_time(100.0, spec(mode="aligned", deadline=1.0)) == []
    assert h.on_time(100.0, spec(mode="aligned_timeout", deadline=None)) == []
    assert h.pending is None


# --- at least once ---------------------------------------------------------------------------------


def test_at_least_once_blocks_nothing_and_snapshots_with_the_last_barrier():
    h, s = handler(), spec(mode="at_least_once")
    assert h.on_barrier(0, s, priority=False, now=0.0) == []
    assert h.on_barrier(1, s, priority=True, now=0.0) == []  # the lane does not matter
    assert h.on_barrier(2, s, priority=False, now=0.0) == done(s)


def test_at_least_once_channel_ending_completes_the_checkpoint():
    h, s = handler(), spec(mode="at_least_once")
    assert h.on_barrier(0, s, priority=False, now=0.0) == []
    assert h.on_channel_ended(1) == []
    assert h.on_channel_ended(2) == done(s)


def test_at_least_once_newer_barrier_abandons_without_blocking():
    h = handler()
    s1, s2 = spec(1, "at_least_once"), spec(2, "at_least_once")
    assert h.on_barrier(0, s1, priority=False, now=0.0) == []
    assert h.on_barrier(0, s2, priority=False, now=0.0) == [Abandon(1), UnblockAll()]


# --- aligned with per-channel switching --------------------------------------------------------------


def switching(*, timeout: float | None = 0.01, nbytes: int | None = None, cap: int | None = None) -> BarrierSpec:
    return BarrierSpec(1, 0.0, CheckpointOptions(channel_timeout_s=timeout, channel_inflight_bytes=nbytes,
                                                 max_inflight_bytes=cap))


def mixed(s: BarrierSpec) -> list:
    return [Snapshot(s, unaligned=False, record_inputs=True), UnblockAll(), InputsComplete(s, True)]


def test_a_barrier_behind_too_much_data_switches_its_channel_and_the_others_stay_aligned():
    h, s = handler(), switching(timeout=None, nbytes=100)
    assert h.on_barrier(0, s, priority=False, now=0.0) == [Block(0)]
    assert h.on_arrival(1, s, now=0.0, bytes_ahead=100) == []  # not over the threshold: stays aligned
    assert h.on_arrival(2, s, now=0.0, bytes_ahead=101) == []  # switched, but channel 1 is still aligning
    assert h.pending is not None and h.pending.switched == {2: 101}
    assert h.on_barrier(1, s, priority=False, now=0.1) == [Block(1), *mixed(s)]
    assert h.on_barrier(2, s, priority=False, now=0.2) == []  # the switched channel's barrier, taken later


def test_a_barrier_that_waited_its_channel_timeout_switches_at_the_timer():
    h, s = handler([0, 1]), switching(timeout=0.01)
    assert h.on_barrier(0, s, priority=False, now=0.0) == [Block(0)]
    assert h.on_arrival(1, s, now=0.0, bytes_ahead=5000) == []
    assert h.on_time(0.005, s) == []
    assert h.on_time(0.010, s) == mixed(s)


def test_a_switched_channel_whose_barrier_is_taken_before_the_snapshot_is_aligned_after_all():
    h, s = handler(), switching(timeout=None, nbytes=10, cap=1000)
    assert h.on_arrival(1, s, now=0.0, bytes_ahead=500) == []  # switched: its data is still processed
    assert h.budget.used[1] == 500
    assert h.on_barrier(1, s, priority=False, now=0.1) == [Block(1)]  # its data all went before the snapshot
    assert h.budget.used[1] == 0 and h.pending is not None and h.pending.switched == {}
    assert h.on_barrier(0, s, priority=False, now=0.2) == [Block(0)]
    assert h.on_barrier(2, s, priority=False, now=0.3) == [Block(2), *done(s)]  # aligned: nothing recorded


def test_the_cap_keeps_a_channel_aligned_when_its_data_does_not_fit():
    h, s = handler(), switching(timeout=0.01, cap=1000)
    assert h.on_arrival(0, s, now=0.0, bytes_ahead=600) == []
    assert h.on_arrival(1, s, now=0.0, bytes_ahead=600) == []
    assert h.on_time(0.02, s) == []  # channel 0 switched (600), channel 1 would exceed the cap
    assert h.pending is not None and h.pending.switched == {0: 600} and h.budget.refused == 1
    assert h.on_barrier(1, s, priority=False, now=0.1) == [Block(1)]  # aligned: its data was processed
    assert h.on_barrier(2, s, priority=False, now=0.1) == [Block(2), *mixed(s)]


def test_a_priority_barrier_of_a_switching_checkpoint_blocks_its_channel_until_the_snapshot():
    h, s = handler([0, 1]), switching(timeout=0.01)
    # its sender promoted it: what the gate holds before it is recorded, what follows must wait
    assert h.on_barrier(0, s, priority=True, now=0.0, queued_bytes=300) == [Block(0)]
    assert h.budget.used[1] == 300
    assert h.on_barrier(1, s, priority=False, now=0.1) == [Block(1), *mixed(s)]


def test_savepoints_never_switch_channels():
    s = BarrierSpec(1, 0.0, CheckpointOptions(savepoint=True, channel_timeout_s=0.01, channel_inflight_bytes=1))
    assert not s.switching and BarrierSpec.from_body(s.to_body()) == s
    h = handler([0, 1])
    assert h.on_arrival(1, s, now=0.0, bytes_ahead=10_000) == []
    assert h.on_time(5.0, s) == []
    assert h.on_barrier(0, s, priority=False, now=0.0) == [Block(0)]


def test_a_switching_spec_survives_the_wire():
    s = switching(timeout=0.01, nbytes=4096, cap=1 << 20)
    assert BarrierSpec.from_body(s.to_body()) == s


# --- concurrent checkpoints -----------------------------------------------------------------------------------


def test_a_newer_barrier_waits_blocked_until_the_older_unaligned_checkpoint_has_its_inputs():
    h, u1, u2 = handler(), spec(1, "unaligned"), spec(2, "unaligned")
    assert h.on_barrier(0, u1, priority=True, now=0.0) == [Snapshot(u1, unaligned=True), UnblockAll()]
    assert h.on_barrier(0, u2, priority=True, now=0.1) == [Block(0)]  # 1 still records channels 1 and 2
    assert h.on_barrier(1, u1, priority=True, now=0.2) == []
    # 1's inputs are complete: 2 is handled at once, as its first barrier
    assert h.on_barrier(2, u1, priority=True, now=0.3) == [
        InputsComplete(u1, True), UnblockAll(), Snapshot(u2, unaligned=True), UnblockAll()]
    assert h.pending is not None and h.pending.spec == u2 and h.pending.seen == {0}


def test_a_savepoint_barrier_during_an_unaligned_checkpoint_aligns_after_it():
    h, u1, sp = handler([0, 1]), spec(1, "unaligned"), BarrierSpec(2, 0.0, CheckpointOptions(savepoint=True))
    assert h.on_barrier(0, u1, priority=True, now=0.0) == [Snapshot(u1, unaligned=True), UnblockAll()]
    assert h.on_barrier(0, sp, priority=False, now=0.1) == [Block(0)]
    assert h.on_barrier(1, u1, priority=True, now=0.2) == [InputsComplete(u1, True), UnblockAll(), Block(0)]
    assert h.on_barrier(1, sp, priority=False, now=0.3) == [Block(1), *done(sp)]


def test_a_held_back_barrier_of_an_aborted_checkpoint_unblocks_its_channel():
    h, u1, u2 = handler([0, 1]), spec(1, "unaligned"), spec(2, "unaligned")
    h.on_barrier(0, u1, priority=True, now=0.0)
    assert h.on_barrier(0, u2, priority=True, now=0.1) == [Block(0)]
    assert h.abort(2) == []
    assert h.on_barrier(1, u1, priority=True, now=0.2) == [InputsComplete(u1, True), UnblockAll()]
    assert h.pending is None


def test_a_savepoint_in_band_behind_an_aligned_checkpoint_aligns_right_after_it_and_abandons_nothing():
    """Why the coordinator starts a savepoint beside a periodic aligned checkpoint (may_overlap): in each channel the
    savepoint's barrier follows checkpoint 1's, and the channel that delivered 1's stays blocked, so 2's can only
    be taken once 1 has its snapshot here."""
    h, a1, sp = handler([0, 1]), spec(1), BarrierSpec(2, 0.0, CheckpointOptions(savepoint=True))
    assert h.on_barrier(0, a1, priority=False, now=0.0) == [Block(0)]
    assert h.on_arrival(0, sp, now=0.1, bytes_ahead=100) == []  # queued behind it in channel 0's gate: nothing yet
    assert h.on_barrier(1, a1, priority=False, now=0.2) == [Block(1), *done(a1)]
    assert h.on_barrier(0, sp, priority=False, now=0.3) == [Block(0)]
    assert h.on_barrier(1, sp, priority=False, now=0.4) == [Block(1), *done(sp)]
    assert h.last_finished == 2 and h.pending is None


def test_a_newer_checkpoint_aborted_before_the_older_one_arrived_leaves_the_older_one_alone():
    """A savepoint aborted (its directory failed) while the periodic checkpoint beside it is still on its way: the
    periodic one's barriers are not made late, and the savepoint's are ignored when they come."""
    h, a1, sp = handler([0, 1]), spec(1), BarrierSpec(2, 0.0, CheckpointOptions(savepoint=True))
    assert h.abort(2) == []
    assert h.gave_up(2) and not h.gave_up(1)
    assert h.on_barrier(0, a1, priority=False, now=0.0) == [Block(0)]
    assert h.on_barrier(1, a1, priority=False, now=0.1) == [Block(1), *done(a1)]
    assert h.on_barrier(0, sp, priority=False, now=0.2) == []
    assert h.on_barrier(1, sp, priority=False, now=0.3) == []
    assert h.pending is None and h.gave_up(2)


# --- a savepoint aligning beside a newer unaligned checkpoint -----------------------------------------------------


def savepoint(checkpoint_id: int) -> BarrierSpec:
    return BarrierSpec(checkpoint_id, 0.0, CheckpointOptions(savepoint=True))


def test_an_unaligned_barrier_reaching_a_task_aligning_a_savepoint_is_taken_beside_it_not_instead():
    """The unaligned checkpoint snapshots at once, its channel state recording the blocked channel's data after the
    savepoint's barrier; the savepoint's channel stays blocked through every unblock, its barriers keep coming
    in-band, and it snapshots when they are all in, after the newer one."""
    h, sp, u = handler(), savepoint(2), spec(3, "unaligned")
    assert h.on_barrier(0, sp, priority=False, now=0.0) == [Block(0)]
    assert h.on_barrier(1, u, priority=True, now=0.1) == [Snapshot(u, unaligned=True), UnblockAll(frozenset({0}))]
    assert h.blocking is False and h.overtaken is not None
    assert h.on_barrier(1, sp, priority=False, now=0.2) == [Block(1)]
    assert h.on_barrier(0, u, priority=True, now=0.3) == []  # a blocked channel still delivers priority barriers
    assert h.on_barrier(2, u, priority=True, now=0.4) == [InputsComplete(u, True)]
    assert not h.gave_up(2) and h.gave_up(3)
    assert h.on_barrier(2, sp, priority=False, now=0.5) == [Block(2), *done(sp)]
    assert h.gave_up(2) and h.overtaken is None and h.pending is None and h.last_finished == 3


def test_the_old_rule_still_abandons_an_aligned_checkpoint_that_is_no_savepoint():
    h, a, u = handler([0, 1]), spec(2), spec(3, "unaligned")
    assert h.on_barrier(0, a, priority=False, now=0.0) == [Block(0)]
    assert h.on_barrier(1, u, priority=True, now=0.1) == [Abandon(2), UnblockAll(), Snapshot(u, unaligned=True),
                                                           UnblockAll()]


@pytest.mark.parametrize("finished_first", [False, True])
def test_a_savepoint_whose_barriers_come_after_a_newer_unaligned_one_aligns_and_is_not_late(finished_first):
    """The unaligned barriers overtook the savepoint's upstream (a task took them beside it): here the savepoint's
    first barrier comes while the newer one records, or after it finished."""
    h, sp, u = handler([0, 1]), savepoint(2), spec(3, "unaligned")
    assert h.on_barrier(0, u, priority=True, now=0.0) == [Snapshot(u, unaligned=True), UnblockAll()]
    if finished_first:
        assert h.on_barrier(1, u, priority=True, now=0.1) == [InputsComplete(u, True)]
    assert h.on_barrier(0, sp, priority=False, now=0.2) == [Block(0)]
    if not finished_first:
        assert h.on_barrier(1, u, priority=True, now=0.3) == [InputsComplete(u, True)]
    assert h.on_barrier(1, sp, priority=False, now=0.4) == [Block(1), *done(sp)]


def test_a_barrier_held_back_behind_the_unaligned_one_beside_a_savepoint_keeps_both_channels_blocked():
    h, sp, u, v = handler(), savepoint(2), spec(3, "unaligned"), spec(5, "unaligned")
    assert h.on_barrier(0, sp, priority=False, now=0.0) == [Block(0)]
    assert h.on_barrier(1, u, priority=True, now=0.1) == [Snapshot(u, unaligned=True), UnblockAll(frozenset({0}))]
    assert h.on_barrier(1, v, priority=True, now=0.2) == [Block(1)]  # held back: 3 still records
    assert h.on_barrier(0, u, priority=True, now=0.3) == []
    assert h.on_barrier(2, u, priority=True, now=0.4) == [
        InputsComplete(u, True), UnblockAll(frozenset({0})), Snapshot(v, unaligned=True), UnblockAll(frozenset({0}))]
    assert h.on_barrier(1, sp, priority=False, now=0.5) == [Block(1)]
    assert h.on_barrier(2, sp, priority=False, now=0.6) == [Block(2), *done(sp)]
    assert h.pending is not None and h.pending.spec == v  # still recording channels 0 and 2


def test_a_savepoint_aborted_beside_an_unaligned_checkpoint_unblocks_its_channels_and_its_barriers_are_late():
    h, sp, u = handler([0, 1]), savepoint(2), spec(3, "unaligned")
    assert h.on_barrier(0, sp, priority=False, now=0.0) == [Block(0)]
    assert h.on_barrier(1, u, priority=True, now=0.1) == [Snapshot(u, unaligned=True), UnblockAll(frozenset({0}))]
    assert h.abort(2) == [Abandon(2), UnblockAll()]
    assert h.on_barrier(1, sp, priority=False, now=0.2) == []
    assert h.on_barrier(0, u, priority=True, now=0.3) == [InputsComplete(u, True)]


def test_a_savepoint_beside_an_unaligned_checkpoint_completes_when_its_last_open_channel_ends():
    h, sp, u = handler([0, 1]), savepoint(2), spec(3, "unaligned")
    h.on_barrier(0, sp, priority=False, now=0.0)
    h.on_barrier(1, u, priority=True, now=0.1)
    assert h.on_channel_ended(1) == done(sp)  # channel 0 delivered the savepoint's barrier, 1 ended
    assert h.on_barrier(0, u, priority=True, now=0.2) == [InputsComplete(u, True)]
