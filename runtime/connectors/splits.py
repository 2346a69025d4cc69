"""Sources whose subtasks read independent inputs, restored at another parallelism: an old subtask is a split.

A source that declares `subtask_splits = True` promises that what subtask i of p reads depends only on i, p
and its position (say, the partitions n with n mod p == i, or its own generator), not on what the other
subtasks do. Its position then cannot be divided, but it can be moved whole: on a rescale every old subtask
(j of p) becomes a split [j, p, position, records to skip], and new subtask c of q reads the splits n with
n mod q == c, each through its own copy of the source opened as subtask j of p and restored at that position.
Every split is read by exactly one new subtask, from where its old subtask stood, so every record is read
exactly once, also through several rescales (a split keeps its j of p for good). A scale-up beyond the number
of splits leaves the extra subtasks without input; lane-based sources (source.py) split their input finer.
"""

from __future__ import annotations

import copy
from typing import Any

from runtime.connectors.source import Source


def is_split_position(position: Any) -> bool:
    return isinstance(position, dict) and "splits" in position


def fold_emitted(position: Any, emitted: int) -> Any:
    """A split reader's checkpointed [position, emitted] -> the position alone: the records of the batch after
    it already emitted came from the split the reader was on (`next`), which skips them on restore."""
    splits = [list(s) for s in position["splits"]]
    if splits and emitted:
        splits[int(position["next"]) % len(splits)][3] += int(emitted)
    return {"splits": splits, "next": int(position["next"]) % len(splits) if splits else 0}


def deal_splits(states: list[Any], new_parallelism: int) -> list[Any]:
    """Old subtasks' source states ([position, emitted] each, None for one that had finished) -> the new
    subtasks' ([{"splits": ..., "next": 0}, 0]): split n goes to new subtask n mod q. Pure."""
    old_parallelism = len(states)
    splits: list[list[Any]] = []
    for j, state in enumerate(states):
        if not state:
            continue  # finished: nothing left to read
        position, emitted = state
        if is_split_position(position):
            splits += fold_emitted(position, int(emitted))["splits"]
        else:
            splits.append([j, old_parallelism, position, int(emitted)])
    return [[{"splits": splits[c::new_parallelism], "next": 0}, 0] for c in range(new_parallelism)]


class SplitReader(Source):
    """Reads the splits of a `subtask_splits` source dealt to one subtask, one batch from each in turn. Its
    position names the split whose batch comes next, so a restore resumes every split where it stood."""

    def __init__(self, prototype: Source) -> None:
        self.prototype = prototype
        self.bounded = prototype.bounded
        self._readers: list[list[Any]] = []  # [index, parallelism, source, records to skip]
        self._next = 0

    def restore(self, position: Any) -> None:
        self.close()
        position = fold_emitted(position, 0)
        self._readers = []
        for index, parallelism, split_position, skip in position["splits"]:
            source = copy.copy(self.prototype)  # configured, never opened: each split gets its own
            source.open(int(index), int(parallelism))
            if split_position is not None:
                source.restore(split_position)
            self._readers.append([int(index), int(parallelism), source, int(skip)])
        self._next = position["next"]

    def read_batch(self, max_records: int) -> list[Any] | None:
        if not self._readers:
            return None if self.bounded else []
        at = self._next % len(self._readers)
        reader = self._readers[at]
        batch: list[Any] | None = []
        while reader[3] > 0:  # first what its old subtask had emitted after its position: skip it
            batch = reader[2].read_batch(reader[3])
            if not batch:
                break
            reader[3] -= len(batch)
            batch = []
        if reader[3] == 0:
            batch = reader[2].read_batch(max_records)
        if batch is None:  # this split is read to its end
            reader[2].close()
            del self._readers[at]
            self._next = at
            return [] if self._readers or not self.bounded else None
        self._next = at + 1  # one batch from each split in turn; an empty one too, so none waits on another
        return batch

    def idle_wait_s(self) -> float:
        return min((r[2].idle_wait_s() for r in self._readers), default=0.1) / max(1, len(self._readers))

    def position(self) -> Any:
        return {"splits": [[i, p, source.position(), skip] for i, p, source, skip in self._readers],
                "next": self._next % len(self._readers) if self._readers else 0}

    def sources(self) -> list[Source]:
        """The split sources being read (their figures go to the metrics)."""
        return [reader[2] for reader in self._readers]

    def checkpoint_complete(self, checkpoint_id: int, position: Any) -> None:
        """A checkpoint that stored `position` completed: each split's source that confirms its input on
        completion (a PostgreSQL slot) is told its own position in it."""
        if not is_split_position(position):
            return
        for reader, split in zip(self._readers, position["splits"], strict=False):
            confirm = getattr(reader[2], "checkpoint_complete", None)
            if confirm is not None and [reader[0], reader[1]] == [int(split[0]), int(split[1])]:
                confirm(checkpoint_id, split[2])

    def close(self) -> None:
        for reader in self._readers:
            reader[2].close()
