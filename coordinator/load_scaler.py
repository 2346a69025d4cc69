"""The load-based autoscaler's shell: samples each job's vertex rates, asks the pure policy
(coordinator/load_policy.py) for decisions, and applies them through the job manager's one rescale path (a
checkpoint, then a restart at the new parallelism, as `sluice rescale` does), or only reports them (dry run).

The job manager ticks it every half second for every job whose config enables it (`JobConfig.autoscaler`).
A sample is the job's vertex figures as the REST graph shows them (coordinator/rest_views.py `job_graph`:
per-second rates from the heartbeats), so the autoscaler and the UI read the same numbers. A new attempt (a
deploy, a restart, a rescale) starts a new stabilisation period and empties the window; so does a decision,
applied or not, so a dry run reports a decision once per stabilisation and window, not every tick.

Each job's state (`LoadScaling`) lives on its record: the REST job document and the UI show its last
evaluation and its recent decisions, the metrics count the decisions. It is not persisted: a new leader
starts with an empty window and no history.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

from coordinator import load_policy as policy
from coordinator.autoscale import parallelism_classes, shape_of
from coordinator.rest_views import job_graph
from netstack.errors import RpcError
from runtime.graph.enums import JobState

if TYPE_CHECKING:
    from coordinator.jobs import JobRecord
    from runtime.api import Job
    from runtime.graph.plan import Plan

log = logging.getLogger("sluice.autoscaler")

DECISIONS_KEPT = 50  # per job, newest last
RESCALE_TIMEOUT_S = 300.0
DRY_RUN, APPLYING, APPLIED, REFUSED = "dry_run", "applying", "applied", "refused"
INTERRUPTED = "interrupted: the coordinator failed over while the rescale ran (the new leader finished or undid it)"


@dataclass(frozen=True, slots=True)
class DecisionRecord:
    """One decision as the REST API shows it: when, which vertex, from -> to, the rates behind it, and what
    became of it (DRY_RUN, APPLYING, APPLIED, REFUSED with the refusal)."""

    time: float  # Unix time
    vertex: str
    before: int
    after: int
    direction: str
    true_rate: float | None
    target_rate: float | None
    utilization: float | None
    busy_ratio: float
    records_in_per_s: float
    reason: str
    outcome: str
    error: str = ""

    def to_document(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["from"], doc["to"] = doc.pop("before"), doc.pop("after")
        return doc

    @classmethod
    def from_document(cls, doc: dict[str, Any]) -> DecisionRecord:
        """A decision from a job record; one a coordinator was applying when it failed over says so (the job's
        lifecycle, not the autoscaler, finished or undid that rescale)."""
        fields = dict(doc)
        fields["before"], fields["after"] = fields.pop("from"), fields.pop("to")
        if fields["outcome"] == APPLYING:
            fields["outcome"], fields["error"] = REFUSED, INTERRUPTED
        return cls(**fields)


@dataclass
class LoadScaling:
    """One job's autoscaler: its window of samples, its last evaluation and its recent decisions."""

    attempt: int = -1
    started_at: float = 0.0  # monotonic: the attempt was first seen running, or the last decision was taken
    samples: deque[policy.Sample] = field(default_factory=deque)
    evaluation: policy.Evaluation | None = None
    held: str = ""  # why no decision is taken now ("" when none)
    applying: bool = False
    decisions: deque[DecisionRecord] = field(default_factory=lambda: deque(maxlen=DECISIONS_KEPT))
    counts: dict[tuple[str, str], int] = field(default_factory=dict)  # (vertex, direction) -> decisions

    def status(self) -> str:
        if self.applying:
            return APPLYING
        if self.held:
            return "held"
        return self.evaluation.status if self.evaluation is not None else policy.STABILIZING

    def to_document(self) -> dict[str, Any]:
        """What the job record keeps, so a coordinator that takes over shows and counts the same decisions."""
        return {"decisions": [d.to_document() for d in self.decisions],
                "counts": [[vertex, direction, n] for (vertex, direction), n in sorted(self.counts.items())]}

    @classmethod
    def from_document(cls, doc: dict[str, Any]) -> LoadScaling:
        """Back from a job record: the decisions and counts; samples and the evaluation start afresh."""
        state = cls()
        state.decisions.extend(DecisionRecord.from_document(d) for d in doc["decisions"])
        state.counts = {(str(v), str(d)): int(n) for v, d, n in doc["counts"]}
        return state

    def describe(self, wall_offset: float) -> dict[str, Any]:
        """For the REST job document; `wall_offset` (wall clock minus monotonic clock) dates `ready_at`."""
        ev = self.evaluation
        return {"status": self.status(), "held": self.held,
                "ready_at": round(ev.ready_at + wall_offset, 3) if ev is not None else None,
                "vertices": [asdict(load) for load in ev.loads] if ev is not None else [],
                "decisions": [d.to_document() for d in self.decisions]}


@dataclass(frozen=True, slots=True)
class LoadScalingStatistics:
    """One job's autoscaler as the metrics see it."""

    job_id: str
    decisions: tuple[tuple[str, str, int], ...]  # (vertex, direction, count)
    recommended: tuple[tuple[str, int], ...]  # (vertex, parallelism) of the last evaluation


def load_graph(plan: Plan, built: Job) -> policy.LoadGraph:
    """What the policy needs of a running job: its vertices (task types) with their inputs, sources and their
    asked rates, pinned vertices and groups (coordinator/autoscale.py's constraints), and the operator names
    a rescale request sets."""
    shape = shape_of(built)
    classes = parallelism_classes(shape)
    names = vertex_names(plan)
    head_of = {n: v for v in plan.vertices for n in v.nodes}
    vertices = []
    for v in plan.vertices:
        head = built.nodes[v.nodes[0]]
        rate = getattr(head.payload, "records_per_second", None) if head.kind == "source" else None
        vertices.append(policy.LoadVertex(
            names[v.id], v.parallelism, tuple(names[e.up] for e in plan.edges if e.down == v.id),
            source=head.kind == "source", source_rate=float(rate) if isinstance(rate, int | float) else None,
            pinned=any(shape.nodes[n].pinned for n in v.nodes), group=f"c{classes[v.nodes[0]]}",
            operators=tuple(dict.fromkeys(built.nodes[n].name for n in v.nodes)), slot_group=v.slot_sharing_group))
    apart = []
    for e in shape.edges:  # implicit rebalances between vertices: they must stay different
        up, down = shape.nodes[e.up], shape.nodes[e.down]
        if e.partitioner is None and up.parallelism != down.parallelism and e.up in head_of and e.down in head_of:
            apart.append((names[head_of[e.up].id], names[head_of[e.down].id]))
    return policy.LoadGraph(tuple(vertices), tuple(apart), max_parallelism=built.max_parallelism)


def vertex_names(plan: Plan) -> dict[int, str]:
    """Vertex id -> its name, made unique with the id when two task types share one."""
    counts: dict[str, int] = {}
    for v in plan.vertices:
        counts[v.name] = counts.get(v.name, 0) + 1
    return {v.id: v.name if counts[v.name] == 1 else f"{v.name} #{v.id}" for v in plan.vertices}


def sample_of(job: JobRecord, now: float) -> policy.Sample:
    """The job's vertex figures now, as the REST graph derives them from the heartbeats."""
    assert job.plan is not None
    names = vertex_names(job.plan)
    figures = {names[v["id"]]: policy.VertexFigures(v["records_in_per_s"], v["records_out_per_s"], v["busy_ratio"],
                                                    v["backpressured_ratio"])
               for v in job_graph(job)["vertices"]}
    return policy.Sample(now, figures)


class LoadScaler:
    def __init__(self, *, graph_of: Callable[[JobRecord], policy.LoadGraph], slots: Callable[[], int],
                 rescale: Callable[[JobRecord, dict[str, int]], Awaitable[Any]],
                 spawn: Callable[[Awaitable[None], str], Any], clock: Callable[[], float] = time.monotonic,
                 wall_clock: Callable[[], float] = time.time) -> None:
        self.graph_of = graph_of  # raises RpcError for a job that no longer builds
        self.slots = slots
        self.rescale = rescale  # the job manager's rescale: (job, {operator name: parallelism})
        self.spawn = spawn
        self.clock = clock
        self.wall_clock = wall_clock

    def tick(self, job: JobRecord, *, hold: str = "") -> None:
        """Sample the job and decide if its window is complete; `hold` names why no decision may be taken
        now (the job manager's own scaling or a rescale under way)."""
        settings = job.config.autoscaler
        if not settings.enabled or job.terminal:
            return
        state = job.load_scaling
        if state is None:
            state = job.load_scaling = LoadScaling()
        now = self.clock()
        if job.state != JobState.RUNNING or job.plan is None:
            state.held = f"job is {job.state}"
            return
        if job.attempt != state.attempt:  # deployed, restarted or rescaled: a new stabilisation period
            state.attempt, state.started_at, state.evaluation = job.attempt, now, None
            state.samples.clear()
        if state.applying:
            return
        state.held = hold or ("its input is ending" if job.ended_tasks or job.finished_tasks else "")
        if state.held:
            return
        try:
            graph = self.graph_of(job)
        except RpcError as exc:
            state.held = str(exc)
            return
        if now >= state.started_at + settings.stabilization_s:
            state.samples.append(policy.measured(graph, sample_of(job, now)))
        start = policy.window_start(started_at=state.started_at, now=now, settings=settings)
        while state.samples and state.samples[0].at < start:
            state.samples.popleft()
        state.evaluation = policy.evaluate(graph, state.samples, settings=settings, started_at=state.started_at,
                                           now=now, slots=self.slots())
        if state.evaluation.decisions:
            self._decided(job, state, graph, state.evaluation.decisions, now)

    def _decided(self, job: JobRecord, state: LoadScaling, graph: policy.LoadGraph,
                 decisions: tuple[policy.Decision, ...], now: float) -> None:
        dry_run = job.config.autoscaler.dry_run
        wall = self.wall_clock()
        records = [DecisionRecord(wall, d.vertex, d.before, d.after, d.direction, d.load.true_rate,
                                  d.load.target_rate, d.load.utilization, d.load.busy_ratio,
                                  d.load.records_in_per_s, d.reason, DRY_RUN if dry_run else APPLYING)
                   for d in decisions]
        for d in decisions:
            state.counts[(d.vertex, d.direction)] = state.counts.get((d.vertex, d.direction), 0) + 1
            log.info("job %s: %s %s: %s", job.job_id, "would rescale" if dry_run else "rescaling", d.vertex,
                     d.reason)
        state.decisions.extend(records)
        state.started_at = now  # a decision starts a new stabilisation period, applied or not
        state.samples.clear()
        if dry_run:
            return
        operators = {v.name: v.operators for v in graph.vertices}
        requested = {op: d.after for d in decisions for op in operators[d.vertex]}
        state.applying = True
        self.spawn(self._apply(job, state, records, requested), f"{job.job_id} autoscale")

    async def _apply(self, job: JobRecord, state: LoadScaling, records: list[DecisionRecord],
                     requested: dict[str, int]) -> None:
        outcome, error = REFUSED, "the rescale did not complete (the coordinator stopped, or it failed: see its log)"
        try:
            await self.rescale(job, requested)
            outcome, error = APPLIED, ""
        except RpcError as exc:  # the job runs on unchanged; the next window may decide again
            error = str(exc)
            log.warning("job %s: the autoscaler's rescale to %s was refused: %s", job.job_id, requested, exc)
        finally:
            state.applying = False
            state.started_at = self.clock()
            for i, d in enumerate(state.decisions):
                if d in records:
                    state.decisions[i] = replace(d, outcome=outcome, error=error)

    @staticmethod
    def statistics(jobs: Iterable[JobRecord]) -> tuple[LoadScalingStatistics, ...]:
        out = []
        for job in jobs:
            state = job.load_scaling
            if state is None:
                continue
            ev = state.evaluation
            out.append(LoadScalingStatistics(
                job.job_id, tuple((v, d, n) for (v, d), n in sorted(state.counts.items())),
                tuple((load.vertex, load.recommended) for load in ev.loads) if ev is not None else ()))
        return tuple(out)
