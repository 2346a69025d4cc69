"""A deterministic generator of (key, seq, event_time_ms) records.

The global sequence 0, 1, 2, ... is cut into blocks of BLOCK records; block b
is drawn from its own random stream seeded by (seed, b), and subtask i of p
generates blocks i, i+p, i+2p, ... So the data set depends only on the seed,
the count and the key distribution, never on the parallelism, and a position
is just (next block, offset in it).

Out-of-order event times (`jitter_ms=J`): record seq gets
event_time_ms = EVENT_TIME_START_MS + seq * event_step_ms - d, with d an
integer in [0, J] drawn from the block's random stream after its keys (so the
keys do not depend on J). With J = 0 nothing is drawn and the records are
exactly those of a generator without jitter. The batch side (`sluice data
generate --jitter-ms`) applies the same rule with d from a hash; the two data
sets differ anyway (see runtime/data/generate.py).

Keys in bursts (`distribution="bursts"`): the key is a function of seq alone, so that another engine can
generate the very same records (scripts/flink_windows_job.py does, in SQL). The keys are BURST_GROUPS groups;
group g is active during the bursts of BURST_RECORDS records whose number is g modulo BURST_GROUPS, its keys
taking turns (seq modulo the group's size), and silent in between: at one millisecond per record every key
appears every keys/BURST_GROUPS ms during its group's burst (100 ms of 1000 ms for 1000 keys), then not for
nine bursts (9 s), so session windows with a gap between the two close once per key every ten bursts.
`burst_key_index` is the rule.
"""

from __future__ import annotations

import random
import time
from itertools import accumulate
from typing import Any

from runtime.connectors.source import LaneReader, Source, position_lanes

BLOCK = 1024
EVENT_TIME_START_MS = 1_700_000_000_000
BURST_GROUPS = 10
BURST_RECORDS = 1000


def burst_key_index(seq: int, keys: int) -> int:
    """The key (its index) of record `seq` with keys in bursts (module docstring); `keys` a multiple of
    BURST_GROUPS."""
    per_group = keys // BURST_GROUPS
    return seq // BURST_RECORDS % BURST_GROUPS * per_group + seq % per_group


def key_names(keys: int) -> list[str]:
    width = len(str(max(keys - 1, 0)))
    return [f"k{i:0{width}d}" for i in range(keys)]


def zipf_cum_weights(keys: int, exponent: float) -> list[float]:
    return list(accumulate(1.0 / (rank + 1) ** exponent for rank in range(keys)))


def generate_block(block: int, *, seed: int, keys: list[str], cum_weights: list[float] | None,
                   count: int | None, event_step_ms: int = 1, jitter_ms: int = 0,
                   bursts: bool = False) -> list[tuple[str, int, int]]:
    """Records of global block `block` (shorter for the last block of a bounded input); event times run
    `jitter_ms` or less behind seq order; `bursts`: keys in bursts, not drawn (module docstring)."""
    start = block * BLOCK
    n = BLOCK if count is None else max(0, min(BLOCK, count - start))
    rng = random.Random(seed * 1_000_003 + block)
    if bursts:
        drawn = [keys[burst_key_index(seq, len(keys))] for seq in range(start, start + n)]
    else:
        drawn = rng.choices(keys, cum_weights=cum_weights, k=n)
    t0 = EVENT_TIME_START_MS + start * event_step_ms
    if jitter_ms <= 0:  # the tuples built from C (zip over ranges): no Python step per record
        return list(zip(drawn, range(start, start + n), range(t0, t0 + n * event_step_ms, event_step_ms),
                        strict=True))
    # Drawn after the keys, from the same stream: the keys stay those of the data set without jitter.
    behind = [rng.randint(0, jitter_ms) for _ in range(n)]
    return [(k, start + i, t0 + i * event_step_ms - d) for i, (k, d) in enumerate(zip(drawn, behind, strict=True))]


class GeneratorSource(Source):
    def __init__(self, count: int | None = 1_000_000, keys: int = 1000, seed: int = 0, *,
                 distribution: str = "uniform", zipf_exponent: float = 1.1,
                 records_per_second: float | None = None, jitter_ms: int = 0) -> None:
        if count is not None and count < 0:
            raise ValueError("count must be >= 0 or None for an unbounded source")
        if keys < 1:
            raise ValueError("keys must be >= 1")
        if distribution not in ("uniform", "zipf", "bursts"):
            raise ValueError(f"distribution must be 'uniform', 'zipf' or 'bursts', not {distribution!r}")
        if distribution == "bursts" and keys % BURST_GROUPS:
            raise ValueError(f"keys in bursts must be a multiple of {BURST_GROUPS}, not {keys}")
        if not isinstance(jitter_ms, int) or jitter_ms < 0:
            raise ValueError(f"jitter_ms must be an integer >= 0, not {jitter_ms!r}")
        self.count = count
        self.keys = keys
        self.seed = seed
        self.distribution = distribution
        self.zipf_exponent = zipf_exponent
        self.records_per_second = records_per_second
        self.jitter_ms = jitter_ms
        self.bounded = count is not None

    rescalable = True

    def open(self, subtask_index: int, parallelism: int) -> None:
        super().open(subtask_index, parallelism)
        self._keys = key_names(self.keys)
        self._cum = zipf_cum_weights(self.keys, self.zipf_exponent) if self.distribution == "zipf" else None
        # blocks are units of lanes (source.py): one lane i, i+p, ... unless restored after a rescale
        self._lanes = LaneReader([[subtask_index, 0, 0, parallelism]])
        self._pending: list[Any] = []
        self._pending_block: int | None = None
        self._emitted = 0
        self._rate = (self.records_per_second / parallelism) if self.records_per_second else None
        self._started = time.monotonic()

    def _total_blocks(self) -> int | None:
        return None if self.count is None else -(-self.count // BLOCK)

    def read_batch(self, max_records: int) -> list[Any] | None:
        if self._rate is not None:
            allowed = int((time.monotonic() - self._started) * self._rate) - self._emitted
            if allowed <= 0:
                return []
            max_records = min(max_records, allowed)
        total = self._total_blocks()
        while True:
            lane = self._lanes.current()
            if lane is None:
                return None
            if total is not None and lane[0] >= total:
                self._lanes.drop(lane)
                continue
            if self._pending_block != lane[0]:
                self._pending = generate_block(lane[0], seed=self.seed, keys=self._keys, cum_weights=self._cum,
                                               count=self.count, jitter_ms=self.jitter_ms,
                                               bursts=self.distribution == "bursts")
                self._pending_block = lane[0]
            lane[1] += lane[2]  # records to skip (restored after a rescale): the generator can jump over them
            lane[2] = 0
            out = self._pending[lane[1] : lane[1] + max_records]
            lane[1] += len(out)
            if lane[1] >= len(self._pending):
                self._lanes.advance(lane)
            if out:
                self._emitted += len(out)
                return out

    def idle_wait_s(self) -> float:
        if self._rate is None:
            return 0.005
        # a throttled source sleeps until its next record is due, not 5 ms: each look is a hand-off to the task's
        # thread, and at 2 records/s polling every 5 ms was most of an idle worker's CPU (docs/BENCHMARKS.md,
        # Scale); mail (a checkpoint) wakes the task earlier, and a second bounds the wait
        due_at = self._started + (self._emitted + 1) / self._rate
        return min(1.0, max(0.005, due_at - time.monotonic()))

    def position(self) -> Any:
        lanes = self._lanes.lanes
        if len(lanes) == 1 and lanes[0][3] == self.parallelism and lanes[0][2] == 0:
            return [lanes[0][0], lanes[0][1]]  # the format from before rescaling existed
        return self._lanes.snapshot()

    def restore(self, position: Any) -> None:
        self._lanes = LaneReader(position_lanes(position, 0, self.subtask_index, self.parallelism))
        self._pending_block = None
