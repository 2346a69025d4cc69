"""RestartStrategy: delays before each restart, when to give up, and validation of submitted settings."""

from __future__ import annotations

import pytest

from coordinator.restarts import RestartStrategy
from coordinator.server import restart_strategy


def delays(strategy: RestartStrategy, n: int) -> list[float | None]:
    return [strategy.delay_before(i) for i in range(1, n + 1)]


def test_defaults_back_off_exponentially_eight_times_in_five_minutes() -> None:
    assert delays(RestartStrategy(), 9) == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0, None]
    assert RestartStrategy().failure_window_s == 300.0


def test_fixed_gives_up_after_max_attempts() -> None:
    assert delays(RestartStrategy("fixed", max_attempts=2, delay_s=0.2), 4) == [0.2, 0.2, None, None]


def test_exponential_doubles_up_to_the_cap_and_then_gives_up() -> None:
    s = RestartStrategy("exponential", max_attempts=7, delay_s=0.5, max_delay_s=5.0)
    assert delays(s, 8) == [0.5, 1.0, 2.0, 4.0, 5.0, 5.0, 5.0, None]


def test_exponential_with_a_huge_restart_number_stays_capped() -> None:
    s = RestartStrategy("exponential", max_attempts=10_000, delay_s=1.0, max_delay_s=30.0)
    assert s.delay_before(5000) == 30.0


@pytest.mark.parametrize("kind", ["none", "fixed", "exponential"])
def test_no_restart_when_none_or_no_attempts(kind: str) -> None:
    s = RestartStrategy(kind, max_attempts=0 if kind != "none" else 3)
    assert s.delay_before(1) is None


def test_zero_delay_is_allowed_and_distinct_from_giving_up() -> None:
    s = RestartStrategy("fixed", max_attempts=1, delay_s=0.0)
    assert s.delay_before(1) == 0.0
    assert s.delay_before(2) is None


@pytest.mark.parametrize("kwargs", [
    {"kind": "linear"},
    {"max_attempts": -1},
    {"delay_s": -0.1},
    {"max_delay_s": -1.0},
    {"slot_wait_s": 0},
    {"slot_wait_s": -5},
])
def test_invalid_strategies_are_rejected(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        RestartStrategy(**kwargs)


def test_submitted_settings_build_the_strategy() -> None:
    s = restart_strategy({"kind": "exponential", "max_attempts": 4, "delay_s": 0.25, "slot_wait_s": 12})
    assert s == RestartStrategy("exponential", max_attempts=4, delay_s=0.25, slot_wait_s=12)
    assert restart_strategy({}) == RestartStrategy()


def test_unknown_submitted_settings_are_named() -> None:
    with pytest.raises(ValueError, match="attempts"):
        restart_strategy({"kind": "fixed", "attempts": 3})
