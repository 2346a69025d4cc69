"""Reconnection delays: exponential, capped, with full jitter. Pure.

When a coordinator goes away every worker dials again; without jitter they
would all dial in the same instant after each delay (a thundering herd on the
new leader), so each delay is drawn uniformly from [base/2, d] where d doubles
per failed try up to `cap_s`.
"""

from __future__ import annotations

import random
from collections.abc import Iterator


def backoff_delays(*, base_s: float = 0.1, cap_s: float = 2.0, rng: random.Random | None = None) -> Iterator[float]:
    """An endless sequence of delays: the n-th one within [base_s/2, min(cap_s, base_s * 2**n)]."""
    if base_s <= 0 or cap_s < base_s:
        raise ValueError(f"backoff needs 0 < base_s <= cap_s, got base_s={base_s} cap_s={cap_s}")
    draw = rng or random.Random()
    ceiling = base_s
    while True:
        yield draw.uniform(base_s / 2, ceiling)
        ceiling = min(cap_s, ceiling * 2)


class RetryWindow:
    """How long a client keeps retrying: failures in a row are ridden out for `window_s`, then given up on; a
    success closes the window. Pure: the caller passes `now` (time.monotonic()). The connectors' fetch and
    commit loops share it, so "failing for 120s" means the same everywhere."""

    __slots__ = ("window_s", "failing_since")

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self.failing_since: float | None = None  # the first failure of the current run of them

    def succeeded(self) -> None:
        self.failing_since = None

    def failed(self, now: float) -> bool:
        """A failure at `now`: True to retry, False once the failures in a row have lasted over `window_s`."""
        if self.failing_since is None:
            self.failing_since = now
        return now - self.failing_since <= self.window_s
