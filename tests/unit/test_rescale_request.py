"""What a `sluice rescale` request makes of the job's parallelism overrides (coordinator/scheduler.py)."""

from __future__ import annotations

from coordinator.scheduler import describe_parallelism, merge_parallelism
from runtime.graph.job_config import JobConfig
from runtime.graph.plan import Plan, Vertex


def test_every_operator_replaces_the_old_overrides() -> None:
    assert merge_parallelism({"*": 2, "Count": 3}, {"*": 1}) == {"*": 1}


def test_per_operator_requests_update_the_old_ones() -> None:
    assert merge_parallelism({"*": 2, "Count": 3}, {"FileSink": 4}) == {"*": 2, "Count": 3, "FileSink": 4}
    assert merge_parallelism({}, {"Count": 3}) == {"Count": 3}


def test_named_operators_given_with_every_operator_win_over_it() -> None:
    assert merge_parallelism({"Count": 5}, {"*": 2, "Count": 3}) == {"*": 2, "Count": 3}


def test_the_inputs_are_not_changed() -> None:
    current, requested = {"Count": 3}, {"FileSink": 1}
    merge_parallelism(current, requested)
    assert current == {"Count": 3} and requested == {"FileSink": 1}


def test_describe_names_each_task_type_with_its_parallelism() -> None:
    plan = Plan(job_id="j", attempt=0, entry="m:f", name="n", sys_path="", channel_base=0,
                vertices=[Vertex(0, [0], 2, "GeneratorSource"), Vertex(1, [1, 2], 3, "Count -> FileSink")],
                edges=[], placement={}, workers={}, config=JobConfig())
    assert describe_parallelism(plan) == "GeneratorSource=2, Count -> FileSink=3"
    assert describe_parallelism(None) == "-"
