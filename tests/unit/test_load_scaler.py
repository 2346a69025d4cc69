"""The load autoscaler's shell (coordinator/load_scaler.py) over a real built job and its plan: heartbeat
reports become samples through the REST graph's derivation, a decision goes to the rescale callable as
operator names, dry runs only report, a refusal is recorded, a new attempt restarts the wait; the REST job
document matches the OpenAPI schema and the metrics count the decisions."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable

import jsonschema
import pytest

from coordinator.jobs import JobRecord
from coordinator.load_policy import COLLECTING, EVALUATED, STABILIZING, LoadGraph
from coordinator.load_scaler import APPLIED, APPLYING, DRY_RUN, REFUSED, LoadScaler, load_graph
from coordinator.metrics import DurationHistogram, JobsStatistics
from coordinator.rest import UI_DIR
from coordinator.rest_views import job_detail, task_sample
from coordinator.scheduler import WorkerSlots, make_plan
from netstack.errors import RpcError
from runtime.api import DiscardSink, GeneratorSource, Job
from runtime.connectors.source import Source
from runtime.graph.enums import JobState
from runtime.graph.job_config import AutoscalerConfig, JobConfig
from tests.support.metrics import NO_WORKERS, collector, samples

SETTINGS = AutoscalerConfig(enabled=True, window_s=2.0, stabilization_s=1.0, max_parallelism=2)
STEP_S = 0.5


def built() -> Job:
    job = Job("loaded")
    (job.source(GeneratorSource(count=None, keys=10, seed=1, records_per_second=100.0), parallelism=1)
        .rebalance().map(lambda r: r, parallelism=1, name="work")
        .rebalance().sink(DiscardSink(), parallelism=1))
    return job


def record(settings: AutoscalerConfig = SETTINGS) -> JobRecord:
    config = JobConfig(autoscaler=settings)
    plan = make_plan(job_id="job-1", attempt=1, entry="m:build", name="loaded", sys_path="", config=config,
                     job=built(), workers=[WorkerSlots("w1", 4, "127.0.0.1", 1)], channel_base=1)
    return JobRecord("job-1", "m:build", "loaded", "", config, state=JobState.RUNNING, attempt=1, plan=plan)


class Harness:
    """A LoadScaler with a clock the test moves, the rescales it asked for, and the tasks it spawned."""

    def __init__(self, refuse: str = "") -> None:
        self.now = 0.0
        self.rescales: list[dict[str, int]] = []
        self.spawned: list[Awaitable[None]] = []
        self.refuse = refuse
        self.scaler = LoadScaler(graph_of=self.graph, slots=lambda: 4,
                                 rescale=self.rescale, spawn=lambda aw, name: self.spawned.append(aw),
                                 clock=lambda: self.now, wall_clock=lambda: 1_700_000_000.0 + self.now)

    @staticmethod
    def graph(job: JobRecord) -> LoadGraph:
        assert job.plan is not None
        return load_graph(job.plan, built())

    async def rescale(self, job: JobRecord, requested: dict[str, int]) -> None:
        self.rescales.append(requested)
        if self.refuse:
            raise RpcError(self.refuse, "RescaleCheckpointFailed")

    def run(self, job: JobRecord, seconds: float, *, work_busy: float, hold: str = "") -> None:
        """Heartbeats of every task every STEP_S for `seconds` (work takes 50 records/s at `work_busy`), each
        followed by a tick."""
        assert job.plan is not None
        for _ in range(round(seconds / STEP_S)):
            self.now += STEP_S
            for v in job.plan.vertices:
                for i in range(v.parallelism):
                    key = f"{job.job_id}/{v.id}:{i}"
                    busy = work_busy if v.name == "work" else 0.05
                    report = {"task": key, "records_in": 50 * self.now, "records_out": 50 * self.now,
                              "busy_s": busy * self.now, "idle_s": (1 - busy) * self.now, "backpressured_s": 0.0,
                              "measured_at": self.now}
                    job.task_stats[key] = task_sample(job.task_stats.get(key), report, self.now)
            self.scaler.tick(job, hold=hold)


def finish(spawned: Awaitable[None]) -> None:
    """Run a task the scaler spawned (the job manager's BackgroundTasks would) to its end."""
    async def run() -> None:
        await spawned

    asyncio.run(run())


def test_a_bottleneck_is_rescaled_through_the_rescale_callable_by_operator_name() -> None:
    h, job = Harness(), record()
    h.run(job, 1.0, work_busy=1.0)
    assert job.load_scaling is not None and job.load_scaling.status() == STABILIZING
    h.run(job, 1.5, work_busy=1.0)
    assert job.load_scaling.status() == COLLECTING and not job.load_scaling.decisions
    # first seen at t = 0.5; at 3.5 the stabilisation (1 s) and a whole window (2 s) are behind it
    h.run(job, 1.0, work_busy=1.0)
    decided = [(d.vertex, d.before, d.after, d.direction, d.outcome) for d in job.load_scaling.decisions]
    # work takes 50/s at full busy time and must take the 100/s the source is asked for: 3, clamped to 2
    assert decided == [("work", 1, 2, "up", APPLYING)]
    assert job.load_scaling.status() == APPLYING and len(h.spawned) == 1
    d = job.load_scaling.decisions[0]
    assert (d.true_rate, d.target_rate, d.utilization, d.time) == (50.0, 100.0, 2.0, 1_700_000_003.5)
    h.run(job, 5.0, work_busy=1.0)  # nothing more while the rescale is under way
    assert len(job.load_scaling.decisions) == 1
    finish(h.spawned.pop())
    assert h.rescales == [{"work": 2}]
    assert [d.outcome for d in job.load_scaling.decisions] == [APPLIED]

    doc = job_detail(job)["autoscaler"]
    openapi = json.loads((UI_DIR / "openapi.json").read_text())
    jsonschema.validate(doc, {"$ref": "#/components/schemas/Autoscaler", "components": openapi["components"]})
    assert doc["enabled"] and not doc["dry_run"] and doc["decisions"][0]["from"] == 1 and \
        doc["decisions"][0]["to"] == 2 and doc["decisions"][0]["outcome"] == "applied"

    got = samples(collector(NO_WORKERS, JobsStatistics((), DurationHistogram().statistics(),
                                                       DurationHistogram().statistics(), (),
                                                       LoadScaler.statistics([job]))))
    labels = (("direction", "up"), ("job_id", "job-1"), ("vertex", "work"))
    assert got[("sluice_autoscaler_decisions_total", labels)] == 1
    assert got[("sluice_autoscaler_recommended_parallelism", (("job_id", "job-1"), ("vertex", "work")))] == 2


def test_a_new_attempt_starts_a_new_stabilisation() -> None:
    h, job = Harness(), record()
    h.run(job, 2.5, work_busy=1.0)
    assert job.load_scaling is not None and job.load_scaling.status() == COLLECTING
    job.attempt += 1  # restarted: its samples are gone, the wait starts again
    h.run(job, 0.5, work_busy=1.0)
    assert job.load_scaling.status() == STABILIZING and not job.load_scaling.samples
    h.run(job, 3.0, work_busy=1.0)
    assert [d.after for d in job.load_scaling.decisions] == [2]
    finish(h.spawned.pop())
    assert h.rescales == [{"work": 2}]


def test_a_dry_run_reports_once_per_window_and_applies_nothing() -> None:
    h, job = Harness(), record(AutoscalerConfig(enabled=True, dry_run=True, window_s=2.0, stabilization_s=1.0,
                                                max_parallelism=2))
    h.run(job, 3.5, work_busy=1.0)
    h.run(job, 2.5, work_busy=1.0)  # the decision started a new stabilisation and window: not yet again
    assert job.load_scaling is not None
    assert [(d.vertex, d.after, d.outcome) for d in job.load_scaling.decisions] == [("work", 2, DRY_RUN)]
    h.run(job, 0.5, work_busy=1.0)
    assert [d.outcome for d in job.load_scaling.decisions] == [DRY_RUN, DRY_RUN]
    assert h.spawned == [] and h.rescales == []
    assert job.load_scaling.counts == {("work", "up"): 2}


def test_a_refused_rescale_is_recorded_and_the_job_runs_on() -> None:
    h, job = Harness(refuse="job job-1 not rescaled: checkpoint 4 did not complete"), record()
    h.run(job, 3.5, work_busy=1.0)
    finish(h.spawned.pop())
    assert job.load_scaling is not None
    [d] = job.load_scaling.decisions
    assert (d.outcome, d.error) == (REFUSED, "job job-1 not rescaled: checkpoint 4 did not complete")


def test_held_jobs_and_jobs_without_the_autoscaler_decide_nothing() -> None:
    h, job = Harness(), record()
    h.run(job, 5.0, work_busy=1.0, hold="a rescale is under way")
    assert job.load_scaling is not None and job.load_scaling.status() == "held"
    assert job.load_scaling.held == "a rescale is under way" and not job.load_scaling.decisions
    job.ended_tasks.add("0:0")  # a bounded source at its end: no decision on the dwindling rates
    h.run(job, 5.0, work_busy=1.0)
    assert job.load_scaling.held == "its input is ending" and not job.load_scaling.decisions
    off = record(AutoscalerConfig())
    h.run(off, 5.0, work_busy=1.0)
    assert off.load_scaling is None and job_detail(off)["autoscaler"]["status"] == "off"


@pytest.mark.parametrize("busy", [0.2, 0.32])
def test_a_vertex_at_its_least_or_within_the_band_holds(busy: float) -> None:
    # work's load: 100/s over 50/busy, 0.4 (idle, at parallelism 1 already) or 0.64 (within the band)
    h, job = Harness(), record()
    h.run(job, 6.0, work_busy=busy)
    assert job.load_scaling is not None and job.load_scaling.status() == EVALUATED
    assert not job.load_scaling.decisions
    evaluation = job.load_scaling.evaluation
    assert evaluation is not None
    assert [(load.vertex, load.recommended) for load in evaluation.loads] == [
        ("GeneratorSource", 1), ("work", 1), ("DiscardSink", 1)]


class Fixed(Source):
    """A source that cannot be restored at another parallelism (neither lanes nor subtask splits)."""


def test_the_load_graph_carries_the_constraints_of_the_job_graph() -> None:
    job = Job("shapes")
    fixed = job.source(Fixed(), parallelism=2, name="fixed")
    # fixed (2) -> count (3): no partitioner and different parallelisms, an implicit rebalance; count -> sink
    # chain (a forward edge) into one vertex
    fixed.map(lambda r: r, parallelism=3, name="count").sink(DiscardSink(), parallelism=3)
    plan = make_plan(job_id="job-2", attempt=1, entry="m:build", name="shapes", sys_path="", config=JobConfig(),
                     job=job, workers=[WorkerSlots("w1", 4, "127.0.0.1", 1)], channel_base=1)
    graph = load_graph(plan, job)
    assert [(v.name, v.parallelism, v.inputs, v.source, v.source_rate, v.pinned, v.operators)
            for v in graph.vertices] == [("fixed", 2, (), True, None, True, ("fixed",)),
                                         ("count -> DiscardSink", 3, ("fixed",), False, None, False,
                                          ("count", "DiscardSink"))]
    assert graph.apart == (("fixed", "count -> DiscardSink"),) and graph.max_parallelism == 128
    loaded = record().plan
    assert loaded is not None
    asked = load_graph(loaded, built())
    assert [(v.name, v.source_rate) for v in asked.vertices] == [("GeneratorSource", 100.0), ("work", None),
                                                                  ("DiscardSink", None)]
    assert len({v.group for v in asked.vertices}) == 3 and asked.apart == ()
