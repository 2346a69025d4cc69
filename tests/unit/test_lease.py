"""The leader lease (coordinator/lease.py) on a real directory: one leader at a time, takeover only after the
lease went unrenewed, the loser of a race knows it, and a leader's validity ends before anyone may take over."""

from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from coordinator.lease import Leadership, LeaseDir, LeaseHeld, LeaseRecord, StaleWatch
from runtime.common.backoff import backoff_delays

LEASE_S, RENEW_S = 2.0, 0.2  # validity 1.6 s: a loaded machine (load 11-14 failed 1.0 s once) stays inside it


def leadership(tmp_path: Path, holder: str) -> Leadership:
    return Leadership(str(tmp_path), holder=holder, address=f"{holder}:1", lease_s=LEASE_S, renew_s=RENEW_S)


def test_stale_only_after_a_whole_lease_without_change() -> None:
    watch = StaleWatch(5.0)
    rec = LeaseRecord(3, "a", "a:1", "h", 1, renewals=7)
    assert not watch.observe(rec, 100.0)
    assert not watch.observe(rec, 104.9)
    assert not watch.observe(LeaseRecord(3, "a", "a:1", "h", 1, renewals=8), 104.95)  # renewed: the clock restarts
    assert watch.changes == 1
    assert not watch.observe(None, 109.0)  # unreadable for a moment (being replaced): not a reason to take over
    assert watch.observe(LeaseRecord(3, "a", "a:1", "h", 1, renewals=8), 109.95)


def test_link_lets_exactly_one_contender_take_an_epoch(tmp_path: Path) -> None:
    files = LeaseDir(str(tmp_path))
    assert files.current() == (0, None)
    assert files.try_take(LeaseRecord(1, "a", "a:1", "h", 1))
    assert not files.try_take(LeaseRecord(1, "b", "b:1", "h", 2))
    epoch, rec = files.current()
    assert epoch == 1 and rec is not None and rec.holder == "a"
    assert not files.superseded(1)
    assert files.try_take(LeaseRecord(2, "b", "b:1", "h", 2))
    assert files.superseded(1)
    assert sorted(p.name for p in (tmp_path / "leader").iterdir()) == ["epoch-1", "epoch-2"]  # no temp files


async def test_standby_takes_over_only_after_the_leader_stops_renewing(tmp_path: Path) -> None:
    first, second = leadership(tmp_path, "a"), leadership(tmp_path, "b")
    await first.acquire(standby=False)
    assert first.valid() and first.epoch == 1
    holding = asyncio.create_task(first.hold())
    waiting = asyncio.create_task(second.acquire(standby=True))
    await asyncio.sleep(LEASE_S * 3)
    assert not waiting.done() and not second.valid()  # renewed all along: the standby waits
    assert second.leader_address() == "a:1"
    holding.cancel()  # the leader stops renewing (a crash, a pause)
    stopped = time.monotonic()
    await asyncio.wait_for(waiting, LEASE_S * 5)
    taken = time.monotonic()
    assert second.valid() and second.epoch == 2
    assert taken - stopped >= LEASE_S * 0.9  # waited the lease out
    assert not first.valid()  # the old leader's validity ended before the takeover (no overlap)
    # the old leader, resumed, finds the newer epoch and knows it lost
    first._valid_until = time.monotonic() + 10  # as if its clock said it were still valid
    assert "lease epoch 2 was taken" in await asyncio.wait_for(first.hold(), 2)
    assert not first.valid()


async def test_a_second_plain_coordinator_refuses_a_live_lease(tmp_path: Path) -> None:
    first, second = leadership(tmp_path, "a"), leadership(tmp_path, "b")
    await first.acquire(standby=False)
    holding = asyncio.create_task(first.hold())
    try:
        with pytest.raises(LeaseHeld, match="coordinator a at a:1 leads state directory .* --standby"):
            await asyncio.wait_for(second.acquire(standby=False), LEASE_S * 5)
    finally:
        holding.cancel()


async def test_a_leader_that_cannot_renew_steps_down(tmp_path: Path) -> None:
    first = leadership(tmp_path, "a")
    await first.acquire(standby=False)
    shutil.rmtree(tmp_path / "leader")  # renewals fail (a file where the directory was): the lease runs out
    (tmp_path / "leader").write_text("")
    why = await asyncio.wait_for(first.hold(), LEASE_S * 5)
    assert "not renewed within" in why
    assert not first.valid()


def test_lease_must_outlast_two_renewals() -> None:
    with pytest.raises(ValueError, match="at least twice the renewal interval"):
        Leadership("state", holder="a", address="a:1", lease_s=1.0, renew_s=0.6)


@given(st.floats(0.01, 1.0), st.floats(1.0, 10.0), st.integers(0, 2**32))
def test_backoff_is_jittered_and_capped(base: float, factor: float, seed: int) -> None:
    import random

    cap = base * factor
    delays = backoff_delays(base_s=base, cap_s=cap, rng=random.Random(seed))
    got = [next(delays) for _ in range(30)]
    assert all(base / 2 <= d <= cap for d in got)
    assert all(d <= min(cap, base * 2 ** i) for i, d in enumerate(got))


def test_leadership_metrics() -> None:
    from coordinator.metrics import LeadershipCollector, LeadershipStatistics

    def scrape(st: LeadershipStatistics) -> dict[str, float]:
        return {s.name: s.value for family in LeadershipCollector(lambda: st).collect() for s in family.samples}

    assert scrape(LeadershipStatistics(False, 0, 0, 0, 0)) == {
        "sluice_coordinator_is_leader": 0, "sluice_coordinator_lease_epoch": 0,
        "sluice_coordinator_jobs_recovered_total": 0, "sluice_coordinator_job_record_writes_total": 0,
        "sluice_coordinator_job_record_write_failures_total": 0}
    leading = scrape(LeadershipStatistics(True, 3, 2, 17, 1))
    assert leading["sluice_coordinator_is_leader"] == 1 and leading["sluice_coordinator_lease_epoch"] == 3
    assert leading["sluice_coordinator_jobs_recovered_total"] == 2
    assert leading["sluice_coordinator_job_record_write_failures_total"] == 1


async def test_a_leader_whose_validity_ran_out_never_renews_again(tmp_path: Path) -> None:
    first = leadership(tmp_path, "a")
    await first.acquire(standby=False)
    first._valid_until = time.monotonic() - 0.01  # as after a pause longer than its validity
    assert not first.valid()
    why = await asyncio.wait_for(first.hold(), 2)
    assert "not renewed within" in why and first.record is None
    _, record = LeaseDir(str(tmp_path)).current()
    assert record is not None and record.renewals == 0  # it wrote nothing: a contender may already lead


async def test_a_busy_event_loop_keeps_the_lease(tmp_path: Path) -> None:
    """Renewals run on their own thread: a loop blocked for longer than the lease (a 1,000-task deploy on a
    loaded machine) does not cost the leadership, and the renewals went on meanwhile."""
    first = leadership(tmp_path, "a")
    await first.acquire(standby=False)
    holding = asyncio.create_task(first.hold())
    await asyncio.sleep(RENEW_S * 2)
    try:
        before = LeaseDir(str(tmp_path)).current()[1]
        time.sleep(LEASE_S * 2.5)  # noqa: ASYNC251 - the point: the event loop does not turn
        after = LeaseDir(str(tmp_path)).current()[1]
        assert before is not None and after is not None and after.renewals > before.renewals
        assert first.valid() and not holding.done()
    finally:
        holding.cancel()


async def test_a_loop_stalled_past_its_bound_gives_the_lease_up(tmp_path: Path) -> None:
    first = Leadership(str(tmp_path), holder="a", address="a:1", lease_s=LEASE_S, renew_s=RENEW_S,
                       loop_stall_s=0.3)
    await first.acquire(standby=False)
    holding = asyncio.create_task(first.hold())
    await asyncio.sleep(RENEW_S * 2)
    time.sleep(LEASE_S * 1.5)  # noqa: ASYNC251 - stalled past 0.3 s: the thread stops renewing, the validity runs out
    assert not first.valid()
    why = await asyncio.wait_for(holding, 2)
    assert "not renewed within" in why and first.record is None
