"""The chaos runs' fault plan and rescale targets (runtime/cli/chaos.py), without a cluster."""

from __future__ import annotations

import random

from runtime.cli.chaos import fault_plan, rescale_target


def test_fault_plan_puts_a_rescale_after_each_kill() -> None:
    plan = fault_plan(kills=3, coordinator_kills=0, rescales=2, rng=random.Random(1))
    assert sorted(plan[0::2][:3]) == ["in-flight", "random", "sink"] and plan[1::2] == ["rescale", "rescale"]
    assert fault_plan(kills=1, coordinator_kills=0, rescales=3, rng=random.Random(1)) == [
        "in-flight", "rescale", "rescale", "rescale"]
    assert fault_plan(kills=2, coordinator_kills=0, rescales=0, rng=random.Random(1)).count("rescale") == 0


def test_fault_plan_mixes_coordinator_kills_with_worker_kills_and_rescales() -> None:
    plan = fault_plan(kills=3, coordinator_kills=2, rescales=2, rng=random.Random(3))
    assert sorted(plan) == ["coordinator", "coordinator", "in-flight", "random", "rescale", "rescale", "sink"]
    assert plan[1] == "rescale" and plan[3] == "rescale" and plan[0] != "rescale" and plan[2] != "rescale"


def test_rescale_target_is_another_parallelism_in_range() -> None:
    rng = random.Random(7)
    for current in range(1, 5):
        targets = {rescale_target(current, 4, rng) for _ in range(50)}
        assert targets == set(range(1, 5)) - {current}
    assert rescale_target(1, 1, rng) == 1


def test_fault_plan_puts_each_wipe_before_a_worker_kill_and_the_partition_last() -> None:
    plan = fault_plan(kills=1, coordinator_kills=1, rescales=0, rng=random.Random(2), wipes=1, partitions=1)
    assert plan.index("wipe") + 1 == plan.index("in-flight") and plan[-1] == "partition", plan
    assert sorted(plan) == ["coordinator", "in-flight", "partition", "wipe"]
    # more wipes than worker kills: the rest go after them
    assert fault_plan(kills=0, coordinator_kills=0, rescales=0, rng=random.Random(1), wipes=2) == ["wipe", "wipe"]
