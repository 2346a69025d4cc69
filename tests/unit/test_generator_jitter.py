"""GeneratorSource's out-of-order event times (jitter_ms): bounded, deterministic, and nothing changes at 0."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.connectors.generator import BLOCK, EVENT_TIME_START_MS, GeneratorSource, generate_block, key_names
from tests.support.generator import read_all


def test_without_jitter_the_records_are_the_ones_from_before() -> None:
    # The rule before jitter existed, written out: keys from the block's stream, event time = start + seq.
    keys = key_names(20)
    rng = random.Random(5 * 1_000_003 + 1)
    drawn = rng.choices(keys, k=BLOCK)
    before = [(k, BLOCK + i, EVENT_TIME_START_MS + BLOCK + i) for i, k in enumerate(drawn)]
    assert generate_block(1, seed=5, keys=keys, cum_weights=None, count=None) == before
    assert generate_block(1, seed=5, keys=keys, cum_weights=None, count=None, jitter_ms=0) == before
    assert read_all(GeneratorSource(count=3000, keys=20, seed=5)) == read_all(
        GeneratorSource(count=3000, keys=20, seed=5, jitter_ms=0))


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32), jitter=st.integers(1, 10_000), block=st.integers(0, 50))
def test_jitter_is_bounded_deterministic_and_leaves_keys_and_seq_alone(seed: int, jitter: int, block: int) -> None:
    keys = key_names(7)
    plain = generate_block(block, seed=seed, keys=keys, cum_weights=None, count=None)
    jittered = generate_block(block, seed=seed, keys=keys, cum_weights=None, count=None, jitter_ms=jitter)
    assert jittered == generate_block(block, seed=seed, keys=keys, cum_weights=None, count=None, jitter_ms=jitter)
    assert [(k, s) for k, s, _ in jittered] == [(k, s) for k, s, _ in plain]
    behind = [EVENT_TIME_START_MS + s - t for _, s, t in jittered]
    assert all(0 <= d <= jitter for d in behind), (min(behind), max(behind))
    assert len(set(behind)) > 1  # really out of order: 1024 draws from [0, jitter] are not all equal


def test_jitter_reaches_both_ends_and_does_not_depend_on_parallelism() -> None:
    one = read_all(GeneratorSource(count=5000, keys=10, seed=3, jitter_ms=3))
    assert {EVENT_TIME_START_MS + s - t for _, s, t in one} == {0, 1, 2, 3}
    two = [r for i in range(2) for r in read_all(GeneratorSource(count=5000, keys=10, seed=3, jitter_ms=3), i, 2)]
    assert sorted(one) == sorted(two)
    assert any(b[2] < a[2] for a, b in zip(one, one[1:], strict=False)), "event times must go backwards somewhere"


@pytest.mark.parametrize("bad", [-1, 1.5])
def test_bad_jitter_is_refused(bad: object) -> None:
    with pytest.raises(ValueError, match="jitter_ms must be an integer >= 0"):
        GeneratorSource(count=10, jitter_ms=bad)  # type: ignore[arg-type]


def test_a_throttled_generator_waits_until_its_next_record_is_due() -> None:
    # 4 records/s over 2 subtasks: 2 a second each, the first due 0.5 s after the start
    source = GeneratorSource(count=None, keys=5, seed=1, records_per_second=4.0)
    source.open(0, 2)
    assert 0.3 < source.idle_wait_s() <= 0.5 and source.read_batch(10) == []
    source._started -= 0.5  # half a second later
    assert len(source.read_batch(10) or []) == 1
    assert 0.3 < source.idle_wait_s() <= 0.5  # the second one half a second after the first
    source._started -= 2.0  # late: four records are due at once, no wait
    assert source.idle_wait_s() == 0.005 and len(source.read_batch(10) or []) == 4
    slow = GeneratorSource(count=None, keys=5, seed=1, records_per_second=0.1)
    slow.open(0, 1)
    assert slow.idle_wait_s() == 1.0  # the first in 10 s: a second at most, then it looks again
    unthrottled = GeneratorSource(count=10, keys=5)
    unthrottled.open(0, 1)
    assert unthrottled.idle_wait_s() == 0.005


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32), block=st.integers(0, 50), step=st.integers(1, 5),
       count=st.none() | st.integers(0, 60 * BLOCK))
def test_blocks_are_the_per_record_rule_at_any_step_and_a_short_last_block(seed: int, block: int, step: int,
                                                                         count: int | None) -> None:
    keys = key_names(30)
    start = block * BLOCK
    n = BLOCK if count is None else max(0, min(BLOCK, count - start))
    drawn = random.Random(seed * 1_000_003 + block).choices(keys, k=n)
    t0 = EVENT_TIME_START_MS + start * step
    rule = [(k, start + i, t0 + i * step) for i, k in enumerate(drawn)]
    assert generate_block(block, seed=seed, keys=keys, cum_weights=None, count=count, event_step_ms=step) == rule
