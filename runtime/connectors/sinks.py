"""The sink interface, and the print and discard sinks."""

from __future__ import annotations

import sys
import time
from typing import Any


class OutputGone(FileNotFoundError):
    """Output a restored checkpoint needs is gone (the sink's directory was cleared): no restart can bring it
    back, so the worker reports the failure as unrecoverable and the job fails at once, not after its restarts."""

    unrecoverable = True


class ForgedSinkState(ValueError):
    """A sink's restored state names something outside what the sink owns (a file in another directory, a
    subject it does not publish to): refused before anything is touched, and no restart changes the checkpoint,
    so the job fails at once."""

    unrecoverable = True


class Sink:
    """A parallel sink. `write` gets every record; `finish` runs at the end of a bounded input.

    `delay_per_record_s` makes the sink artificially slow (for demos and
    backpressure tests): the delay accumulates and is paid in sleeps of about
    a millisecond, so the average rate is right without a syscall per record.
    """

    # the install's extras this sink needs (runtime/common/extras.py): checked when the job is submitted
    extras: tuple[str, ...] = ()

    def __init__(self, *, delay_per_record_s: float = 0.0) -> None:
        self.delay_per_record_s = delay_per_record_s
        self._debt_s = 0.0

    @property
    def blocking(self) -> bool:
        """Whether `write` may block (sleep, wait on I/O). A throttled sink does; a subclass that writes
        through a blocking client may set `blocking = True`. Informational: every task runs its chain on a
        thread of its own, whatever it declares (runtime/execution/isolation.py)."""
        return self.delay_per_record_s > 0

    def bind(self, job_id: str, uid: str) -> None:
        """Which job and operator this sink is, set by the worker before `open`: a sink that must tell its own
        earlier commits from another run's (the table sinks' application ids) keeps them."""

    def open(self, subtask_index: int, parallelism: int, attempt: int) -> None:
        self.subtask_index = subtask_index
        self.parallelism = parallelism
        self.attempt = attempt

    def write(self, record: Any) -> None:
        raise NotImplementedError

    def write_all(self, records: list[Any]) -> None:
        """Every record of a batch, in order (the runtime's batches of its hot path). The default is `write` per
        record; a sink whose per-record work folds into one step overrides it (DiscardSink). The runtime calls it
        only where the class that defines it also defines, or inherits from below it, the `write` it stands for
        (a subclass that overrides `write` alone gets `write` per record), and never on a throttled sink. The list
        is reused after the call: keep a copy, not the list."""
        for record in records:
            self.write(record)

    def throttle(self) -> None:
        self._debt_s += self.delay_per_record_s
        if self._debt_s >= 0.001:
            time.sleep(self._debt_s)
            self._debt_s = 0.0

    def finish(self) -> None:
        """End of a bounded input: flush what is buffered. The task then waits for a checkpoint: its
        `snapshot_state` pre-commits the rest and its `commit` publishes it, exactly like any other checkpoint."""

    def restored_at_end(self, *, finished: bool) -> None:
        """After `open` and `restore_state`: the task was restored at or past its end of input, so `finish` does
        not run again in this run. `finished`: it had finished before the checkpoint and takes part in no
        checkpoint of this run (its task ends at once); else it takes part in one more, its final one."""

    def close(self) -> None:
        pass

    # Two-phase commit, driven by checkpoints. Sinks that write nothing durable keep the defaults.

    def snapshot_state(self, checkpoint_id: int) -> Any:
        """Pre-commit what was written since the last checkpoint, for `checkpoint_id`; return the state to store."""
        return None

    def commit(self, checkpoint_id: int) -> None:
        """Checkpoint `checkpoint_id` completed: publish everything pre-committed up to it (idempotent)."""

    def restore_state(self, state: Any) -> None:
        """Called after open() when restoring: redo commits of the restored checkpoint, drop what came after."""


class DiscardSink(Sink):
    """Counts records and drops them."""

    def open(self, subtask_index: int, parallelism: int, attempt: int) -> None:
        super().open(subtask_index, parallelism, attempt)
        self.records = 0

    def write(self, record: Any) -> None:
        self.records += 1

    def write_all(self, records: list[Any]) -> None:
        self.records += len(records)  # a Python call per batch, not per record


class PrintSink(Sink):
    """Prints each record on stdout, prefixed with the subtask index when parallel."""

    def __init__(self, prefix: str = "", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.prefix = prefix

    def write(self, record: Any) -> None:
        tag = f"{self.subtask_index}> " if self.parallelism > 1 else ""
        sys.stdout.write(f"{self.prefix}{tag}{record!r}\n")

    def finish(self) -> None:
        sys.stdout.flush()
