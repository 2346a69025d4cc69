"""The source interface the source task drives."""

from __future__ import annotations

from typing import Any


class Source:
    """A parallel source. Each subtask gets its own copy, opened with its index.

    `read_batch` returns the next records (a list), an empty list when none
    are ready yet (rate limit, unbounded input waiting), or None at the end
    of a bounded input. `position`/`restore` make the read position
    checkpointable: restoring a position and reading on yields exactly the
    records that followed it.
    """

    bounded = True

    def open(self, subtask_index: int, parallelism: int) -> None:
        self.subtask_index = subtask_index
        self.parallelism = parallelism

    def read_batch(self, max_records: int) -> list[Any] | None:
        raise NotImplementedError

    def idle_wait_s(self) -> float:
        """How long to wait before asking again after an empty batch."""
        return 0.01

    def position(self) -> Any:
        return None

    def restore(self, position: Any) -> None:
        pass

    def close(self) -> None:
        pass
