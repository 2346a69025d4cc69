"""What the runtime's own keyed functions (the window operator, the interval join) offer the operator that runs
them, beyond the methods of a user's function: their event-time timers derived from their state, loops over a
whole batch of timed elements, and a word before each snapshot. A function declares them by subclassing
RuntimeHooks; the operators (runtime/execution/operators/kinds.py, two_input.py) ask only such a function, and
each default means "no fast path: run me as a plain function"."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

DerivedTimers = Callable[[dict[Any, Any]], list[tuple[Any, int]]]
BatchRunner = Callable[[list[Any]], None]


class RuntimeHooks:
    def event_timers_from_state(self, ctx: Any) -> DerivedTimers | None:
        """The event-time timers as a function of the keyed-state table (the task keeps an index per timestamp,
        runtime/execution/timers.py TimerIndex, and no timer table); None: ordinary per-key timers."""
        return None

    def timed_batch_runner(self, key_fn: Callable[[Any], Any], ctx: Any,
                           after: Callable[[], None]) -> BatchRunner | None:
        """One input: a loop over a list of (timestamp, record) elements doing what `process` does per element."""
        return None

    def timed_batch_runners(self, key_fns: tuple[Callable[[Any], Any], Callable[[Any], Any]], ctx: Any,
                            after: Callable[[], None]) -> tuple[BatchRunner, ...] | None:
        """Two inputs: the loops of `process1` and `process2`."""
        return None

    def before_snapshot(self) -> None:
        """A snapshot's synchronous part is about to copy the keyed-state tables (shallowly, on the memory path):
        stop changing in place the values they hold."""
