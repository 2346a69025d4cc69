"""The scale-down policy (coordinator/autoscale.py): which parallelism fits N slots, and when to scale up."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.autoscale import (
    AutoscaleSettings,
    Scaling,
    ScalingStatistics,
    Shape,
    ShapeEdge,
    ShapeNode,
    direction,
    fit_parallelism,
    fits,
    parse_scale_down_after,
    shape_of,
    should_scale_up,
)
from coordinator.metrics import DurationHistogram, JobsStatistics
from runtime.api import FileSink, GeneratorSource, Job
from runtime.connectors.source import Source
from runtime.graph.plan import apply_parallelism, chain_graph
from tests.support.metrics import NO_WORKERS, collector, samples


def chain(*ps: int, partitioner: str | None = None) -> Shape:
    """a -> b -> c ... with the given asked parallelisms."""
    nodes = tuple(ShapeNode(f"op{i}", p) for i, p in enumerate(ps))
    return Shape(nodes, tuple(ShapeEdge(i, i + 1, partitioner) for i in range(len(ps) - 1)))


def test_enough_slots_keeps_the_ask() -> None:
    assert fit_parallelism(chain(4, 2, 4), 4) == {"op0": 4, "op1": 2, "op2": 4}
    assert fit_parallelism(chain(4, 2, 4), 9) == {"op0": 4, "op1": 2, "op2": 4}


def test_uniform_job_runs_at_the_free_slots() -> None:
    assert fit_parallelism(chain(3, 3, 3), 2) == {"op0": 2, "op1": 2, "op2": 2}
    assert fit_parallelism(chain(3, 3, 3), 1) == {"op0": 1, "op1": 1, "op2": 1}
    assert fit_parallelism(chain(3, 3), 0) is None


def test_operators_shrink_in_proportion_at_least_one() -> None:
    shape = chain(8, 4, 1, partitioner="hash")
    assert fit_parallelism(shape, 4) == {"op0": 4, "op1": 2, "op2": 1}
    assert fit_parallelism(shape, 2) == {"op0": 2, "op1": 1, "op2": 1}


def test_forward_pairs_keep_equal_parallelism() -> None:
    nodes = (ShapeNode("src", 4), ShapeNode("map", 4), ShapeNode("agg", 2), ShapeNode("sink", 2))
    shape = Shape(nodes, (ShapeEdge(0, 1, "forward"), ShapeEdge(1, 2, "hash"), ShapeEdge(2, 3, None)))
    assert fit_parallelism(shape, 3) == {"src": 3, "map": 3, "agg": 1, "sink": 1}


def test_slot_sharing_groups_add_up_and_shrink_alike() -> None:
    nodes = (ShapeNode("src", 4), ShapeNode("join", 4, slot_sharing_group="join"), ShapeNode("sink", 2, False, "join"))
    shape = Shape(nodes, (ShapeEdge(0, 1, "hash"), ShapeEdge(1, 2, "rebalance")))
    assert shape.slots_needed == 8
    assert fit_parallelism(shape, 8) == {"src": 4, "join": 4, "sink": 2}
    assert fit_parallelism(shape, 4) == {"src": 2, "join": 2, "sink": 1}
    assert fit_parallelism(shape, 1) is None  # each group needs a slot


def test_an_implicit_rebalance_does_not_collapse_into_a_forward_edge() -> None:
    # 4 -> 3 without a partitioner is a rebalance; at 2 slots both would be 2 (forward, chained: another graph)
    fitted = fit_parallelism(chain(4, 3), 2)
    assert fitted == {"op0": 2, "op1": 1}
    assert fit_parallelism(chain(4, 3), 1) is None  # 1 and 1 would chain them: nothing fits


def test_pinned_operators_keep_their_ask_or_nothing_fits() -> None:
    nodes = (ShapeNode("src", 2, pinned=True), ShapeNode("count", 4))
    shape = Shape(nodes, (ShapeEdge(0, 1, "hash"),))
    assert fit_parallelism(shape, 3) == {"src": 2, "count": 3}
    assert fit_parallelism(shape, 1) is None


def test_one_name_means_one_parallelism() -> None:
    nodes = (ShapeNode("x", 4), ShapeNode("x", 4), ShapeNode("y", 2))
    shape = Shape(nodes, (ShapeEdge(0, 2, "hash"), ShapeEdge(1, 2, "hash")))
    assert fit_parallelism(shape, 2) == {"x": 2, "y": 1}
    clash = Shape((ShapeNode("x", 4), ShapeNode("x", 2)), (ShapeEdge(0, 1, "hash"),))
    assert fit_parallelism(clash, 2) is None


class Fixed(Source):
    """A source that cannot be restored at another parallelism (the default)."""


def test_shape_of_a_built_job_pins_fixed_sources_and_mixed_broadcast_readers(tmp_path: object) -> None:
    job = Job("j")
    words = job.source(GeneratorSource(count=10, keys=3, seed=1), parallelism=3)
    words.key_by(lambda r: r[0]).reduce(lambda a, b: a, parallelism=3).sink(FileSink(str(tmp_path)))
    fixed = job.source(Fixed(), parallelism=2, name="fixed")
    fixed.broadcast().map(lambda r: r, parallelism=3, name="bmap")
    shape = shape_of(job)
    assert [(n.name, n.parallelism, n.pinned) for n in shape.nodes] == [
        ("GeneratorSource", 3, False), ("reduce", 3, False), ("FileSink", 3, False), ("fixed", 2, True),
        ("bmap", 3, False)]
    # a broadcast reader is replicated on a rescale: it shrinks like any other operator
    assert fit_parallelism(shape, 2) == {"GeneratorSource": 2, "reduce": 2, "FileSink": 2, "fixed": 2, "bmap": 2}
    mixed = Job("m")
    rules = mixed.source(GeneratorSource(count=10, keys=3, seed=1), parallelism=1, name="rules")
    main = mixed.source(GeneratorSource(count=10, keys=3, seed=1), parallelism=3, name="main")
    rules.broadcast().union(main.rebalance()).map(lambda r: r, parallelism=3, name="both")
    assert [n.pinned for n in shape_of(mixed).nodes] == [False, False, True]
    assert fit_parallelism(shape_of(mixed), 2) is None  # "both" needs its 3


def job_without_broadcast(tmp_path: object) -> Job:
    job = Job("j")
    words = job.source(GeneratorSource(count=10, keys=3, seed=1), parallelism=3)
    words.key_by(lambda r: r[0]).reduce(lambda a, b: a, parallelism=3).sink(FileSink(str(tmp_path)))
    return job


@st.composite
def shapes(draw: st.DrawFn) -> Shape:
    """Random DAGs (edges go from lower to higher index) with consistent asked parallelism: explicit forward
    pairs are equal, as the job API enforces."""
    n = draw(st.integers(1, 7))
    ps = [draw(st.integers(1, 12)) for _ in range(n)]
    edges = []
    for down in range(1, n):
        forward_in = False
        for up in sorted(draw(st.sets(st.integers(0, down - 1), min_size=1, max_size=min(2, down)))):
            part = draw(st.sampled_from([None, None, "hash", "rebalance", "forward", "broadcast"]))
            if part == "forward":
                if forward_in:
                    part = "hash"  # one forward input fixes the parallelism; a second could contradict it
                else:
                    ps[down], forward_in = ps[up], True
            edges.append((up, down, part))
    pinned = [draw(st.booleans()) and draw(st.booleans()) for _ in range(n)]
    groups = [draw(st.sampled_from(["default", "default", "other"])) for _ in range(n)]  # slot sharing groups
    nodes = tuple(ShapeNode(f"n{i}", p, pin, g) for i, (p, pin, g) in enumerate(zip(ps, pinned, groups, strict=True)))
    return Shape(nodes, tuple(ShapeEdge(u, d, p) for u, d, p in edges))


@settings(max_examples=300, deadline=None)
@given(shapes(), st.integers(0, 14))
def test_any_fit_keeps_every_constraint(shape: Shape, slots: int) -> None:
    fitted = fit_parallelism(shape, slots)
    if fitted is None:
        return
    assert fits(shape, fitted, slots)
    assert shape.slots_used([fitted[n.name] for n in shape.nodes]) <= slots
    assert all(1 <= fitted[n.name] <= n.parallelism for n in shape.nodes)
    if shape.slots_needed <= slots:
        assert fitted == {n.name: n.parallelism for n in shape.nodes}


@settings(max_examples=300, deadline=None)
@given(shapes(), st.integers(1, 14))
def test_without_pins_or_implicit_rebalances_a_fit_always_exists_and_uses_the_slots(shape: Shape,
                                                                                   slots: int) -> None:
    plain = Shape(tuple(ShapeNode(n.name, n.parallelism) for n in shape.nodes),
                  tuple(e if e.partitioner is not None or shape.nodes[e.up].parallelism ==
                        shape.nodes[e.down].parallelism else ShapeEdge(e.up, e.down, "rebalance")
                        for e in shape.edges))
    fitted = fit_parallelism(plain, slots)
    assert fitted is not None
    assert max(fitted.values()) == min(slots, plain.slots_needed)  # the largest operator gets every slot


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(1, 6), min_size=1, max_size=4), st.integers(1, 8), st.integers(1, 8))
def test_the_fitted_job_chains_into_the_same_task_types(ps: list[int], slots: int, hash_at: int) -> None:
    """The restore checks task type names: a shrunk job must chain exactly as the asked one."""
    job = Job("j")
    stream = job.source(GeneratorSource(count=10, keys=3, seed=1), parallelism=ps[0], name="src")
    for i, p in enumerate(ps[1:], 1):
        stream = stream.key_by(lambda r: r[0]).reduce(lambda a, b: a, parallelism=p, name=f"r{i}") \
            if i == hash_at else stream.map(lambda r: r, parallelism=p, name=f"m{i}")
    asked = [v.name for v in chain_graph(job)[0]]
    fitted = fit_parallelism(shape_of(job), slots)
    if fitted is None:
        return
    apply_parallelism(job, fitted)
    assert [v.name for v in chain_graph(job)[0]] == asked


def test_scale_up_only_when_nothing_goes_down() -> None:
    assert should_scale_up({"a": 2, "b": 1}, {"a": 3, "b": 1})
    assert not should_scale_up({"a": 2, "b": 1}, {"a": 2, "b": 1})
    assert not should_scale_up({"a": 2, "b": 2}, {"a": 3, "b": 1})
    assert not should_scale_up({"a": 2}, None)
    assert not should_scale_up({"*": 2}, {"a": 3})
    assert direction({"x": 3}, {"x": 2}) == "down" and direction({"x": 2}, {"x": 3}) == "up"
    assert direction(None, {"x": 2}) is None and direction({"x": 2}, {"x": 2}) is None


def test_scaling_reason_keeps_the_first_time() -> None:
    s = Scaling()
    s.scaled_down(free=2, needed=3, now=0.0)
    s.scaled_down(free=1, needed=3, now=100.0)
    assert s.reason == "scaled down: 1 slot free of 3 needed since 1970-01-01T00:00:00Z"
    s.at_ask()
    assert s.reason == "" and s.since is None


def test_scale_down_after_settings() -> None:
    settings_ = AutoscaleSettings(scale_down_after_s=10.0)
    assert settings_.scale_down_after(None) == 10.0
    assert settings_.scale_down_after(2.5) == 2.5
    assert settings_.scale_down_after(0.0) is None
    assert AutoscaleSettings(scale_down_after_s=0).scale_down_after(None) is None
    assert parse_scale_down_after("never") == 0.0 and parse_scale_down_after(3) == 3.0
    for bad in (-1, "soon", True, float("nan")):
        with pytest.raises(ValueError):
            parse_scale_down_after(bad)
    with pytest.raises(ValueError):
        AutoscaleSettings(scale_up_after_s=-1)


def test_scale_counters_are_exported() -> None:
    h = DurationHistogram().statistics()
    js = JobsStatistics((), h, h, (ScalingStatistics("a", 2, 1, True), ScalingStatistics("b", 0, 0, False)))
    got = samples(collector(NO_WORKERS, js))
    assert got[("sluice_job_scale_downs_total", (("job_id", "a"),))] == 2
    assert got[("sluice_job_scale_ups_total", (("job_id", "a"),))] == 1
    assert got[("sluice_job_scaled_down", (("job_id", "a"),))] == 1
    assert got[("sluice_job_scaled_down", (("job_id", "b"),))] == 0


def test_a_worker_counts_for_scaling_up_only_once_it_has_stayed(tmp_path: object) -> None:
    """A flapping worker re-registers with a new `registered_at` every time, so it never counts."""
    import time

    from coordinator.job_manager import JobManager
    from coordinator.registry import WorkerRecord, WorkerRegistry
    from coordinator.storage import LocalCheckpointStorage

    registry = WorkerRegistry()
    now = time.monotonic()
    for wid, slots, age in (("old", 2, 30.0), ("new", 3, 1.0)):
        registry.register(WorkerRecord(wid, None, slots, "127.0.0.1", 1, None, None,  # type: ignore[arg-type]
                                       registered_at=now - age))
    manager = JobManager(workers=registry, storage=LocalCheckpointStorage(str(tmp_path)),
                         autoscale=AutoscaleSettings(scale_up_after_s=5.0))
    assert manager.slots() == 5
    assert manager.slots(settled_for_s=manager.autoscale.scale_up_after_s) == 2
