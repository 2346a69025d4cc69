"""GeneratorSource's keys in bursts: a function of seq alone (what scripts/flink_windows_job.py computes in SQL),
the same at any parallelism, and shaped so that session windows close once per key every ten bursts."""

from __future__ import annotations

import pytest

from runtime.connectors.generator import BURST_GROUPS, BURST_RECORDS, GeneratorSource, burst_key_index
from tests.support.generator import read_all


def test_a_key_in_bursts_is_the_rule_of_its_seq_at_any_parallelism() -> None:
    one = read_all(GeneratorSource(count=25_000, keys=1000, seed=3, distribution="bursts"))
    assert [r[0] for r in one] == [f"k{burst_key_index(seq, 1000):03d}" for seq in range(25_000)]
    two = [r for i in (0, 1) for r in read_all(GeneratorSource(count=25_000, keys=1000, seed=3,
                                                                distribution="bursts"), i, 2)]
    assert sorted(one, key=lambda r: r[1]) == sorted(two, key=lambda r: r[1])


def test_a_key_is_active_in_one_burst_of_ten_and_takes_turns_inside_it() -> None:
    seqs: dict[int, list[int]] = {}
    for seq in range(3 * BURST_GROUPS * BURST_RECORDS):
        seqs.setdefault(burst_key_index(seq, 1000), []).append(seq)
    assert len(seqs) == 1000
    gaps = {b - a for s in seqs.values() for a, b in zip(s, s[1:], strict=False)}
    assert gaps == {1000 // BURST_GROUPS, (BURST_GROUPS - 1) * BURST_RECORDS + 1000 // BURST_GROUPS}


def test_keys_in_bursts_need_a_multiple_of_the_groups() -> None:
    with pytest.raises(ValueError, match="multiple"):
        GeneratorSource(keys=1001, distribution="bursts")
