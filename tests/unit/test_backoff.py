"""The connectors' retry window (runtime/common/backoff.py): failures in a row ridden out for the window, a
success closing it."""

from __future__ import annotations

from runtime.common.backoff import RetryWindow


def test_failures_in_a_row_are_retried_for_the_window_and_a_success_starts_it_again() -> None:
    retry = RetryWindow(10.0)
    assert [retry.failed(t) for t in (100.0, 105.0, 110.0, 110.5)] == [True, True, True, False]
    assert retry.failing_since == 100.0
    retry.succeeded()
    assert retry.failing_since is None
    assert [retry.failed(t) for t in (200.0, 209.9)] == [True, True]  # counted from the first failure since
    assert RetryWindow(0.0).failed(1.0) is True  # the first failure is always retried once
