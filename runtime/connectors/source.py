"""The source interface the source task drives."""

from __future__ import annotations

from typing import Any


class SideOutputBatch(list[Any]):
    """What `read_batch` returns for records that go to a side output of the source (its node's
    `side_output(OutputTag(tag))`) instead of its main output: a malformed record a source was told to set aside.
    They count as records of the source, as a batch's do (so a checkpoint's "records of the batch emitted" stays
    exact); `tag` None drops them. `timestamp_ms`: their event time in a job with event time."""

    def __init__(self, tag: str | None, records: list[Any], timestamp_ms: int | None = None) -> None:
        super().__init__(records)
        self.tag = tag
        self.timestamp_ms = timestamp_ms


class Source:
    """A parallel source. Each subtask gets its own copy, opened with its index.

    `read_batch` returns the next records (a list), an empty list when none
    are ready yet (rate limit, unbounded input waiting), or None at the end
    of a bounded input (or a SideOutputBatch, above). `position`/`restore` make the read position
    checkpointable: restoring a position and reading on yields exactly the
    records that followed it.
    """

    bounded = True
    # True for sources whose position is lane-based (see below): they can be restored at another parallelism
    rescalable = False
    # True for sources whose subtasks read independent inputs (what subtask i of p reads depends only on i, p
    # and its position): restored at another parallelism, each old subtask is moved whole (connectors/splits.py)
    subtask_splits = False
    # the install's extras this source needs (runtime/common/extras.py): checked when the job is submitted
    extras: tuple[str, ...] = ()

    def open(self, subtask_index: int, parallelism: int) -> None:
        self.subtask_index = subtask_index
        self.parallelism = parallelism

    def read_batch(self, max_records: int) -> list[Any] | None:
        raise NotImplementedError

    def idle_wait_s(self) -> float:
        """How long to wait before asking again after an empty batch."""
        return 0.01

    def position(self) -> Any:
        """Where the next batch starts, for a checkpoint (msgpack-able). None means the source cannot be replayed:
        a restore then neither restores it nor skips the records of its batch that were emitted (they are new
        records, not the same ones again). So a replayable source returns a position before its first batch
        too, or the records emitted from that batch before a checkpoint are read again after a restore."""
        return None

    def restore(self, position: Any) -> None:
        pass

    def close(self) -> None:
        pass

    def lanes(self, position: Any, emitted: int, subtask_index: int, parallelism: int) -> list[list[int]]:
        """What old subtask `subtask_index` of `parallelism` had left, as lanes (below), from its checkpointed
        position and the records of the batch after it already emitted. Only for `rescalable` sources."""
        return position_lanes(position, emitted, subtask_index, parallelism)


# -- lanes: how a split-based source's remaining input is redistributed when its parallelism changes --------
#
# A source that splits its input into numbered units (generator blocks, files, row groups) with subtask i of p
# reading units i, i+p, i+2p, ... describes what it has left as a *lane*: [next unit, offset in it, records of
# it still to skip after that offset, stride]; the lane covers units next, next+stride, next+2*stride, ... For
# an unbounded input a lane never ends, so the remaining input cannot be listed, only split: a lane of stride s
# splits into m lanes of stride s*m starting at next, next+s, ..., next+(m-1)*s (only the first keeps the offset).
# Every unit stays in exactly one lane, so every record is read exactly once at any parallelism.


def split_lane(lane: list[int], m: int) -> list[list[int]]:
    start, offset, skip, stride = lane
    return [[start + r * stride, offset if r == 0 else 0, skip if r == 0 else 0, stride * m] for r in range(m)]


def rescale_lanes(old: list[list[list[int]]], new_parallelism: int) -> list[list[list[int]]]:
    """Old subtasks' lanes -> new subtasks' lanes: split until there are enough for every new subtask, then
    deal them round robin (lane l to new subtask l mod q). Pure; deterministic for a given input."""
    lanes = [list(lane) for subtask in old for lane in subtask]
    if lanes and len(lanes) < new_parallelism:
        m = -(-new_parallelism // len(lanes))
        lanes = [piece for lane in lanes for piece in split_lane(lane, m)]
    out: list[list[list[int]]] = [[] for _ in range(new_parallelism)]
    for index, lane in enumerate(lanes):
        out[index % new_parallelism].append(lane)
    return out


class LaneReader:
    """Which unit a lane-based source reads next: the lowest unit among its lanes (a source restored without
    rescaling has one lane of stride p starting at its own index, i.e. the usual i, i+p, ...)."""

    def __init__(self, lanes: list[list[int]]) -> None:
        self.lanes = [list(lane) for lane in lanes]

    def current(self) -> list[int] | None:
        return min(self.lanes, key=lambda lane: lane[0]) if self.lanes else None

    def advance(self, lane: list[int]) -> None:
        """The lane's current unit is done: go on to its next one."""
        lane[0] += lane[3]
        lane[1] = 0
        lane[2] = 0

    def drop(self, lane: list[int]) -> None:
        self.lanes.remove(lane)

    def snapshot(self) -> dict[str, Any]:
        return {"lanes": [list(lane) for lane in self.lanes]}


def position_lanes(position: Any, emitted: int, subtask_index: int, parallelism: int) -> list[list[int]]:
    """The lanes of a lane-based source's checkpointed state: `position` as its `position()` returned it
    ([unit, offset] in its own sequence, or {"lanes": ...} once rescaled) and `emitted`, the records of the
    batch after it already emitted (they are skipped on restore)."""
    if position is None:
        return [[subtask_index, 0, int(emitted), parallelism]]
    if isinstance(position, dict):
        lanes = [list(map(int, lane)) for lane in position["lanes"]]
        if lanes and emitted:
            min(lanes, key=lambda lane: lane[0])[2] += int(emitted)
        return lanes
    unit, offset = int(position[0]), int(position[1])
    return [[unit, offset, int(emitted), parallelism]]
