"""The load-based scaling policy (coordinator/load_policy.py): from samples of vertex rates and busy time to
decisions, with exact lists: a bottleneck scales up, an idle vertex scales down, the band holds, stabilisation
and the window hold, the clamps, groups, pinned vertices and implicit rebalances constrain."""

from __future__ import annotations

import pytest

from coordinator.load_policy import (
    COLLECTING,
    DOWN,
    EVALUATED,
    STABILIZING,
    UP,
    LoadGraph,
    LoadVertex,
    Sample,
    VertexFigures,
    VertexLoad,
    evaluate,
    measured,
)
from runtime.graph.job_config import AutoscalerConfig, JobConfig, JobConfigError

SETTINGS = AutoscalerConfig(enabled=True, target_utilization=0.7, utilization_boundary=0.2, window_s=10.0,
                            stabilization_s=5.0)
READY = 15.0  # started at 0: stabilisation 5 s, then a window of 10 s


def fig(records_in: float, busy: float, *, out: float | None = None, bp: float = 0.0) -> VertexFigures:
    return VertexFigures(records_in, records_in if out is None else out, busy, bp)


def line(work: int = 1, *, sink: int = 1, rate: float | None = 100.0, work_pinned: bool = False,
         apart: bool = False) -> LoadGraph:
    """source (asked for `rate` records/s) -> work -> sink, explicit rebalances unless `apart`."""
    vertices = (LoadVertex("source", 1, (), source=True, source_rate=rate, group="g0"),
                LoadVertex("work", work, ("source",), pinned=work_pinned, group="g1", operators=("work",)),
                LoadVertex("sink", sink, ("work",), group="g2"))
    return LoadGraph(vertices, (("work", "sink"),) if apart else ())


def steady(figures: dict[str, VertexFigures], times: range | list[float] = range(5, 16)) -> list[Sample]:
    return [Sample(float(t), figures) for t in times]


def run(graph: LoadGraph, samples: list[Sample], *, now: float = READY, slots: int = 8,
        settings: AutoscalerConfig = SETTINGS) -> list[tuple[str, int, int, str]]:
    ev = evaluate(graph, samples, settings=settings, started_at=0.0, now=now, slots=slots)
    return [(d.vertex, d.before, d.after, d.direction) for d in ev.decisions]


BOTTLENECK = {"source": fig(50, 0.05, bp=0.9), "work": fig(50, 1.0), "sink": fig(50, 0.01)}
IDLE_WORK = {"source": fig(100, 0.05), "work": fig(100, 0.05), "sink": fig(100, 0.01)}


def test_a_bottleneck_scales_up_to_the_target_utilisation() -> None:
    ev = evaluate(line(), steady(BOTTLENECK), settings=SETTINGS, started_at=0.0, now=READY, slots=8)
    assert ev.status == EVALUATED and ev.ready_at == READY
    # work takes 50/s at full busy time; it must take the 100/s the source is asked for: load 2.0, so
    # ceil(1 * 2.0 / 0.7) = 3; the source (capacity 1,000/s) and the sink (5,000/s) are at their least already
    assert ev.loads == (VertexLoad("source", 1, 50.0, 0.05, 1000.0, 100.0, 0.1, 1),
                        VertexLoad("work", 1, 50.0, 1.0, 50.0, 100.0, 2.0, 3),
                        VertexLoad("sink", 1, 50.0, 0.01, 5000.0, 100.0, 0.02, 1))
    assert [(d.vertex, d.before, d.after, d.direction) for d in ev.decisions] == [("work", 1, 3, UP)]
    assert ev.decisions[0].reason == (
        "bottleneck: load 200% of its capacity > 90% (target rate 100.0 records/s, true processing rate 50.0 "
        "records/s at busy 100%, 50.0 records/s in); 1 -> 3 for 70%")


def test_a_bottleneck_just_above_the_band_gains_at_least_one_subtask() -> None:
    # load 0.95: ceil(2 * 0.95 / 0.7) = 3
    assert run(line(2), steady({**BOTTLENECK, "work": fig(100, 0.95)})) == [("work", 2, 3, UP)]
    # load 0.91 at parallelism 1: ceil(1.3) = 2
    assert run(line(1), steady({**BOTTLENECK, "work": fig(100, 0.91)})) == [("work", 1, 2, UP)]


def test_an_idle_vertex_scales_down() -> None:
    # work at 4 takes 100/s busy 5 %: capacity 2,000/s, load 0.05, ceil(4 * 0.05 / 0.7) = 1
    assert run(line(4), steady(IDLE_WORK)) == [("work", 4, 1, DOWN)]
    # load 0.4 at 4: ceil(2.29) = 3
    assert run(line(4), steady({**IDLE_WORK, "work": fig(100, 0.4)})) == [("work", 4, 3, DOWN)]


@pytest.mark.parametrize("busy", [0.5, 0.55, 0.7, 0.85, 0.89])
def test_a_load_within_the_band_holds(busy: float) -> None:
    # 100/s in at `busy`: capacity 100 / busy, load = busy: 0.5 .. 0.9 is the band (0.5 itself holds)
    ev = evaluate(line(2), steady({**IDLE_WORK, "work": fig(100, busy)}), settings=SETTINGS, started_at=0.0,
                  now=READY, slots=8)
    assert ev.status == EVALUATED and ev.decisions == ()
    assert [(load.vertex, load.recommended) for load in ev.loads] == [("source", 1), ("work", 2), ("sink", 1)]


def test_nothing_is_decided_during_the_stabilisation_or_before_a_whole_window() -> None:
    samples = steady(BOTTLENECK, [float(t) for t in range(0, 16)])
    assert evaluate(line(), samples, settings=SETTINGS, started_at=0.0, now=4.9, slots=8).status == STABILIZING
    collecting = evaluate(line(), samples, settings=SETTINGS, started_at=0.0, now=14.9, slots=8)
    assert collecting.status == COLLECTING and collecting.decisions == () and collecting.ready_at == READY
    assert [(load.vertex, load.utilization, load.recommended) for load in collecting.loads] == [
        ("source", 0.1, 1), ("work", 2.0, 1), ("sink", 0.02, 1)]  # the figures so far, nothing recommended
    assert run(line(), samples, now=15.0) == [("work", 1, 3, UP)]
    # a later start (a restart, a rescale, the last decision) starts the wait again
    later = evaluate(line(), samples, settings=SETTINGS, started_at=3.0, now=15.0, slots=8)
    assert later.status == COLLECTING and later.ready_at == 18.0
    # fewer than two samples in the window: still collecting
    assert evaluate(line(), samples[-1:], settings=SETTINGS, started_at=0.0, now=15.0, slots=8).status == COLLECTING


def test_samples_outside_the_window_do_not_count() -> None:
    # the bottleneck was over 14 s ago: the window (the last 10 s) holds only the idle samples
    samples = [*steady(BOTTLENECK, [5.0, 6.0]), *steady(IDLE_WORK, [float(t) for t in range(10, 21)])]
    assert run(line(4), samples, now=20.0) == [("work", 4, 1, DOWN)]
    assert run(line(4), samples, now=16.0) == []  # the bottleneck samples still in the window: not idle throughout


def test_a_scale_down_needs_the_vertex_idle_in_every_sample_of_the_window() -> None:
    busy_once = steady(IDLE_WORK)
    busy_once[4] = Sample(busy_once[4].at, {**IDLE_WORK, "work": fig(100, 1.0)})  # load 1.0 in that one sample
    # the window's mean load is 0.14 (below 0.5) but the vertex was not idle throughout: it holds
    assert run(line(4), busy_once) == []
    assert run(line(4), steady(IDLE_WORK)) == [("work", 4, 1, DOWN)]
    # the same with each sample's utilisation computed once when it was taken (what the shell does)
    assert run(line(4), [measured(line(4), s) for s in busy_once]) == []
    assert measured(line(4), busy_once[4]).utilization == {"source": 0.05, "work": 1.0, "sink": 0.01}


def test_clamps_to_min_max_and_the_slots() -> None:
    assert run(line(), steady(BOTTLENECK), settings=AutoscalerConfig(
        enabled=True, window_s=10.0, stabilization_s=5.0, max_parallelism=2)) == [("work", 1, 2, UP)]
    assert run(line(), steady(BOTTLENECK), slots=2) == [("work", 1, 2, UP)]
    assert run(line(2), steady(BOTTLENECK), slots=2) == []  # at the cluster's slots already
    low = AutoscalerConfig(enabled=True, window_s=10.0, stabilization_s=5.0, min_parallelism=2)
    assert run(line(4), steady(IDLE_WORK), settings=low) == [("work", 4, 2, DOWN)]
    assert run(line(2), steady(IDLE_WORK), settings=low) == []


def test_scale_ups_fit_the_slot_sharing_groups_together() -> None:
    """Each slot sharing group takes its largest parallelism's slots: a scale-up within the slots on its own
    may not fit beside another group, and placement would refuse it; it is trimmed instead, the highest first."""
    def grouped(work: int, sink: int) -> LoadGraph:
        return LoadGraph((LoadVertex("source", 2, (), source=True, source_rate=200.0, group="g0"),
                          LoadVertex("work", work, ("source",), group="g1", slot_group="work"),
                          LoadVertex("sink", sink, ("work",), group="g2", slot_group="sink")))

    # the source within the band holds; work takes 150 of the 200/s asked, always busy: ceil(2 * 1.33 / 0.7) = 4;
    # the sink must take 200/s at a true 214/s: ceil(2 * 0.93 / 0.7) = 3
    hot = {"source": fig(200, 0.6), "work": fig(150, 1.0), "sink": fig(150, 0.7)}
    assert run(grouped(2, 2), steady(hot), slots=9) == [("work", 2, 4, UP), ("sink", 2, 3, UP)]  # 2 + 4 + 3
    # 8 slots: the default group's 2 leave 6: the highest (work) steps down to 3
    assert run(grouped(2, 2), steady(hot), slots=8) == [("work", 2, 3, UP), ("sink", 2, 3, UP)]
    assert run(grouped(2, 2), steady(hot), slots=7) == [("sink", 2, 3, UP)]  # work, first of the two at 3, gives up
    assert run(grouped(2, 2), steady(hot), slots=6) == []  # 2 + 2 + 2 already: nothing more fits
    # one group, as before: the largest parallelism is all it takes
    one = LoadGraph(tuple(LoadVertex(v.name, v.parallelism, v.inputs, source=v.source, source_rate=v.source_rate,
                                     group=v.group) for v in grouped(2, 2).vertices))
    assert run(one, steady(hot), slots=4) == [("work", 2, 4, UP), ("sink", 2, 3, UP)]


def test_a_group_moves_together_to_the_largest_need() -> None:
    # two vertices that must keep equal parallelism (a forward edge that does not chain, one operator name)
    graph = LoadGraph((LoadVertex("source", 2, (), source=True, source_rate=200.0, group="g0"),
                       LoadVertex("parse", 2, ("source",), group="g1"),
                       LoadVertex("enrich", 2, ("parse",), group="g1")))
    figures = {"source": fig(200, 0.1), "parse": fig(200, 0.1), "enrich": fig(200, 1.0)}
    # enrich: load 1.0, ceil(2 / 0.7) = 3; parse is idle (it would go to 1) but follows enrich; the source, in a
    # group of its own and idle, goes to ceil(2 * 0.1 / 0.7) = 1
    assert run(graph, steady(figures)) == [("source", 2, 1, DOWN), ("parse", 2, 3, UP), ("enrich", 2, 3, UP)]
    ev = evaluate(graph, steady(figures), settings=SETTINGS, started_at=0.0, now=READY, slots=8)
    assert ev.decisions[1].reason.startswith("kept with the vertices it must match")


def test_pinned_vertices_hold_and_hold_their_group() -> None:
    assert run(line(work_pinned=True), steady(BOTTLENECK)) == []
    graph = LoadGraph((LoadVertex("source", 2, (), source=True, source_rate=200.0, pinned=True, group="g0"),
                       LoadVertex("map", 2, ("source",), group="g0")))
    assert run(graph, steady({"source": fig(200, 0.1), "map": fig(200, 1.0)})) == []


def test_an_implicit_rebalance_stays_a_rebalance() -> None:
    # work (4) -> sink (1) without a partitioner: work idle would go to 1, which would chain it with the sink;
    # 0 is below the least, so it holds
    assert run(line(4, apart=True), steady(IDLE_WORK)) == []
    # work (2) -> sink (3, at the target load): the bottleneck would reach 3, equal to the sink: it goes one
    # further, to 4
    figures = {**BOTTLENECK, "work": fig(100, 0.95), "sink": fig(50, 0.35)}
    assert run(line(2, sink=3, apart=True), steady(figures)) == [("work", 2, 4, UP)]
    # ...unless 4 is above the ceiling: then it stays
    assert run(line(2, sink=3, apart=True), steady(figures), slots=3) == []


def test_a_backpressured_source_without_an_asked_rate_stands_for_its_true_rate() -> None:
    # the source reads 50/s busy 10 %, backpressured 90 %: unthrottled it would read 500/s, which work (capacity
    # 50/s at 1) must take: load 10, ceil(14.3) = 15, clamped to the 8 slots; the source itself holds
    figures = {"source": fig(50, 0.1, bp=0.9), "work": fig(50, 1.0), "sink": fig(50, 0.01)}
    ev = evaluate(line(rate=None), steady(figures), settings=SETTINGS, started_at=0.0, now=READY, slots=8)
    assert [(d.vertex, d.after) for d in ev.decisions] == [("work", 8)]
    assert [(load.vertex, load.target_rate, load.utilization) for load in ev.loads] == [
        ("source", None, None), ("work", 500.0, 10.0), ("sink", 500.0, 0.1)]


def test_an_unthrottled_source_keeping_up_is_its_own_target() -> None:
    # not backpressured: the source must read what it reads; busy 95 % it is the bottleneck (a file read as fast
    # as it goes) and scales up; downstream takes what it emits
    figures = {"source": fig(1000, 0.95), "work": fig(1000, 0.6), "sink": fig(1000, 0.01)}
    assert run(line(2, rate=None), steady(figures)) == [("source", 1, 2, UP)]


def test_output_ratios_carry_the_target_downstream() -> None:
    # work keeps one record in ten: the sink's target is 10/s of the source's 100/s
    figures = {"source": fig(100, 0.05), "work": fig(100, 0.5, out=10), "sink": fig(10, 0.01)}
    ev = evaluate(line(), steady(figures), settings=SETTINGS, started_at=0.0, now=READY, slots=8)
    assert [(load.vertex, load.target_rate) for load in ev.loads] == [("source", 100.0), ("work", 100.0),
                                                                       ("sink", 10.0)]


def test_a_vertex_busy_for_no_measurable_time_is_idle_and_one_busy_without_records_is_unknown() -> None:
    figures = {"source": fig(100, 0.05), "work": fig(100, 0.0), "sink": fig(0, 0.6)}
    ev = evaluate(line(3, sink=2), steady(figures), settings=SETTINGS, started_at=0.0, now=READY, slots=8)
    assert [(load.vertex, load.true_rate, load.utilization) for load in ev.loads] == [
        ("source", 2000.0, 0.05), ("work", None, 0.0), ("sink", 0.0, None)]
    assert [(d.vertex, d.after) for d in ev.decisions] == [("work", 1)]  # the sink holds: its load is not known


def test_a_vertex_missing_from_a_sample_leaves_that_sample_out() -> None:
    samples = steady(IDLE_WORK)
    samples[3] = Sample(samples[3].at, {"source": fig(100, 0.05)})
    assert run(line(4), samples) == [("work", 4, 1, DOWN)]


# -- the settings ---------------------------------------------------------------------------


def test_the_autoscaler_settings_come_from_the_job_config_off_by_default() -> None:
    assert JobConfig.from_document({}).autoscaler == AutoscalerConfig()
    assert not AutoscalerConfig().enabled and "autoscaler" not in JobConfig().to_document()
    config = JobConfig.from_document({"autoscaler": {"enabled": True, "dry_run": True, "window_s": 5,
                                                     "max_parallelism": 4}})
    assert config.autoscaler == AutoscalerConfig(enabled=True, dry_run=True, window_s=5, max_parallelism=4)
    assert JobConfig.from_document(config.to_document()) == config
    assert config.with_parallelism({"work": 2}).autoscaler == config.autoscaler  # a rescale keeps it
    assert (config.autoscaler.scale_up_above, config.autoscaler.scale_down_below) == (0.9, 0.5)


@pytest.mark.parametrize(("doc", "names"), [
    ({"enabled": "yes"}, "autoscaler.enabled must be true or false"),
    ({"target_utilization": 0}, "autoscaler.target_utilization must be in (0, 1]"),
    ({"target_utilization": 1.5}, "autoscaler.target_utilization must be in (0, 1]"),
    ({"utilization_boundary": 0.7}, "autoscaler.utilization_boundary must be >= 0 and below target_utilization"),
    ({"window_s": 0}, "autoscaler.window_s must be seconds > 0"),
    ({"stabilization_s": -1}, "autoscaler.stabilization_s must be seconds >= 0"),
    ({"min_parallelism": 0}, "autoscaler.min_parallelism must be an integer >= 1"),
    ({"max_parallelism": 2, "min_parallelism": 3}, "autoscaler.max_parallelism (2) is below min_parallelism (3)"),
    ({"window": 5}, "unknown autoscaler settings ['window']"),
])
def test_bad_autoscaler_settings_are_refused_naming_the_key(doc: dict[str, object], names: str) -> None:
    with pytest.raises(JobConfigError) as err:
        JobConfig.from_document({"autoscaler": doc})
    assert names in str(err.value)
