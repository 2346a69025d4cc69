"""What a task's input processor and source driver need of their task: its turns.

Both run records through the chain in *runs*: a plain function that processes chunks of records until the
task must take a turn (mail is waiting, the output is blocked, an asynchronous operator holds input back, a
buffer the task's thread cut will fill an output), its input runs dry, or about YIELD_AFTER_S have passed. A run is made
inline on the event loop or, for an isolated task, as one call on the task's thread
(runtime/execution/isolation.py): the hand-off is paid per run, not per chunk. Between runs the task serves
its mailbox, waits for output or admission, and lets the loop in.

The chunk size adapts to the cost of a record: it doubles while a chunk takes less than CHUNK_S / 4 and
halves when one takes more than CHUNK_S, up to MAX_CHUNK. Cheap records go a few hundred per call; slow ones
(a throttled sink) one at a time, so mail is never kept waiting longer than one record.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

from runtime.execution.channels import OutputGate
from runtime.execution.isolation import IsolationPolicy
from runtime.execution.mailbox import Message

YIELD_AFTER_S = 0.002  # the longest a run keeps the loop (inline) or the task's turns (isolated)
CHUNK_S = 0.0005  # the longest a chunk of records should keep mail waiting
MAX_CHUNK = 256  # keeps a chunk's output (and so the overdraft of a blocked output) well under one buffer


def next_chunk(chunk: int, took_s: float) -> int:
    """The next chunk size, from how long the last chunk took (see the module docstring)."""
    if took_s > CHUNK_S:
        return chunk // 2 or 1
    if took_s < CHUNK_S / 4 and chunk < MAX_CHUNK:
        return chunk * 2
    return chunk


class RunEnd(enum.Enum):
    """Why a run of chunks returned."""

    DRAINED = "drained"  # the input has nothing more to process now
    TURN = "turn"  # the task must take a turn first (mail, blocked output, admission, cut buffers)
    YIELD = "yield"  # its time is up: let the loop in, then run again
    BURST = "burst"  # a watermark left more event-time timers due than one chunk
    ENDED = "ended"  # a source reached its end


class TaskTurns(Protocol):
    """The task as its processor and driver see it (runtime/execution/task.py implements it)."""

    mailbox: deque[Message]
    output: OutputGate
    isolation: IsolationPolicy
    records_in: int
    watermarks_in: int

    def turn_due(self) -> bool:
        """Whether the next chunk must wait for a turn of the task (checked between chunks, on any thread)."""

    async def between_records(self) -> None:
        """Serve the mailbox; wait while the output is blocked or an asynchronous operator holds input."""

    async def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """`fn(*args)` on the task's thread when it is isolated, else here."""

    async def between_runs(self, fn: Callable[..., Any], *args: Any) -> Any:
        """`fn(*args)`, chain work between runs (a watermark, an idle status): here, or on the task's own loop
        when its chain lives there (an asynchronous operator's task)."""

    async def wait(self, timeout_s: float | None = None) -> None:
        """Wait for a wake-up (input, credit, mail) or `timeout_s`."""

    async def wait_idle(self, timeout_s: float | None = None) -> None:
        """`wait`, counted as idle time."""

    async def serve_mail(self) -> None:
        """Serve the mailbox (a drain-mode asynchronous operator first goes quiet before a snapshot)."""

    async def quiesce(self) -> None:
        """Wait until the asynchronous operator has nothing queued or in flight."""
