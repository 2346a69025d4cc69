"""Restart strategies: how long to wait before the next attempt, and when to give up. Pure."""

from __future__ import annotations

from dataclasses import dataclass, field

from runtime.graph.config import LIFE, parse_duration, parse_duration_or_life
from runtime.graph.flags import flag
from runtime.graph.job_config import RESTARTS

KINDS = ("fixed", "exponential", "none")


def _window(value: float | str) -> float | None:
    return None if value == LIFE else float(value)


@dataclass(frozen=True)
class RestartStrategy:
    """The default rides out a minute-long outage of a dependency (a state store, the network: restarts after
    1, 2, 4, 8, 16, 30, 30, 30 s, the 7th one 61 s after the first failure) and still fails a job that fails
    again and again (a real fault: FAILED after the 8th restart within five minutes, about two minutes in), in
    the manner of Flink's exponential-delay and failure-rate strategies."""

    kind: str = field(default="exponential", metadata=flag(
        "--restart-strategy", "delay between restarts: fixed, exponential (the default: 1s, doubling up to 30s) "
        "or none", choices=KINDS, group=RESTARTS))
    # restarts allowed within failure_window_s (over the job's life when it is None)
    max_attempts: int = field(default=8, metadata=flag(
        "--restart-attempts", "restarts allowed within --restart-window (8): a job that fails more often ends "
        "FAILED", parse=int, group=RESTARTS))
    delay_s: float = field(default=1.0, metadata=flag(  # fixed delay, or the first delay of the exponential backoff
        "--restart-delay", "delay before a restart; the first one for exponential backoff (1s)",
        parse=parse_duration, group=RESTARTS))
    max_delay_s: float = 30.0
    slot_wait_s: float = 60.0  # how long one restart may wait for enough free slots
    # None: max_attempts counts every restart of the job's life. A window: only the restarts of the last
    # failure_window_s count (and the exponential backoff grows with them), so a job that fails again and again
    # (a real fault) still ends FAILED, while one that rides out a dependency's outage now and then does not
    failure_window_s: float | None = field(default=300.0, metadata=flag(
        "--restart-window", "count only the restarts of this last while against --restart-attempts (and grow "
        "the exponential backoff with them), or of the job's whole life: the default, 5m, rides out a "
        "minute-long outage of a dependency and still fails a job that fails again and again",
        parse=parse_duration_or_life, metavar="DURATION|life", to_field=_window, group=RESTARTS))

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"restart strategy must be one of {', '.join(KINDS)}, not {self.kind!r}")
        if self.max_attempts < 0 or self.delay_s < 0 or self.max_delay_s < 0 or self.slot_wait_s <= 0:
            raise ValueError("restart attempts and delays must not be negative")
        if self.failure_window_s is not None and self.failure_window_s <= 0:
            raise ValueError(f"failure_window_s must be positive or None, got {self.failure_window_s}")

    def delay_before(self, restart_number: int) -> float | None:
        """Delay before restart number `restart_number` (1-based), or None when no restart is left."""
        if self.kind == "none" or restart_number > self.max_attempts:
            return None
        if self.kind == "fixed":
            return self.delay_s
        # doubling step by step: 2 ** (n - 1) as a float overflows once n passes ~1024 restarts
        delay = self.delay_s
        for _ in range(restart_number - 1):
            if delay == 0 or delay >= self.max_delay_s:
                break
            delay *= 2
        return min(self.max_delay_s, delay)
