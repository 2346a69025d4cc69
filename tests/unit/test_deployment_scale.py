"""What a worker's deployment costs at scale: runtime/graph/plan.py channels_touching finds the channels its
subtasks touch without walking every channel of an all-to-all edge, in the order `channels_of_edge` gives them
(an input channel's index in its gate follows that order); runtime/worker/deployment.py sizing_period_s keeps
the buffer sizing's timer within its share of a core however many output channels the worker has."""

from __future__ import annotations

import itertools

from runtime.execution.inflight import ADJUST_PERIOD_S
from runtime.graph.plan import Edge, channels_of_edge, channels_touching
from runtime.worker.deployment import SIZING_COST_S, SIZING_CPU_SHARE, sizing_period_s


def edge(partitioner: str) -> Edge:
    return Edge(id=0, up=0, down=1, partitioner=partitioner, input_index=0, channel_base=0)


def test_all_to_all_exact_pairs() -> None:
    # producer 1 here: all its outputs; consumer 2 here: its input from every producer
    assert list(channels_touching(edge("hash"), 3, 4, {1}, {2})) == [
        (0, 2), (1, 0), (1, 1), (1, 2), (1, 3), (2, 2)]


def test_forward_exact_pairs() -> None:
    assert list(channels_touching(edge("forward"), 4, 4, {3}, {0, 3})) == [(0, 0), (3, 3)]


def test_nothing_here_nothing_touched() -> None:
    assert list(channels_touching(edge("hash"), 5, 5, set(), set())) == []
    assert list(channels_touching(edge("forward"), 5, 5, set(), set())) == []


def test_equals_the_filtered_full_list() -> None:
    for partitioner, up_p, down_p in (("hash", 4, 3), ("rebalance", 3, 5), ("forward", 4, 4)):
        full = channels_of_edge(edge(partitioner), up_p, down_p)
        for n_up, n_down in itertools.product(range(up_p + 1), range(down_p + 1)):
            for producers in map(set, itertools.combinations(range(up_p), n_up)):
                for consumers in map(set, itertools.combinations(range(down_p), n_down)):
                    expected = [(i, j) for i, j in full if i in producers or j in consumers]
                    got = list(channels_touching(edge(partitioner), up_p, down_p, producers, consumers))
                    assert got == expected, (partitioner, producers, consumers)


def test_sizing_period_grows_with_the_channels_past_its_share() -> None:
    assert sizing_period_s(0) == ADJUST_PERIOD_S
    assert sizing_period_s(500) == ADJUST_PERIOD_S  # 500 x 2 us every 0.2 s: exactly the share
    assert sizing_period_s(2500) == 1.0  # 1,000 tasks on 100 workers: every second
    for channels in (1, 100, 499, 501, 2500, 100_000):
        period = sizing_period_s(channels)
        assert period >= ADJUST_PERIOD_S
        assert channels * SIZING_COST_S / period <= SIZING_CPU_SHARE + 1e-12
