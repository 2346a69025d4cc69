"""The user's side of Async I/O: `stream.async_map(fn, ...)` settings and the retry policy.

`fn` is an `async def fn(record)` that calls something outside (an HTTP service, a database, a model endpoint)
and returns the record's one output. The task keeps up to `capacity` calls in flight
(runtime/execution/async_io.py); README, Async I/O, says what a user can count on.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

AsyncFn = Callable[[Any], Awaitable[Any]]


@dataclass(frozen=True)
class RetryPolicy:
    """How a failed or timed-out call is tried again: up to `max_attempts` calls in all, waiting
    `initial_backoff_s * multiplier**(n-1)` (at most `max_backoff_s`) before retry n. `retry_on`: the exception
    types worth a retry (a timeout always is); any other exception fails the task at once."""

    max_attempts: int = 3
    initial_backoff_s: float = 0.1
    multiplier: float = 2.0
    max_backoff_s: float = 10.0
    retry_on: tuple[type[BaseException], ...] = (Exception,)

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"RetryPolicy.max_attempts must be at least 1, got {self.max_attempts}")
        if self.initial_backoff_s < 0 or self.max_backoff_s < 0 or self.multiplier < 1:
            raise ValueError("RetryPolicy: backoffs must be >= 0 and the multiplier >= 1")

    def backoff_s(self, retry: int) -> float:
        """The wait before retry number `retry` (1 = the second attempt)."""
        return min(self.max_backoff_s, self.initial_backoff_s * self.multiplier ** (retry - 1))

    def retries(self, error: BaseException, attempt: int) -> bool:
        """Whether attempt number `attempt` (1-based), which failed with `error`, is tried again."""
        return attempt < self.max_attempts and isinstance(error, self.retry_on)


NO_RETRY = RetryPolicy(max_attempts=1)


@dataclass(frozen=True)
class AsyncMap:
    """An async_map node's payload: the function and its settings (checked when the job is built)."""

    fn: AsyncFn
    capacity: int = 100
    timeout_s: float | None = 10.0
    ordered: bool = True
    retry: RetryPolicy = NO_RETRY

    def __post_init__(self) -> None:
        if not inspect.iscoroutinefunction(self.fn) and not inspect.iscoroutinefunction(
                getattr(self.fn, "__call__", None)):  # noqa: B004 - an object with `async def __call__`
            raise TypeError(f"async_map needs an `async def` function, got {self.fn!r}")
        if not isinstance(self.capacity, int) or self.capacity < 1:
            raise ValueError(f"async_map capacity must be a positive integer, got {self.capacity!r}")
        if self.timeout_s is not None and self.timeout_s <= 0:
            raise ValueError(f"async_map timeout_s must be positive (or None), got {self.timeout_s!r}")
        if not isinstance(self.retry, RetryPolicy):
            raise TypeError(f"async_map retry must be a RetryPolicy, got {self.retry!r}")
