"""The coordinator builds a job's graph once per parallelism (coordinator/job_graphs.py): planning, the extras
check, the restore check and the autoscaler all ask for it, the builder runs once."""

from __future__ import annotations

import pytest

from coordinator.job_graphs import KEEP, JobGraphs
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
