"""What a task's mailbox holds: messages served between records, ahead of queued input.

A task serves its mailbox before it starts the next record, so everything
here reaches a running task within one record's time, even when the task is
blocked on output (backpressure). Layers above execution (checkpointing, the
worker) post `Mail`: a call to make on the task's own turn, which is how they
act on a task without the task knowing them (Flink's mailbox model).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from netstack.credit import Event


@dataclass(frozen=True, slots=True)
class Cancel:
    """Stop the task: it raises TaskCancelled at its next turn."""


@dataclass(frozen=True, slots=True)
class PriorityEvent:
    """An event that arrived on the priority lane of an input channel (barrier or probe)."""

    channel_id: int
    seq: int  # the last in-band data seq before it on that channel
    event: Event


@dataclass(frozen=True, slots=True)
class InjectProbe:
    """A source starts a latency probe across the job."""

    probe_id: int


@dataclass(frozen=True, slots=True)
class Mail:
    """A call made on the task's turn, between records."""

    run: Callable[[], None]
    description: str
    may_snapshot: bool = False  # it may take a checkpoint's snapshot (a drain-mode task waits for quiet first)


Message = Cancel | PriorityEvent | InjectProbe | Mail
