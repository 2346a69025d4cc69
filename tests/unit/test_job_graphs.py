"""The coordinator builds a job's graph once per parallelism (coordinator/job_graphs.py): planning, the extras
check, the restore check and the autoscaler all ask for it, the builder runs once; a job that ends, or whose
submission is refused, keeps none."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from coordinator import lifecycle as lc
from coordinator.job_graphs import KEEP, JobGraphs
from coordinator.job_manager import JobManager
from coordinator.jobs import JobRecord
from coordinator.registry import WorkerRegistry
from coordinator.server import Coordinator, CoordinatorConfig
from coordinator.storage import LocalCheckpointStorage
from netstack.errors import RpcError
from runtime.graph.enums import JobState
from runtime.graph.job_config import JobConfig
from runtime.graph.plan import JobLoadError

ENTRY = "runtime.examples.wordcount:build"


def graph(graphs: JobGraphs, parallelism: dict[str, int] | None = None, job_id: str = "job-1", entry: str = ENTRY):
    return graphs.get(job_id, entry=entry, name="wc", sys_path="", parallelism=parallelism)


def test_a_graph_is_built_once_per_job_and_parallelism() -> None:
    graphs = JobGraphs()
    first = graph(graphs)
    assert [graph(graphs) for _ in range(4)] == [first] * 4 and graphs.builds == 1
    scaled = graph(graphs, {"*": 3})
    assert scaled is not first and {n.parallelism for n in scaled.nodes} == {3} and graphs.builds == 2
    assert graph(graphs, {"*": 3}) is scaled and graph(graphs) is first and graphs.builds == 2
    assert graph(graphs, job_id="job-2") is not first and graphs.builds == 3  # another job builds its own


def test_a_job_that_does_not_build_is_raised_every_time_and_kept_nowhere() -> None:
    graphs = JobGraphs()
    for _ in range(2):
        with pytest.raises(JobLoadError, match="no function 'nothing'"):
            graph(graphs, entry="runtime.examples.wordcount:nothing")
    assert graphs.builds == 0


def test_a_job_keeps_its_latest_graphs_and_forget_drops_them() -> None:
    graphs = JobGraphs()
    for n in range(1, KEEP + 2):
        graph(graphs, {"*": n})
    assert graphs.builds == KEEP + 1
    graph(graphs, {"*": KEEP + 1})
    assert graphs.builds == KEEP + 1  # the newest is kept
    graph(graphs, {"*": 1})
    assert graphs.builds == KEEP + 2  # the oldest was dropped
    graphs.forget("job-1")
    graph(graphs, {"*": 1})
    assert graphs.builds == KEEP + 3


def test_a_failed_build_leaves_no_entry_for_its_job() -> None:
    graphs = JobGraphs()
    with pytest.raises(JobLoadError):
        graph(graphs, entry="runtime.examples.wordcount:nothing")
    assert graphs.jobs() == []


async def test_a_job_that_ends_drops_its_graphs(tmp_path: Path) -> None:
    manager = JobManager(workers=WorkerRegistry(), storage=LocalCheckpointStorage(str(tmp_path)))
    job = JobRecord("job-1", ENTRY, "wc", "", JobConfig())
    other = JobRecord("job-2", ENTRY, "wc", "", JobConfig())
    manager.graph(job)
    manager.graph(other)
    manager.add(job)
    assert manager.graphs.jobs() == ["job-1", "job-2"]
    cancelling = manager.handle(job, lc.CancelAsked("by the test"))  # before the deploy got anywhere
    assert job.state == JobState.CANCELLED and manager.graphs.jobs() == ["job-2"]
    if cancelling is not None:
        await asyncio.wait_for(cancelling, 10.0)
    assert manager.graphs.jobs() == ["job-2"] and manager.graphs.builds == 2


async def test_a_refused_submission_keeps_no_graph(tmp_path: Path) -> None:
    coordinator = Coordinator(CoordinatorConfig(token="t", metrics_port=None, state_dir=str(tmp_path)))
    coordinator.leading = lambda: True  # type: ignore[method-assign]  # no lease needed to refuse
    with pytest.raises(RpcError, match="no workers are registered"):  # refused after the graph was built
        await coordinator.on_rpc(None, "submit", {"entry": ENTRY})  # type: ignore[arg-type]
    assert coordinator.manager.graphs.builds == 1 and coordinator.manager.graphs.jobs() == []
