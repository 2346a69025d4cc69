"""Load-based scaling policy: from samples of every vertex's rates and busy time to a new parallelism per
vertex, as Flink's Kubernetes-operator autoscaler decides it. Pure: the caller (coordinator/load_scaler.py)
passes the samples, the graph, the settings, the slots and `now`; nothing here reads a clock or a job.

Per vertex (a task type), over the samples of the window:

- its TRUE processing rate: the records it took per second divided by the fraction of the time it was busy
  (records_in_per_s / busy_ratio), i.e. what it could take if it never waited for input or for output
  buffers. A vertex busy for no measurable time has no bound on it (None: idle).
- its TARGET rate: what it must take to keep up. A source that says what it is asked to read
  (`records_per_second`, GeneratorSource) must read that; another source must read what it read, unless it
  was backpressured, when the demand it could not meet is not known: downstream it stands for its own true
  rate (what it would read if nothing held it back) and it is not scaled itself. Every other vertex must
  take what its inputs must emit: each input's target rate times that input's output ratio
  (records_out_per_s / records_in_per_s).
- its UTILISATION: target rate / true rate, the fraction of its capacity the target takes. Above
  `target_utilization + utilization_boundary` it is a bottleneck and scales up; below
  `target_utilization - utilization_boundary` in the window's average AND in every sample of the window it
  is idle and scales down; in between it holds. The new parallelism is the one that brings the utilisation
  to the target: ceil(parallelism * utilisation / target_utilization) (at least one more for a bottleneck).

Then the constraints: every vertex within [min_parallelism, max_parallelism] and the job within the slots
the cluster has (each slot sharing group takes as many slots as its largest parallelism: scale-ups that do not
fit together are trimmed, the highest first); vertices of one group (joined by a
forward edge, or sharing an operator name: coordinator/autoscale.py) keep equal parallelism, the largest
any of them needs; a pinned vertex (a source that cannot split its input, a reader of a broadcast input and
another) keeps its parallelism and so does its group; two vertices joined by an implicit rebalance stay
different (equal, the edge would become a chained forward one).

Stabilisation: nothing is collected during `stabilization_s` after the attempt started (a deploy, a restart,
a rescale) or after the last decision, and nothing is decided until a whole `window_s` of samples followed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from runtime.graph.job_config import AutoscalerConfig
from runtime.graph.plan import DEFAULT_SLOT_SHARING_GROUP, group_slots

UP, DOWN = "up", "down"
STABILIZING, COLLECTING, EVALUATED = "stabilizing", "collecting", "evaluated"
BACKPRESSURED = 0.1  # a source backpressured this fraction of the time or more could not read what it wanted
BUSY_EPSILON = 1e-3  # busy less than this fraction of the time: no capacity bound measured (idle)
MAX_PARALLELISM = 128  # the default key groups (a job may set its own max_parallelism)


@dataclass(frozen=True, slots=True)
class VertexFigures:
    """One vertex's rates in one sample, as coordinator/rest_views.py's `job_graph` derives them from the
    heartbeats: records summed over its subtasks, the busiest subtask's busy and backpressured ratios."""

    records_in_per_s: float
    records_out_per_s: float
    busy_ratio: float
    backpressured_ratio: float


@dataclass(frozen=True, slots=True)
class Sample:
    at: float  # monotonic seconds
    vertices: Mapping[str, VertexFigures]  # vertex name -> its figures
    # each vertex's utilisation in this sample alone, once `measured` computed it (else computed when needed)
    utilization: Mapping[str, float | None] | None = None


def measured(graph: LoadGraph, sample: Sample) -> Sample:
    """`sample` with each vertex's utilisation in it alone: computed once when the sample is taken, since the
    scale-down check reads every sample of the window at every evaluation (the graph is the same for every
    sample of a window: a new attempt empties it)."""
    return replace(sample, utilization={n: load[2] for n, load in _loads(graph, sample.vertices).items()})


@dataclass(frozen=True, slots=True)
class LoadVertex:
    name: str
    parallelism: int  # now
    inputs: tuple[str, ...] = ()  # the vertices feeding it, one per edge
    source: bool = False
    source_rate: float | None = None  # records/s a source is asked to read, all subtasks together, if it says
    pinned: bool = False  # cannot be restored at another parallelism
    group: str = ""  # vertices of one non-empty group keep equal parallelism
    operators: tuple[str, ...] = ()  # the operator names a rescale request sets (not read by the policy)
    slot_group: str = DEFAULT_SLOT_SHARING_GROUP  # its slot sharing group: each group takes its largest parallelism


@dataclass(frozen=True, slots=True)
class LoadGraph:
    vertices: tuple[LoadVertex, ...]
    apart: tuple[tuple[str, str], ...] = ()  # vertex pairs that must keep different parallelism
    max_parallelism: int = MAX_PARALLELISM  # the job's key groups: no keyed operator runs at more subtasks


@dataclass(frozen=True, slots=True)
class VertexLoad:
    """What the policy made of one vertex over the window."""

    vertex: str
    parallelism: int
    records_in_per_s: float
    busy_ratio: float
    true_rate: float | None  # records/s at full busy time; None: busy for no measurable time
    target_rate: float | None  # records/s it must take; None: unknown (a backpressured source)
    utilization: float | None  # target / true; None: unknown
    recommended: int


@dataclass(frozen=True, slots=True)
class Decision:
    vertex: str
    before: int
    after: int
    direction: str  # UP | DOWN
    load: VertexLoad
    reason: str


@dataclass(frozen=True, slots=True)
class Evaluation:
    status: str  # STABILIZING, COLLECTING or EVALUATED
    ready_at: float  # monotonic: when a decision can first be taken
    loads: tuple[VertexLoad, ...] = ()
    decisions: tuple[Decision, ...] = ()


def window_start(*, started_at: float, now: float, settings: AutoscalerConfig) -> float:
    """The earliest sample time the window may hold: after the stabilisation, within `window_s` of now."""
    return max(started_at + settings.stabilization_s, now - settings.window_s)


def evaluate(graph: LoadGraph, samples: Sequence[Sample], *, settings: AutoscalerConfig, started_at: float,
             now: float, slots: int) -> Evaluation:
    """The decisions for `graph` from `samples` (oldest first; those outside the window are ignored), with the
    attempt (or the last decision) at `started_at` and `slots` slots in the cluster."""
    collect_from = started_at + settings.stabilization_s
    ready_at = collect_from + settings.window_s
    if now < collect_from:
        return Evaluation(STABILIZING, ready_at)
    names = [v.name for v in graph.vertices]
    by_name = {v.name: v for v in graph.vertices}
    start = window_start(started_at=started_at, now=now, settings=settings)
    window = [s for s in samples if start <= s.at <= now and all(n in s.vertices for n in names)]
    if now < ready_at or len(window) < 2:
        return Evaluation(COLLECTING, ready_at, _loads_only(graph, window))
    mean = {n: _mean([s.vertices[n] for s in window]) for n in names}
    loads = _loads(graph, mean)
    wanted = {v.name: _recommend(v, loads[v.name][2], True, settings) for v in graph.vertices}
    downs = [v.name for v in graph.vertices if wanted[v.name] < v.parallelism]
    if downs:  # idle on average: a scale-down needs the vertex idle in every sample too
        each = [s.utilization if s.utilization is not None else measured(graph, s).utilization for s in window]
        for name in downs:
            if not all(_below(u[name], settings) for u in each if u is not None):
                wanted[name] = by_name[name].parallelism
    target = _constrain(graph, wanted, settings=settings, slots=slots)
    views = tuple(_view(v, mean[v.name], loads[v.name], target[v.name]) for v in graph.vertices)
    decisions = tuple(Decision(load.vertex, load.parallelism, load.recommended,
                               UP if load.recommended > load.parallelism else DOWN, load,
                               _reason(load, wanted[load.vertex], settings))
                      for load in views if load.recommended != load.parallelism)
    return Evaluation(EVALUATED, ready_at, views, decisions)


def _loads_only(graph: LoadGraph, window: Sequence[Sample]) -> tuple[VertexLoad, ...]:
    """While collecting: the figures so far, every vertex recommended at its parallelism."""
    if not window:
        return ()
    mean = {v.name: _mean([s.vertices[v.name] for s in window]) for v in graph.vertices}
    loads = _loads(graph, mean)
    return tuple(_view(v, mean[v.name], loads[v.name], v.parallelism) for v in graph.vertices)


def _mean(figures: Sequence[VertexFigures]) -> VertexFigures:
    n = len(figures)
    return VertexFigures(sum(f.records_in_per_s for f in figures) / n, sum(f.records_out_per_s for f in figures) / n,
                         sum(f.busy_ratio for f in figures) / n, sum(f.backpressured_ratio for f in figures) / n)


Load = tuple[float | None, float | None, float | None]  # true rate, target rate, utilisation


def _loads(graph: LoadGraph, figures: Mapping[str, VertexFigures]) -> dict[str, Load]:
    """Every vertex's (true rate, target rate, utilisation) from one set of figures."""
    by_name = {v.name: v for v in graph.vertices}
    demand: dict[str, float | None] = {}  # records/s the vertex must take (a backpressured source: its true rate)

    def true_rate(name: str) -> float | None:
        f = figures[name]
        return f.records_in_per_s / f.busy_ratio if f.busy_ratio >= BUSY_EPSILON else None

    def demand_of(name: str, seen: frozenset[str] = frozenset()) -> float | None:
        if name in demand:
            return demand[name]
        v, f = by_name[name], figures[name]
        if v.source:
            if v.source_rate is not None:
                value: float | None = v.source_rate
            elif f.backpressured_ratio >= BACKPRESSURED:
                value = true_rate(name)  # what it would read if nothing held it back (None: unbounded)
            else:
                value = f.records_in_per_s
        elif name in seen:  # a cycle (iterations are not built today): no target known
            value = None
        else:
            parts = [_emitted(demand_of(up, seen | {name}), figures[up]) for up in v.inputs]
            value = None if any(p is None for p in parts) else sum(p for p in parts if p is not None)
        demand[name] = value
        return value

    out: dict[str, Load] = {}
    for v in graph.vertices:
        f = figures[v.name]
        rate = true_rate(v.name)
        target = demand_of(v.name)
        if v.source and v.source_rate is None and f.backpressured_ratio >= BACKPRESSURED:
            target = None  # held back: what it is asked to read is not known, so it is not scaled itself
        if target is None:
            utilization = None
        elif rate is None:
            utilization = 0.0  # busy for no measurable time: whatever it must take, it has room
        elif rate <= 0.0:
            utilization = None if target > 0 else 0.0  # busy without taking records (timers): not known
        else:
            utilization = target / rate
        out[v.name] = (rate, target, utilization)
    return out


def _emitted(demand: float | None, f: VertexFigures) -> float | None:
    """What a vertex must emit when it takes `demand` records/s: its output ratio over the window."""
    if demand is None:
        return None
    return demand * f.records_out_per_s / f.records_in_per_s if f.records_in_per_s > 0 else 0.0


def _below(utilization: float | None, settings: AutoscalerConfig) -> bool:
    return utilization is not None and utilization < settings.scale_down_below


def _recommend(v: LoadVertex, utilization: float | None, idle_throughout: bool, settings: AutoscalerConfig) -> int:
    """The parallelism the vertex's own load asks for, before the constraints."""
    if v.pinned or utilization is None:
        return v.parallelism
    needed = max(1, math.ceil(v.parallelism * utilization / settings.target_utilization - 1e-9))
    if utilization > settings.scale_up_above:
        return max(needed, v.parallelism + 1)
    if utilization < settings.scale_down_below and idle_throughout:
        return min(needed, v.parallelism)
    return v.parallelism


def _constrain(graph: LoadGraph, wanted: Mapping[str, int], *, settings: AutoscalerConfig,
               slots: int) -> dict[str, int]:
    """`wanted` within the clamps, equal in each group, different across an implicit rebalance."""
    ceiling = max(1, min(settings.max_parallelism or graph.max_parallelism, graph.max_parallelism, slots))
    floor = min(settings.min_parallelism, ceiling)
    current = {v.name: v.parallelism for v in graph.vertices}

    def clamp(name: str, p: int) -> int:
        now = current[name]
        if p > now:  # a scale-up never ends below where it starts, a scale-down never above
            return max(now, min(p, ceiling))
        if p < now:
            return min(now, max(p, floor))
        return p

    target = {name: clamp(name, p) for name, p in wanted.items()}
    groups: dict[str, list[LoadVertex]] = {}
    for v in graph.vertices:
        if v.group:
            groups.setdefault(v.group, []).append(v)
    for members in groups.values():
        if any(m.pinned for m in members) or len({m.parallelism for m in members}) > 1:
            shared = None  # a pinned member holds the group; unequal members are not ours to join
        else:
            shared = max(target[m.name] for m in members)
        for m in members:
            target[m.name] = m.parallelism if shared is None else shared
    pinned = {v.name for v in graph.vertices if v.pinned}
    for _ in range(4 * len(graph.apart) + 4):  # pull tied pairs apart; bounded
        tied = next(((a, b) for a, b in graph.apart if target[a] == target[b] and current[a] != current[b]), None)
        if tied is None:
            break
        moved = next((n for n in tied if target[n] != current[n] and n not in pinned), None)
        if moved is None:
            break
        step = 1 if target[moved] > current[moved] else -1
        further = target[moved] + step
        together = [m.name for m in groups.get(_group_of(graph, moved), [])] or [moved]
        keep = floor <= further <= ceiling
        for name in together:
            target[name] = further if keep else current[name]
    return _within_slots(graph, target, current, slots, groups)


def slots_used(graph: LoadGraph, parallelism: Mapping[str, int]) -> int:
    """The slots the job takes at `parallelism`: per slot sharing group, its largest (runtime/graph/plan.py)."""
    return sum(group_slots((v.slot_group, parallelism[v.name]) for v in graph.vertices).values())


def _within_slots(graph: LoadGraph, target: dict[str, int], current: Mapping[str, int], slots: int,
                  groups: Mapping[str, list[LoadVertex]]) -> dict[str, int]:
    """`target` with its scale-ups trimmed until the slot sharing groups fit `slots` (each group takes its
    largest parallelism, so two groups scaled up each within the slots may not fit together, and placement would
    refuse the rescale): the highest scaled-up target steps down first, with the vertices it must match; one
    that would tie an implicit rebalance goes back to where it was."""
    pinned = {v.name for v in graph.vertices if v.pinned}
    for _ in range(sum(target.values())):  # each step lowers a target: bounded
        if slots_used(graph, target) <= slots:
            break
        ups = [v for v in graph.vertices if target[v.name] > current[v.name] and v.name not in pinned]
        if not ups:
            break  # what is left over is the running shape's own (scale-downs only lower it)
        top = max(ups, key=lambda v: target[v.name])
        for m in groups.get(top.group, []) or [top]:
            target[m.name] = max(current[m.name], target[m.name] - 1)
    for a, b in graph.apart:
        if target[a] == target[b] and current[a] != current[b]:
            for name in (a, b):
                if target[name] > current[name]:
                    target[name] = current[name]
    return target


def _group_of(graph: LoadGraph, name: str) -> str:
    return next((v.group for v in graph.vertices if v.name == name), "")


def _view(v: LoadVertex, f: VertexFigures, load: Load, recommended: int) -> VertexLoad:
    rate, target, utilization = load
    return VertexLoad(v.name, v.parallelism, round(f.records_in_per_s, 3), round(f.busy_ratio, 4),
                      None if rate is None else round(rate, 3), None if target is None else round(target, 3),
                      None if utilization is None else round(utilization, 4), recommended)


def _reason(load: VertexLoad, wanted: int, settings: AutoscalerConfig) -> str:
    """One line: the rates that led to the decision, or the constraint that moved the vertex with another."""
    true_rate = "unbounded (idle)" if load.true_rate is None else f"{load.true_rate:,.1f} records/s"
    target = "unknown" if load.target_rate is None else f"{load.target_rate:,.1f} records/s"
    figures = (f"target rate {target}, true processing rate {true_rate} at busy {load.busy_ratio:.0%}, "
               f"{load.records_in_per_s:,.1f} records/s in")
    own = wanted != load.parallelism and (wanted > load.parallelism) == (load.recommended > load.parallelism)
    if not own or load.utilization is None:
        why = "kept with the vertices it must match (a forward edge, an operator name, an implicit rebalance)"
    elif load.recommended > load.parallelism:
        why = f"bottleneck: load {load.utilization:.0%} of its capacity > {settings.scale_up_above:.0%}"
    else:
        why = f"idle: load {load.utilization:.0%} of its capacity < {settings.scale_down_below:.0%} over the window"
    return f"{why} ({figures}); {load.parallelism} -> {load.recommended} for {settings.target_utilization:.0%}"
