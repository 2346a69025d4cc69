"""CheckpointCoordinator: exact instruction lists for each sequence, then a hypothesis state machine."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from coordinator.checkpointing import (
    HISTORY_SIZE,
    CheckpointCoordinator,
    CheckpointSettings,
    DiscardCheckpoint,
    FailJob,
    NotifyAborted,
    NotifyComplete,
    Status,
    Trigger,
    WriteMetadata,
    may_overlap,
)
from runtime.graph.checkpoint_figures import CheckpointFigures, TaskCheckpointFigures
from runtime.graph.checkpoint_options import CheckpointOptions
from runtime.graph.enums import CheckpointMode

TASKS = frozenset({"map-0", "sink-0"})


def coordinator(now: float = 0.0, **kw) -> CheckpointCoordinator:
    kw.setdefault("interval_s", 10.0)
    return CheckpointCoordinator(CheckpointSettings(**kw), TASKS, now=now)


def trig(n: int, at: float, mode: str = "aligned", *, savepoint: bool = False, directory: str | None = None,
         aligned_timeout_s: float | None = None) -> Trigger:
    return Trigger(n, CheckpointOptions(CheckpointMode(mode), savepoint, aligned_timeout_s), directory, at)


def fig(state_bytes: int = 0, inflight_bytes: int = 0, alignment_s: float = 0.0,
        start_delay_s: float = 0.0) -> TaskCheckpointFigures:
    return TaskCheckpointFigures(state_bytes=state_bytes, inflight_bytes=inflight_bytes, alignment_s=alignment_s,
                                 start_delay_s=start_delay_s)


def ack_all(c: CheckpointCoordinator, n: int, now: float) -> list:
    out = c.ack(now, n, "map-0", {"h": "m"}, fig(100))
    assert out == []
    return c.ack(now, n, "sink-0", {"h": "s"}, fig(20))


def complete(c: CheckpointCoordinator, n: int, now: float) -> list:
    [write] = ack_all(c, n, now)
    assert isinstance(write, WriteMetadata) and write.checkpoint_id == n
    return c.metadata_written(now, n)


# -- settings ---------------------------------------------------------------------------


def test_unknown_mode_names_the_accepted_ones():
    with pytest.raises(ValueError, match="aligned, unaligned, aligned_timeout, at_least_once"):
        CheckpointSettings(interval_s=1.0, mode="exactly_twice")
    c = coordinator()
    with pytest.raises(ValueError, match="accepted modes"):
        c.request(0.0, mode="bogus")


def test_aligned_timeout_mode_needs_its_timeout():
    with pytest.raises(ValueError, match="aligned_timeout_s"):
        CheckpointSettings(interval_s=1.0, mode="aligned_timeout")
    with pytest.raises(ValueError, match="aligned_timeout_s"):
        coordinator().request(0.0, mode="aligned_timeout")


@pytest.mark.parametrize("kw", [{"interval_s": 0}, {"timeout_s": 0}, {"min_pause_s": -1},
                                {"tolerable_failures": -1}, {"retain": 0}])
def test_bad_settings_rejected(kw):
    with pytest.raises(ValueError):
        CheckpointSettings(**{"interval_s": 1.0, **kw})


# -- periodic triggers ------------------------------------------------------------------


def test_periodic_trigger_after_interval():
    c = coordinator(now=100.0)
    assert c.tick(105.0) == []
    assert c.tick(109.99) == []
    assert c.tick(110.0) == [trig(1, 110.0)]
    assert c.in_flight_id == 1


def test_no_periodic_checkpoints_without_interval():
    c = coordinator(interval_s=None)
    assert c.tick(1e9) == []


def test_mode_and_aligned_timeout_are_passed_on():
    c = coordinator(mode="aligned_timeout", aligned_timeout_s=0.5)
    assert c.tick(10.0) == [trig(1, 10.0, "aligned_timeout", aligned_timeout_s=0.5)]


def test_periodic_due_while_in_flight_is_skipped_then_waits_for_min_pause():
    c = coordinator(interval_s=10.0, min_pause_s=4.0, timeout_s=100.0)
    assert c.tick(10.0) == [trig(1, 10.0)]
    assert c.tick(20.0) == []  # due, but 1 is in flight: skipped
    assert c.tick(35.0) == []
    assert ack_all(c, 1, 36.0) != []
    assert c.metadata_written(37.0, 1) == [NotifyComplete(1)]
    assert c.tick(40.0) == []  # interval long gone, but only 3 s since 1 ended
    assert c.tick(41.0) == [trig(2, 41.0)]
    assert c.tick(50.0) == []  # interval counts from the last trigger (41)


def test_interval_counts_from_the_last_trigger_including_manual_ones():
    c = coordinator(interval_s=10.0)
    assert c.request(5.0) == (1, [trig(1, 5.0)])
    complete(c, 1, 6.0)
    assert c.tick(10.0) == []
    assert c.tick(15.0) == [trig(2, 15.0)]


# -- completion, figures, retention -----------------------------------------------------


def test_all_acks_write_metadata_then_complete():
    c = coordinator()
    c.tick(10.0)
    assert c.ack(11.0, 1, "map-0", {"file": "a"}, fig(100, 5, 0.25, 0.5)) == []
    assert c.ack(12.5, 1, "sink-0", {"file": "b"}, fig(20, 7, 0.75, 0.125)) == [WriteMetadata(
        checkpoint_id=1, directory=None, savepoint=False, mode="aligned",
        acks={"map-0": {"state": {"file": "a"}, "figures": fig(100, 5, 0.25, 0.5).to_wire()},
              "sink-0": {"state": {"file": "b"}, "figures": fig(20, 7, 0.75, 0.125).to_wire()}},
        started_at=10.0, completed_at=12.5)]
    assert c.statistics().in_flight_id == 1  # still in flight until _metadata is written
    assert c.metadata_written(13.0, 1) == [NotifyComplete(1)]
    stats = c.statistics()
    assert (stats.completed, stats.failed, stats.in_flight_id, stats.last_completed_id) == (1, 0, None, 1)
    last = stats.last_completed
    assert last is not None
    assert (last.status, last.duration_s) == (Status.COMPLETED, 2.5)
    assert last.figures == CheckpointFigures(state_bytes=120, inflight_bytes=12, alignment_s=0.75, start_delay_s=0.5)


def test_retention_discards_oldest_completed_checkpoints():
    c = coordinator(interval_s=1.0, retain=2)
    results = {}
    for n in (1, 2, 3, 4):
        assert c.tick(10.0 * n) == [trig(n, 10.0 * n)]
        results[n] = complete(c, n, 10.0 * n + 1)
    assert results[1] == [NotifyComplete(1)]
    assert results[2] == [NotifyComplete(2)]
    assert results[3] == [NotifyComplete(3), DiscardCheckpoint(1, "retention")]
    assert results[4] == [NotifyComplete(4), DiscardCheckpoint(2, "retention")]


def test_retention_covers_checkpoints_from_an_earlier_attempt_and_skips_savepoints():
    c = CheckpointCoordinator(CheckpointSettings(interval_s=None, retain=2), TASKS, first_id=8, now=0.0,
                              retained=[5, 7])
    assert c.request(1.0, savepoint=True, directory="/sp") == (8, [trig(8, 1.0, savepoint=True, directory="/sp")])
    # savepoints are never retention's to delete, and commit nothing (the tasks are not told)
    assert complete(c, 8, 2.0) == [NotifyComplete(8, tasks=False)]
    assert c.request(3.0) == (9, [trig(9, 3.0)])
    assert complete(c, 9, 4.0) == [NotifyComplete(9), DiscardCheckpoint(5, "retention")]


def test_only_a_savepoint_the_job_stops_with_commits():
    """A savepoint commits no side effects (its sinks' output waits for the next checkpoint); one the job stops
    with (cancel --savepoint, upgrade) does, since no checkpoint follows it."""
    c = CheckpointCoordinator(CheckpointSettings(interval_s=None), TASKS, now=0.0)
    assert c.request(1.0, savepoint=True, directory="/sp")[0] == 1
    assert complete(c, 1, 2.0) == [NotifyComplete(1, tasks=False)]
    assert c.request(3.0, savepoint=True, directory="/sp", stopping=True)[0] == 2
    assert complete(c, 2, 4.0) == [NotifyComplete(2)]
    assert c.request(5.0, stopping=True)[0] == 3  # a checkpoint commits whatever it is asked for
    assert complete(c, 3, 6.0) == [NotifyComplete(3)]


# -- aborts and failure accounting ------------------------------------------------------


def test_timeout_aborts():
    c = coordinator(timeout_s=5.0)
    c.tick(10.0)
    assert c.tick(14.9) == []
    assert c.tick(15.0) == [NotifyAborted(1, "timeout after 5 s"), DiscardCheckpoint(1, "timeout after 5 s"),
                            FailJob("checkpoint 1 failed (timeout after 5 s); "
                                    "1 consecutive checkpoint failures exceed tolerable_failures=0")]


def test_decline_aborts_and_counts():
    c = coordinator(tolerable_failures=1)
    c.tick(10.0)
    reason = "declined by sink-0: state too large"
    assert c.decline(11.0, 1, "sink-0", "state too large") == [NotifyAborted(1, reason),
                                                                DiscardCheckpoint(1, reason)]
    stats = c.statistics()
    assert (stats.completed, stats.failed, stats.consecutive_failures, stats.in_flight_id) == (0, 1, 1, None)
    assert c.history()[-1].failure_reason == reason


def test_tolerable_failures_then_fail_job_and_everything_after_is_ignored():
    c = coordinator(interval_s=10.0, timeout_s=3.0, tolerable_failures=2)
    for n in (1, 2):
        c.tick(10.0 * n)
        assert c.tick(10.0 * n + 3) == [NotifyAborted(n, "timeout after 3 s"),
                                        DiscardCheckpoint(n, "timeout after 3 s")]
    assert c.tick(30.0) == [trig(3, 30.0)]
    assert c.decline(31.0, 3, "map-0", "disk full") == [
        NotifyAborted(3, "declined by map-0: disk full"),
        DiscardCheckpoint(3, "declined by map-0: disk full"),
        FailJob("checkpoint 3 failed (declined by map-0: disk full); "
                "3 consecutive checkpoint failures exceed tolerable_failures=2"),
    ]
    assert c.tick(100.0) == []
    assert c.request(101.0) == (4, [NotifyAborted(4, "job failed")])


def test_completed_checkpoint_resets_consecutive_failures():
    c = coordinator(interval_s=10.0, timeout_s=3.0, tolerable_failures=1)
    c.tick(10.0)
    assert len(c.tick(13.0)) == 2  # abort, tolerated
    c.tick(20.0)
    complete(c, 2, 21.0)
    assert c.statistics().consecutive_failures == 0
    c.tick(30.0)
    assert c.tick(33.0) == [NotifyAborted(3, "timeout after 3 s"), DiscardCheckpoint(3, "timeout after 3 s")]


def test_task_failure_aborts_pending_and_drops_queued_requests():
    c = coordinator(tolerable_failures=5, mode="at_least_once")  # a savepoint waits behind at-least-once
    c.tick(10.0)
    assert c.request(11.0, savepoint=True, directory="/sp") == (2, [])
    assert c.request(11.5) == (3, [])
    assert c.task_failed(12.0, "worker lost") == [
        NotifyAborted(1, "task failure: worker lost"),
        DiscardCheckpoint(1, "task failure: worker lost"),
        NotifyAborted(2, "task failure: worker lost"),
        NotifyAborted(3, "task failure: worker lost"),
    ]
    assert c.statistics().failed == 1  # the dropped requests were never triggered
    assert c.task_failed(13.0, "again") == []


def test_task_failure_does_not_abort_once_every_task_acked():
    c = coordinator()
    c.tick(10.0)
    ack_all(c, 1, 11.0)
    assert c.task_failed(12.0, "worker lost") == []
    assert c.tick(1000.0) == []  # no timeout while _metadata is being written
    assert c.metadata_written(1001.0, 1) == [NotifyComplete(1)]


def test_metadata_failure_aborts():
    c = coordinator(tolerable_failures=1)
    c.tick(10.0)
    ack_all(c, 1, 11.0)
    reason = "metadata write failed: No space left on device"
    assert c.metadata_failed(12.0, 1, "No space left on device") == [NotifyAborted(1, reason),
                                                                      DiscardCheckpoint(1, reason)]


def test_lost_files_make_every_later_checkpoint_full_until_one_completes():
    c = coordinator(tolerable_failures=5)
    c.tick(10.0)
    ack_all(c, 1, 11.0)
    assert c.metadata_failed(12.0, 1, "storage lost chk-1/a", files_lost=True)[0] == NotifyAborted(
        1, "storage lost chk-1/a")
    [t2] = c.tick(20.0)
    assert isinstance(t2, Trigger) and t2.options.full
    ack_all(c, 2, 21.0)
    c.metadata_failed(22.0, 2, "No space left on device")  # failed otherwise: the next is still full
    _, [sp] = c.request(23.0, savepoint=True, directory="/sp")
    assert isinstance(sp, Trigger) and sp.savepoint and not sp.options.full  # self-contained anyway
    complete(c, 3, 24.0)
    [t4] = c.tick(40.0)
    assert t4.options.full
    complete(c, 4, 41.0)
    [t5] = c.tick(60.0)
    assert not t5.options.full  # a full one completed: incremental again


def test_storage_failure_before_any_ack_aborts_and_counts_as_failed():
    c = coordinator(timeout_s=5.0, tolerable_failures=5)
    c.tick(10.0)
    reason = "checkpoint storage failed: cannot create its directory under /x: Not a directory"
    assert c.storage_failed(10.1, 1, "cannot create its directory under /x: Not a directory") == [
        NotifyAborted(1, reason), DiscardCheckpoint(1, reason)]
    assert c.statistics().failed == 1
    assert c.storage_failed(10.2, 1, "again") == []  # no longer in flight


def test_a_failed_trigger_aborts_the_checkpoint_at_once():
    c = coordinator(timeout_s=5.0, tolerable_failures=5)
    c.tick(10.0)
    reason = "trigger failed: connection to worker-2 lost"
    assert c.trigger_failed(10.1, 1, "connection to worker-2 lost") == [NotifyAborted(1, reason),
                                                                        DiscardCheckpoint(1, reason)]
    assert c.statistics().failed == 1
    assert c.trigger_failed(10.2, 1, "again") == []  # no longer in flight


def test_late_duplicate_and_unknown_messages_are_ignored():
    c = coordinator(timeout_s=5.0, tolerable_failures=5)
    c.tick(10.0)
    assert c.ack(11.0, 1, "map-0", {}, fig()) == []
    assert c.ack(11.1, 1, "map-0", {}, fig()) == []  # duplicate
    assert c.ack(11.2, 99, "sink-0", {}, fig()) == []  # unknown checkpoint
    assert c.ack(11.3, 1, "stranger", {}, fig()) == []  # unknown task
    assert c.decline(11.4, 1, "stranger", "?") == []
    assert c.metadata_written(11.5, 1) == []  # not every task acked yet
    assert len(c.tick(15.0)) == 2  # timeout abort
    assert c.ack(16.0, 1, "sink-0", {}, fig()) == []  # late ack of an aborted checkpoint
    assert c.decline(16.0, 1, "sink-0", "late") == []
    assert c.metadata_failed(16.0, 1, "late") == []
    assert c.statistics().failed == 1


# -- manual checkpoints and savepoints ----------------------------------------------------


def test_manual_request_queued_behind_in_flight_then_triggered_when_it_ends():
    c = coordinator(interval_s=10.0, min_pause_s=60.0)
    c.tick(10.0)
    assert c.request(11.0, mode="unaligned") == (2, [])
    assert c.request(12.0) == (3, [])
    assert c.statistics().queued == 2
    ack_all(c, 1, 13.0)
    # min_pause_s does not hold back a queued request
    assert c.metadata_written(14.0, 1) == [NotifyComplete(1), trig(2, 14.0, "unaligned")]
    assert c.decline(15.0, 2, "map-0", "nope") == [NotifyAborted(2, "declined by map-0: nope"),
                                                   DiscardCheckpoint(2, "declined by map-0: nope"),
                                                   FailJob("checkpoint 2 failed (declined by map-0: nope); "
                                                           "1 consecutive checkpoint failures exceed "
                                                           "tolerable_failures=0"),
                                                   NotifyAborted(3, "job failed")]


def test_queued_request_starts_after_abort():
    c = coordinator(timeout_s=5.0, tolerable_failures=1)
    c.tick(10.0)
    assert c.request(11.0, mode="unaligned") == (2, [])  # it would overtake the aligned one's barriers
    assert c.tick(15.0) == [NotifyAborted(1, "timeout after 5 s"), DiscardCheckpoint(1, "timeout after 5 s"),
                            trig(2, 15.0, "unaligned")]


def test_savepoint_is_always_aligned_and_goes_to_its_directory():
    c = coordinator(mode="unaligned")
    assert c.request(1.0, savepoint=True, directory="/backups") == (
        1, [trig(1, 1.0, "aligned", savepoint=True, directory="/backups")])
    [write] = ack_all(c, 1, 2.0)
    assert (write.savepoint, write.directory, write.mode) == (True, "/backups", "aligned")
    with pytest.raises(ValueError, match="always aligned"):
        c.request(3.0, savepoint=True, directory="/backups", mode="unaligned")
    with pytest.raises(ValueError, match="needs a directory"):
        c.request(3.0, savepoint=True)
    with pytest.raises(ValueError, match="only for savepoints"):
        c.request(3.0, directory="/backups")


def test_failed_savepoint_is_discarded_in_its_directory_but_does_not_fail_the_job():
    c = coordinator(tolerable_failures=0)
    c.request(1.0, savepoint=True, directory="/backups")
    reason = "declined by map-0: busy"
    assert c.decline(2.0, 1, "map-0", "busy") == [NotifyAborted(1, reason),
                                                  DiscardCheckpoint(1, reason, savepoint=True, directory="/backups")]
    assert c.statistics().consecutive_failures == 0


def test_history_is_capped_and_tracks_status():
    c = coordinator(interval_s=5.0, timeout_s=1.0, tolerable_failures=10**6)
    for n in range(1, HISTORY_SIZE + 11):
        c.tick(10.0 * n)
        c.tick(10.0 * n + 1)  # timeout
    c.tick(10.0 * (HISTORY_SIZE + 11))
    history = c.history()
    assert len(history) == HISTORY_SIZE
    assert [h.checkpoint_id for h in history] == list(range(12, HISTORY_SIZE + 12))
    assert {h.status for h in history[:-1]} == {Status.FAILED}
    assert (history[-1].status, history[-1].duration_s) == (Status.IN_PROGRESS, None)


# -- property test --------------------------------------------------------------------------


class CoordinatorMachine(RuleBasedStateMachine):
    """Random interleavings with increasing `now`, checked against the instructions emitted.

    Aligned periodic checkpoints, and requests (savepoints, manual checkpoints) that may start beside them:
    at most one periodic and one request in flight, `_metadata` written and completion in id order, but that a
    savepoint holds no newer checkpoint back (it still waits for every older one).
    """

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.c = CheckpointCoordinator(
            CheckpointSettings(interval_s=5.0, timeout_s=8.0, min_pause_s=2.0, tolerable_failures=3, retain=2),
            TASKS, first_id=1, now=self.now)
        self.triggered: list[int] = []
        self.ended: list[int] = []
        self.open: list[int] = []  # triggered and not yet ended, as seen in the instructions, oldest first
        self.writing: set[int] = set()
        self.savepoints: set[int] = set()
        self.requested: set[int] = set()
        self.kept: list[int] = []  # completed checkpoints not yet discarded by retention
        self.job_failed = False

    def apply(self, out: list) -> None:
        for ins in out:
            if isinstance(ins, Trigger):
                assert not self.triggered or ins.checkpoint_id > self.triggered[-1], "ids not increasing"
                assert not self.job_failed
                assert ins.options.mode == CheckpointMode.ALIGNED
                self.triggered.append(ins.checkpoint_id)
                self.open.append(ins.checkpoint_id)
                if ins.savepoint:
                    self.savepoints.add(ins.checkpoint_id)
                periodic = [n for n in self.open if n not in self.requested]
                requests = [n for n in self.open if n in self.requested]
                assert len(periodic) <= 1 and len(requests) <= 1, f"too many in flight: {self.open}"
            elif isinstance(ins, WriteMetadata):
                assert self._in_order(ins.checkpoint_id), "_metadata written out of id order"
                self.writing.add(ins.checkpoint_id)
            elif isinstance(ins, NotifyComplete | NotifyAborted) and ins.checkpoint_id in self.triggered:
                assert ins.checkpoint_id not in self.ended, "checkpoint ended twice"
                assert ins.checkpoint_id in self.open
                if isinstance(ins, NotifyComplete):
                    assert self._in_order(ins.checkpoint_id), "completed out of id order"
                self.ended.append(ins.checkpoint_id)
                self.open.remove(ins.checkpoint_id)
                if isinstance(ins, NotifyComplete) and ins.checkpoint_id not in self.savepoints:
                    self.kept.append(ins.checkpoint_id)
            elif isinstance(ins, DiscardCheckpoint) and ins.reason == "retention":
                assert ins.checkpoint_id == self.kept.pop(0), "retention must discard the oldest completed"
            elif isinstance(ins, FailJob):
                self.job_failed = True

    def _in_order(self, n: int) -> bool:
        """Every older one in flight is a savepoint, and a savepoint is the oldest."""
        older = [o for o in self.open if o < n]
        return not older if n in self.savepoints else all(o in self.savepoints for o in older)

    def _target(self, newest: bool) -> int | None:
        return (self.open[-1] if newest else self.open[0]) if self.open else None

    @rule(dt=st.floats(0.0, 6.0))
    def tick(self, dt):
        self.now += dt
        self.apply(self.c.tick(self.now))

    @rule(task=st.sampled_from(sorted(TASKS) + ["stranger"]), stale=st.booleans(), newest=st.booleans(),
          size=st.integers(0, 10**6))
    def ack(self, task, stale, newest, size):
        target = self._target(newest)
        target = target if target is not None and not stale else len(self.triggered)
        self.apply(self.c.ack(self.now, target, task, {}, fig(size)))

    @rule(newest=st.booleans())
    def ack_every_task(self, newest):
        for task in sorted(TASKS):
            target = self._target(newest)
            if target is not None:
                self.apply(self.c.ack(self.now, target, task, {}, fig(1)))

    @rule(task=st.sampled_from(sorted(TASKS)), newest=st.booleans())
    def decline(self, task, newest):
        target = self._target(newest)
        if target is not None:
            self.apply(self.c.decline(self.now, target, task, "random"))

    @rule(savepoint=st.booleans())
    def request(self, savepoint):
        n, out = self.c.request(self.now, savepoint=savepoint, directory="/sp" if savepoint else None)
        self.requested.add(n)
        self.apply(out)

    @rule(stale=st.booleans())
    def metadata_written(self, stale):
        target = next(iter(self.writing), 0) if not stale else len(self.triggered) + 1
        self.writing.discard(target)
        self.apply(self.c.metadata_written(self.now, target))

    @rule()
    def metadata_failed(self):
        if self.writing:
            self.apply(self.c.metadata_failed(self.now, self.writing.pop(), "disk"))

    @rule()
    def task_failed(self):
        self.apply(self.c.task_failed(self.now, "crash"))

    @invariant()
    def accounting(self):
        stats = self.c.statistics()
        assert stats.in_flight_id == (self.open[-1] if self.open else None)
        assert self.c.in_flight_ids == self.open
        assert stats.completed + stats.failed + len(self.open) == len(self.triggered)
        assert len(self.ended) + len(self.open) == len(self.triggered)
        assert len(self.kept) <= self.c.settings.retain


TestCoordinatorMachine = CoordinatorMachine.TestCase
TestCoordinatorMachine.settings = settings(max_examples=200, stateful_step_count=60, deadline=None,
                                           suppress_health_check=[HealthCheck.too_slow])


# -- finished tasks (FLIP-147) ------------------------------------------------------------


def test_a_task_finishing_while_a_checkpoint_is_pending_counts_as_acknowledged_finished():
    c = coordinator()
    c.tick(10.0)
    assert c.ack(10.1, 1, "sink-0", {"h": "s"}, fig()) == []
    [write] = c.task_finished(10.2, "map-0")
    assert isinstance(write, WriteMetadata) and write.checkpoint_id == 1
    assert write.acks["map-0"]["state"] == {"finished": True}
    assert write.acks["sink-0"]["state"] == {"h": "s"}


def test_checkpoints_after_a_task_finished_need_only_the_running_tasks():
    c = coordinator()
    assert c.task_finished(1.0, "map-0") == []
    assert c.task_finished(1.5, "map-0") == []  # reported twice: no effect
    assert c.tick(10.0) == [trig(1, 10.0)]
    [write] = c.ack(10.1, 1, "sink-0", {"h": "s"}, fig())
    assert write.acks["map-0"]["state"] == {"finished": True}
    assert NotifyComplete(1) in c.metadata_written(10.2, 1)
    _, out = c.request(11.0)
    assert out == [trig(2, 11.0)]
    [write] = c.ack(11.1, 2, "sink-0", {"h": "s2"}, fig())
    assert write.checkpoint_id == 2


def test_a_finished_task_that_had_acknowledged_keeps_its_real_state():
    c = coordinator()
    c.tick(10.0)
    assert c.ack(10.1, 1, "map-0", {"h": "m"}, fig()) == []
    assert c.task_finished(10.2, "map-0") == []
    [write] = c.ack(10.3, 1, "sink-0", {"h": "s"}, fig())
    assert write.acks["map-0"]["state"] == {"h": "m"}
    assert c.task_finished(10.4, "nobody") == []


def test_a_checkpoint_asked_for_once_every_task_finished_is_aborted_at_once_not_left_in_progress():
    c = coordinator(tolerable_failures=0)
    c.task_finished(1.0, "map-0")
    c.task_finished(1.1, "sink-0")
    n, out = c.request(2.0)
    assert out == [NotifyAborted(n, "every task has finished: nothing left to checkpoint")]
    assert [(h.checkpoint_id, h.status) for h in c.history()] == [(n, Status.FAILED)]
    assert c.in_flight_id is None and c.statistics().consecutive_failures == 0  # not towards FailJob
    assert c.tick(100.0) == []  # and no periodic one either


def test_a_checkpoint_in_flight_when_the_job_stops_is_recorded_as_ended_not_in_progress():
    c = coordinator()
    assert c.tick(10.0) == [trig(1, 10.0)]
    complete(c, 1, 10.5)  # the final checkpoint
    _, out = c.request(11.0)
    assert out == [trig(2, 11.0)]
    c.task_finished(11.1, "map-0")
    assert c.stopped(11.2, "job finished") == []
    assert [(h.checkpoint_id, h.status) for h in c.history()] == [(1, Status.COMPLETED), (2, Status.FAILED)]
    assert c.history()[-1].failure_reason == "job finished" and c.statistics().consecutive_failures == 0
    assert c.ack(11.3, 2, "sink-0", {}, fig()) == []  # nothing happens after the stop
    # a checkpoint writing its _metadata as the job stops is left to complete (its commit ends the job)
    w = coordinator()
    w.tick(10.0)
    ack_all(w, 1, 10.1)
    assert w.stopped(10.2, "job finished") == [] and w.in_flight_id == 1
    assert NotifyComplete(1) in w.metadata_written(10.3, 1)


# -- per-channel switching and the in-flight cap ---------------------------------------------------------


def test_switching_settings_travel_with_aligned_checkpoints_but_not_savepoints():
    c = coordinator(channel_timeout_s=0.01, channel_inflight_bytes=4096, max_inflight_bytes=1 << 20)
    assert c.tick(10.0) == [Trigger(1, CheckpointOptions(channel_timeout_s=0.01, channel_inflight_bytes=4096,
                                                                   max_inflight_bytes=1 << 20), None, 10.0)]
    ack_all(c, 1, 10.5)
    c.metadata_written(10.6, 1)
    _, out = c.request(11.0, savepoint=True, directory="/sp")
    assert out == [trig(2, 11.0, savepoint=True, directory="/sp")]  # a savepoint is always fully aligned


@pytest.mark.parametrize("settings_kw, message", [
    ({"mode": "unaligned", "channel_timeout_s": 0.01}, "do not apply to mode"),
    ({"max_inflight_bytes": 100}, "set channel_timeout_s or channel_inflight_bytes"),
    ({"channel_inflight_bytes": 0}, "must be positive"),
    ({"max_concurrent": 2}, "needs mode 'unaligned'"),
    ({"max_concurrent": 0, "mode": "unaligned"}, "at least 1"),
])
def test_switching_and_concurrency_settings_are_checked(settings_kw, message):
    with pytest.raises(ValueError, match=message):
        CheckpointSettings(interval_s=1.0, **settings_kw)


# -- concurrent checkpoints -------------------------------------------------------------------------------


def test_a_savepoint_starts_beside_a_periodic_unaligned_checkpoint_and_completion_stays_in_order():
    c = coordinator(mode="unaligned")
    assert c.tick(10.0) == [trig(1, 10.0, "unaligned")]
    sp, out = c.request(10.1, savepoint=True, directory="/sp")
    assert (sp, out) == (2, [trig(2, 10.1, savepoint=True, directory="/sp")])  # not queued behind 1
    assert c.in_flight_ids == [1, 2]
    assert ack_all(c, 2, 10.2) == []  # READY: its _metadata waits until checkpoint 1 has ended
    [write] = ack_all(c, 1, 10.3)  # a savepoint subsumes nothing: 1 completes too
    assert isinstance(write, WriteMetadata) and write.checkpoint_id == 1
    out = c.metadata_written(10.4, 1)
    assert out[0] == NotifyComplete(1)
    assert isinstance(out[1], WriteMetadata) and out[1].checkpoint_id == 2 and out[1].savepoint
    assert c.metadata_written(10.5, 2) == [NotifyComplete(2, tasks=False)]
    assert c.in_flight_ids == [] and c.statistics().last_completed_id == 2


def test_a_second_request_waits_for_the_first_and_nothing_unaligned_overtakes_an_aligned_checkpoint():
    c = coordinator(mode="unaligned")
    assert c.tick(10.0) == [trig(1, 10.0, "unaligned")]
    assert c.request(10.1)[1] == [trig(2, 10.1, "unaligned")]
    assert c.request(10.2) == (3, [])  # one request at a time
    assert c.tick(20.0) == []  # nor does a periodic one start while a request is queued
    complete(c, 1, 20.1)
    out = complete(c, 2, 20.2)
    assert out[-1] == trig(3, 20.2, "unaligned")
    a = coordinator()  # aligned
    assert a.tick(10.0) == [trig(1, 10.0)]
    assert a.request(10.1, mode="unaligned") == (2, [])  # its barriers would overtake 1's and abandon it
    a = coordinator()
    assert a.tick(10.0) == [trig(1, 10.0)]
    assert a.request(10.1) == (2, [trig(2, 10.1)])  # aligned: in-band behind 1's barriers


def _opts(mode: str, *, savepoint: bool = False, switching: bool = False) -> CheckpointOptions:
    return CheckpointOptions(CheckpointMode(mode), savepoint, 0.1 if mode == "aligned_timeout" else None,
                             channel_timeout_s=0.01 if switching else None)


@pytest.mark.parametrize(("new", "in_flight", "allowed"), [
    ("aligned", [], True),
    ("unaligned", ["unaligned"], True),
    ("savepoint", ["unaligned"], True),
    ("savepoint", ["aligned"], True),  # in-band behind the periodic one's barriers
    ("savepoint", ["aligned_timeout"], True),
    ("savepoint", ["switching"], True),
    ("aligned", ["savepoint"], True),  # a periodic aligned checkpoint is not paused by a savepoint
    ("aligned", ["unaligned", "savepoint"], True),
    # on the priority lane, but it waits behind the savepoint's barrier in each queue and the tasks aligning the
    # savepoint take it beside it, not instead of it
    ("unaligned", ["savepoint"], True),
    ("unaligned", ["unaligned", "savepoint"], True),
    ("unaligned", ["aligned"], False),  # a periodic aligned one: the newer would subsume it
    ("unaligned", ["aligned", "savepoint"], False),  # one aligned checkpoint at a time beside unaligned ones
    ("unaligned", ["switching"], False),  # priority at a channel's switch: it can abandon the older one
    ("unaligned", ["aligned_timeout"], False),
    ("aligned_timeout", ["savepoint"], False),  # priority at its deadline
    ("switching", ["savepoint"], False),  # priority at a channel's switch
    ("savepoint", ["at_least_once"], False),  # blocks no channel: a newer barrier may come first
])
def test_may_overlap_only_where_no_newer_barrier_can_overtake_an_aligning_one(new, in_flight, allowed):
    def opts(name: str) -> CheckpointOptions:
        if name == "savepoint":
            return _opts("aligned", savepoint=True)
        if name == "switching":
            return _opts("aligned", switching=True)
        return _opts(name)

    assert may_overlap(opts(new), [opts(o) for o in in_flight]) is allowed


def test_a_savepoint_starts_beside_a_periodic_aligned_checkpoint_and_periodic_ones_go_on_beside_it():
    c = coordinator(interval_s=1.0, timeout_s=30.0)
    assert c.tick(10.0) == [trig(1, 10.0)]
    sp, out = c.request(10.5, savepoint=True, directory="/sp")
    assert (sp, out) == (2, [trig(2, 10.5, savepoint=True, directory="/sp")])  # not queued behind 1
    complete(c, 1, 10.9)
    assert c.tick(11.0) == []  # interval counts from the savepoint's trigger
    assert c.tick(11.5) == [trig(3, 11.5)]  # the savepoint still aligns: the periodic one is not paused
    assert c.tick(12.6) == []  # max_concurrent 1 counts periodic ones: 3 is in flight
    [write] = ack_all(c, 3, 12.7)  # a savepoint holds no newer checkpoint back (recovery never uses one)
    assert isinstance(write, WriteMetadata) and write.checkpoint_id == 3
    assert c.metadata_written(12.8, 3) == [NotifyComplete(3)]
    [write] = ack_all(c, 2, 12.9)
    assert isinstance(write, WriteMetadata) and write.checkpoint_id == 2 and write.savepoint
    assert c.metadata_written(13.0, 2) == [NotifyComplete(2, tasks=False)]
    assert c.statistics().failed == 0 and c.retained == [1, 3]
    assert c.statistics().last_completed_id == 3  # the newest completed, not the last to complete


def test_periodic_unaligned_checkpoints_start_and_complete_while_a_savepoint_aligns():
    """Each one started beside the savepoint keeps the id after its own unused (the savepoint's sink label at the
    tasks where it overtook the savepoint), subsumes the older ones but never the savepoint, and completes
    before it; the savepoint still waits for every older checkpoint."""
    c = coordinator(mode="unaligned", interval_s=1.0)
    assert c.tick(10.0) == [trig(1, 10.0, "unaligned")]
    assert c.request(10.5, savepoint=True, directory="/sp")[1] == [trig(2, 10.5, savepoint=True, directory="/sp")]
    assert c.tick(11.0) == []  # max_concurrent 1: checkpoint 1 is in flight
    complete(c, 1, 11.1)
    assert c.tick(11.5) == [trig(3, 11.5, "unaligned")]
    assert c.request(11.6)[0] == 5  # 4 is kept unused; a request waits for the savepoint (one at a time)
    complete(c, 3, 11.7)
    assert c.in_flight_ids == [2] and c.statistics().last_completed_id == 3
    assert c.tick(12.5) == []  # the queued request goes first
    [write] = ack_all(c, 2, 12.8)
    assert isinstance(write, WriteMetadata) and write.savepoint
    assert c.metadata_written(12.9, 2) == [NotifyComplete(2, tasks=False), trig(5, 12.9, "unaligned")]
    assert c.statistics().last_completed_id == 3 and c.retained == [1, 3]


def test_an_unaligned_checkpoint_beside_a_savepoint_subsumes_older_ones_and_not_the_savepoint():
    c = coordinator(mode="unaligned", interval_s=1.0, max_concurrent=2)
    assert c.tick(10.0) == [trig(1, 10.0, "unaligned")]
    assert c.request(10.5, savepoint=True, directory="/sp")[1] == [trig(2, 10.5, savepoint=True, directory="/sp")]
    assert c.tick(11.5) == [trig(3, 11.5, "unaligned")]
    assert c.tick(12.5) == []  # two periodic ones in flight
    out = ack_all(c, 3, 12.6)
    assert out[:2] == [NotifyAborted(1, "subsumed by checkpoint 3"), DiscardCheckpoint(1, "subsumed by checkpoint 3")]
    assert isinstance(out[2], WriteMetadata) and out[2].checkpoint_id == 3 and len(out) == 3
    assert c.metadata_written(12.7, 3) == [NotifyComplete(3)]
    assert c.tick(13.5) == [trig(5, 13.5, "unaligned")]  # 4 kept unused
    assert c.in_flight_ids == [2, 5]


def test_max_concurrent_unaligned_checkpoints_and_a_newer_completed_one_subsumes_the_older():
    c = coordinator(mode="unaligned", max_concurrent=2, tolerable_failures=0)
    assert c.tick(10.0) == [trig(1, 10.0, "unaligned")]
    assert c.tick(20.0) == [trig(2, 20.0, "unaligned")]
    assert c.tick(30.0) == []  # two in flight already
    assert c.ack(30.1, 1, "map-0", {"h": "m"}, fig(100)) == []
    out = ack_all(c, 2, 30.2)
    assert out[:2] == [NotifyAborted(1, "subsumed by checkpoint 2"), DiscardCheckpoint(1, "subsumed by checkpoint 2")]
    assert isinstance(out[2], WriteMetadata) and out[2].checkpoint_id == 2 and len(out) == 3
    assert not any(isinstance(i, FailJob) for i in out)  # subsumed is no failure
    assert c.metadata_written(30.3, 2) == [NotifyComplete(2)]
    assert c.statistics().consecutive_failures == 0 and c.retained == [2]
    assert c.ack(30.4, 1, "sink-0", {"h": "s"}, fig(20)) == []  # a late ack of the subsumed one


def test_a_task_failure_aborts_every_concurrent_checkpoint_still_collecting_acks():
    c = coordinator(mode="unaligned", max_concurrent=3, tolerable_failures=5)
    c.tick(10.0)
    c.tick(20.0)
    out = c.task_failed(20.5, "boom")
    assert [i.checkpoint_id for i in out if isinstance(i, NotifyAborted)] == [1, 2]
    assert c.in_flight_ids == []
