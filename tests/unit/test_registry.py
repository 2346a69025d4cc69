"""WorkerRegistry: registration, heartbeats, removal and its statistics snapshot."""

from __future__ import annotations

import dataclasses

import pytest

from coordinator.registry import RegistryStatistics, WorkerRecord, WorkerRegistry, WorkerStatistics


class FakeLink:
    """The registry only compares links by identity; it never calls them."""


def record(worker_id: str, link: object, slots: int = 2, *, at: float = 0.0) -> WorkerRecord:
    return WorkerRecord(worker_id, link, slots, "127.0.0.1", 7000, None, None,  # type: ignore[arg-type]
                        registered_at=at, last_heartbeat=at)


def test_statistics_count_workers_and_slots_in_registration_order():
    reg = WorkerRegistry()
    reg.register(record("w1", FakeLink(), 2, at=10.0))
    reg.register(record("w2", FakeLink(), 3, at=11.0))
    st = reg.statistics(now=12.5)
    assert st == RegistryStatistics((WorkerStatistics("w1", 2, 2.5), WorkerStatistics("w2", 3, 1.5)))
    assert (st.registered, st.slots_total) == (2, 5)


def test_statistics_are_a_frozen_snapshot_that_later_changes_do_not_touch():
    reg = WorkerRegistry()
    link = FakeLink()
    reg.register(record("w1", link, at=0.0))
    before = reg.statistics(now=1.0)
    reg.heartbeat("w1", link, now=1.0)
    reg.register(record("w2", FakeLink(), at=1.0))
    assert before.registered == 1 and before.workers[0].heartbeat_age_s == 1.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        before.workers[0].slots = 9  # type: ignore[misc]
    assert reg.statistics(now=1.0).registered == 2


def test_empty_registry_statistics():
    st = WorkerRegistry().statistics(now=0.0)
    assert (st.registered, st.slots_total, st.workers) == (0, 0, ())


def test_register_again_replaces_the_record_and_returns_the_old_one():
    reg = WorkerRegistry()
    first, second = record("w1", FakeLink(), 2), record("w1", FakeLink(), 4)
    assert reg.register(first) is None
    assert reg.register(second) is first
    assert reg["w1"] is second and len(reg) == 1
    assert reg.statistics(now=0.0).slots_total == 4


def test_heartbeat_only_from_the_link_the_worker_registered_on():
    reg = WorkerRegistry()
    link, stale = FakeLink(), FakeLink()
    reg.register(record("w1", link, at=0.0))
    assert not reg.heartbeat("w1", stale, now=5.0)  # e.g. the link of an earlier registration
    assert not reg.heartbeat("w9", link, now=5.0)
    assert reg["w1"].last_heartbeat == 0.0
    assert reg.heartbeat("w1", link, now=5.0)
    assert reg["w1"].last_heartbeat == 5.0
    assert reg.registered_on("w1", link) and not reg.registered_on("w1", stale)


def test_overdue_lists_workers_past_the_timeout_and_remove_forgets_them():
    reg = WorkerRegistry()
    reg.register(record("old", FakeLink(), at=0.0))
    reg.register(record("fresh", FakeLink(), at=8.0))
    assert [w.worker_id for w in reg.overdue(now=10.5, timeout_s=10.0)] == ["old"]
    assert reg.overdue(now=10.0, timeout_s=10.0) == []  # exactly at the timeout: not yet
    assert reg.remove("old") is not None
    assert reg.remove("old") is None
    assert list(reg) == ["fresh"]
    assert reg.statistics(now=10.0).registered == 1
