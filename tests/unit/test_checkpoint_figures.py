"""The checkpoint figures, declared once: the task record, the checkpoint's aggregate, the REST schema and the
Prometheus gauges all follow the declaration."""

from __future__ import annotations

import json

from coordinator.rest import UI_DIR
from runtime.graph.checkpoint_figures import (
    AGGREGATED,
    FIGURES,
    CheckpointFigures,
    TaskCheckpointFigures,
    declaration,
)

JSON_TYPE = {"s": "number", "bytes": "integer", "records": "integer", "bool": "boolean"}


def test_the_checkpoint_aggregates_each_figure_as_declared() -> None:
    tasks = [TaskCheckpointFigures(state_bytes=10, inflight_bytes=1, alignment_s=0.5, start_delay_s=0.1),
             TaskCheckpointFigures(state_bytes=5, inflight_bytes=2, alignment_s=0.25, start_delay_s=0.3)]
    assert CheckpointFigures.of(tasks) == CheckpointFigures(start_delay_s=0.3, alignment_s=0.5, state_bytes=15,
                                                            inflight_bytes=3)
    assert CheckpointFigures.of([]) == CheckpointFigures()


def test_an_ack_document_round_trips_and_an_older_one_still_reads() -> None:
    figures = TaskCheckpointFigures(sync_s=0.01, state_bytes=7, unaligned=True, backend_uploaded_bytes=3)
    wire = figures.to_wire()
    assert "async_captured_records" not in wire and wire["backend_uploaded_bytes"] == 3  # optional: if measured
    assert TaskCheckpointFigures.from_wire(wire) == figures
    # a worker of an older version: fewer figures, a float where an int belongs, a figure since dropped
    old = TaskCheckpointFigures.from_wire({"state_bytes": 7.0, "alignment_s": 1, "retired_figure": 9})
    assert old == TaskCheckpointFigures(state_bytes=7, alignment_s=1.0)
    assert type(old.state_bytes) is int and type(old.alignment_s) is float


def test_the_openapi_schema_lists_exactly_the_declared_figures_with_their_types() -> None:
    schemas = json.loads((UI_DIR / "openapi.json").read_text())["components"]["schemas"]
    task = schemas["TaskCheckpointFigures"]
    assert list(task["properties"]) == ["task", *(f.name for f in FIGURES)]
    assert {name: p["type"] for name, p in task["properties"].items() if name != "task"} == {
        f.name: JSON_TYPE[f.unit] for f in FIGURES}
    assert sorted(task["required"]) == sorted(["task", *(f.name for f in FIGURES if not f.optional)])
    checkpoint = schemas["Checkpoint"]["properties"]
    assert {f.name for f in AGGREGATED} <= set(checkpoint)
    assert schemas["CheckpointFigure"]["properties"]["unit"]["enum"] == list(JSON_TYPE)
    assert [d["name"] for d in declaration()] == [f.name for f in FIGURES]


def test_every_aggregated_figure_with_a_metric_is_a_distinct_gauge() -> None:
    metrics = [f.metric for f in AGGREGATED if f.metric]
    assert len(set(metrics)) == len(metrics) == 4 and all(f.help for f in AGGREGATED if f.metric)
