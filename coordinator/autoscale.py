"""Scale-down and scale-up policy: which parallelism a job runs at when the cluster has fewer slots than it
asked for, and when to go back up. Pure: the job manager feeds it the job graph, slot counts and times.

Slots are counted as Sluice places tasks (runtime/graph/plan.py, `place_subtasks`): subtask i of every task
type of a slot sharing group shares the group's slot i, so a job needs, per group, as many slots as the
group's largest parallelism (one group unless the job names others). To fit N slots, every operator is scaled
in proportion to N / (the slots it asks), rounded down, at least 1, never above its ask,
under the constraints that keep the restored job the same graph (the restore checks it):

- operators joined by a forward edge (explicit, or implicit: no partitioner and equal parallelism, which is
  also what chains them into one task) keep equal parallelism;
- operators joined by an implicit rebalance (no partitioner, different parallelism) stay different, else the
  edge would turn into a chained forward one and the task types would change;
- operators that cannot be restored at another parallelism stay at their ask: sources that do not split their
  input (neither `rescalable` nor `subtask_splits`) and readers of a broadcast input and another one (their
  list state cannot be both replicated and split). If that does not fit, nothing does.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from runtime.api import Job
from runtime.api.stream import DEFAULT_SLOT_SHARING_GROUP
from runtime.graph.job_config import NEVER
from runtime.graph.job_config import parse_scale_down_after as parse_scale_down_after  # where it was
from runtime.graph.plan import group_slots

DEFAULT_SCALE_DOWN_AFTER_S = 10.0
DEFAULT_SCALE_UP_AFTER_S = 5.0


@dataclass(frozen=True)
class AutoscaleSettings:
    """The coordinator's defaults; a job's config may set its own `scale_down_after_s` (0: never)."""

    scale_down_after_s: float = DEFAULT_SCALE_DOWN_AFTER_S  # a restart waits this long for slots, then shrinks
    scale_up_after_s: float = DEFAULT_SCALE_UP_AFTER_S  # a worker counts for scaling up once registered this long

    def __post_init__(self) -> None:
        if not self.scale_down_after_s >= 0 or not self.scale_up_after_s >= 0:
            raise ValueError("scale-down and scale-up delays must not be negative")

    def scale_down_after(self, job_value: float | None) -> float | None:
        """Seconds a restart waits for the asked slots before it scales down (the job's own `scale_down_after_s`
        if it set one, else the coordinator's); None: never scale down."""
        seconds = self.scale_down_after_s if job_value is None else job_value
        return None if seconds <= NEVER else seconds


@dataclass(frozen=True)
class ShapeNode:
    name: str
    parallelism: int  # as asked
    pinned: bool = False  # cannot be restored at another parallelism
    slot_sharing_group: str = DEFAULT_SLOT_SHARING_GROUP


@dataclass(frozen=True)
class ShapeEdge:
    up: int  # index into the nodes
    down: int
    partitioner: str | None  # None: implicit (forward when the parallelisms are equal, else rebalance)


@dataclass(frozen=True)
class Shape:
    """What the shrink needs of a job graph: its operators at their asked parallelism and its edges."""

    nodes: tuple[ShapeNode, ...]
    edges: tuple[ShapeEdge, ...]

    @property
    def slots_needed(self) -> int:
        return self.slots_used([n.parallelism for n in self.nodes])

    def slots_used(self, parallelism: list[int]) -> int:
        """The slots the nodes take at `parallelism` (one per node, in order): per slot sharing group, its
        largest parallelism."""
        members = ((n.slot_sharing_group, p) for n, p in zip(self.nodes, parallelism, strict=True))
        return sum(group_slots(members).values())


def shape_of(job: Job) -> Shape:
    """The shape of a built job (its parallelism overrides applied)."""
    def pinned(n: Any) -> bool:  # what runtime/graph/rescalability.py would refuse to restore elsewhere
        if n.kind == "source":
            return not (getattr(n.payload, "rescalable", False) or getattr(n.payload, "subtask_splits", False))
        return len(n.inputs) > 1 and any(inp.partitioner == "broadcast" for inp in n.inputs)

    nodes = [ShapeNode(n.name, n.parallelism, pinned(n), n.slot_sharing_group) for n in job.nodes]
    edges = [ShapeEdge(inp.node, n.id, inp.partitioner) for n in job.nodes for inp in n.inputs]
    return Shape(tuple(nodes), tuple(edges))


def parallelism_classes(shape: Shape) -> list[int]:
    """Union-find over the operators that must keep equal parallelism: forward pairs, and operators of one
    name (parallelism overrides go by name). Returns each operator's class representative."""
    parent = list(range(len(shape.nodes)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    def union(a: int, b: int) -> None:
        parent[find(a)] = find(b)

    for e in shape.edges:
        up, down = shape.nodes[e.up], shape.nodes[e.down]
        if e.partitioner == "forward" or (e.partitioner is None and up.parallelism == down.parallelism):
            union(e.up, e.down)
    by_name: dict[str, int] = {}
    for i, n in enumerate(shape.nodes):
        if n.name in by_name:
            union(i, by_name[n.name])
        by_name.setdefault(n.name, i)
    return [find(i) for i in range(len(shape.nodes))]


def fit_parallelism(shape: Shape, slots: int) -> dict[str, int] | None:
    """The parallelism of every operator (by name) that fits `slots`, as close to the ask as the proportional
    rule gives; None if no shrink fits (fewer than 1 slot, pinned operators above `slots`, or constraints that
    cannot all hold). With enough slots, the ask itself."""
    if slots < 1 or not shape.nodes:
        return None
    rep = parallelism_classes(shape)
    asked: dict[int, int] = {}
    pinned: set[int] = set()
    for i, n in enumerate(shape.nodes):
        if asked.setdefault(rep[i], n.parallelism) != n.parallelism:
            return None  # one name, different parallelisms: no override by name can keep them apart
        if n.pinned:
            pinned.add(rep[i])
    needed = shape.slots_needed
    if needed <= slots:
        target = dict(asked)
    else:
        if any(asked[c] > slots for c in pinned):
            return None
        # every slot sharing group shrinks by the same factor: their largest parallelisms then add up to slots
        target = {c: p if c in pinned else max(1, p * slots // needed) for c, p in asked.items()}
        # implicit rebalance edges must not collapse into forward ones: pull tied pairs apart, the bigger side
        # up while it has room, else the smaller side down; give up after a bounded number of steps
        apart = [(rep[e.up], rep[e.down]) for e in shape.edges
                 if e.partitioner is None and shape.nodes[e.up].parallelism != shape.nodes[e.down].parallelism]
        for _ in range(4 * len(asked) + 4):
            tied = next(((a, b) for a, b in apart if target[a] == target[b]), None)
            if tied is None:
                break
            small, big = sorted(tied, key=lambda c: asked[c])
            if big not in pinned and target[big] < min(asked[big], slots):
                target[big] += 1
            elif small not in pinned and target[small] > 1:
                target[small] -= 1
            else:
                return None
    result = {n.name: target[rep[i]] for i, n in enumerate(shape.nodes)}
    return result if fits(shape, result, slots) else None


def fits(shape: Shape, parallelism: Mapping[str, int], slots: int) -> bool:
    """Every constraint of the module docstring holds for `parallelism` (by operator name) in `slots`."""
    p = [parallelism[n.name] for n in shape.nodes]
    if any(not 1 <= q <= n.parallelism for q, n in zip(p, shape.nodes, strict=True)) or shape.slots_used(p) > slots:
        return False
    if any(n.pinned and q != n.parallelism for q, n in zip(p, shape.nodes, strict=True)):
        return False
    for e in shape.edges:
        up, down = shape.nodes[e.up], shape.nodes[e.down]
        forward = e.partitioner == "forward" or (e.partitioner is None and up.parallelism == down.parallelism)
        if forward and p[e.up] != p[e.down]:
            return False
        if e.partitioner is None and up.parallelism != down.parallelism and p[e.up] == p[e.down]:
            return False
    return True


def should_scale_up(current: Mapping[str, int], target: Mapping[str, int] | None) -> bool:
    """Scale up when the settled slots allow more than the job runs at now (some operator higher, none lower)."""
    if target is None or set(target) != set(current):
        return False
    return all(target[k] >= current[k] for k in current) and any(target[k] > current[k] for k in current)


def direction(before: Mapping[str, int] | None, after: Mapping[str, int]) -> str | None:
    """'down' or 'up' for a change of the total parallelism (vertex name -> parallelism), else None."""
    if before is None or set(before) != set(after):
        return None
    b, a = sum(before.values()), sum(after.values())
    return "down" if a < b else "up" if a > b else None


@dataclass
class Scaling:
    """One job's scaling: what it asked for (task type -> parallelism), why it runs below, and the counts."""

    asked: dict[str, int] = field(default_factory=dict)  # task type (vertex) name -> asked parallelism
    reason: str = ""  # empty while the job runs at its ask
    since: float | None = None  # wall time the job went below its ask
    scale_downs: int = 0
    scale_ups: int = 0
    next_scale_up_at: float = 0.0  # monotonic: no scale-up try before (after a refused one)

    def scaled_down(self, *, free: int, needed: int, now: float) -> None:
        if self.since is None:
            self.since = now
        self.reason = (f"scaled down: {free} slot{'s' if free != 1 else ''} free of {needed} needed since "
                       f"{format_time(self.since)}")

    def at_ask(self) -> None:
        self.reason, self.since = "", None

    def describe(self, current: Mapping[str, int]) -> dict[str, Any]:
        return {"reason": self.reason, "since": self.since, "scale_downs": self.scale_downs,
                "scale_ups": self.scale_ups, "asked": dict(self.asked), "current": dict(current)}


def format_time(wall: float) -> str:
    return datetime.datetime.fromtimestamp(wall, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class ScalingStatistics:
    job_id: str
    scale_downs: int
    scale_ups: int
    scaled_down: bool
