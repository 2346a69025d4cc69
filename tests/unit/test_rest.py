"""The REST API's pure parts: request heads, routes, the token check, rates from heartbeats, the views,
and the OpenAPI document against the routes the coordinator serves."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from coordinator.jobs import JobRecord
from coordinator.registry import WorkerRegistry
from coordinator.rest import ROUTES, STATIC, UI_DIR, RestApi, authorized, match, path_of, whole_number
from coordinator.rest_views import (
    RATE_WINDOW_S,
    backpressure_level,
    checkpoint_view,
    config_view,
    exceptions_view,
    job_brief,
    job_graph,
    process_sample,
    task_sample,
    tasks_on,
)
from netstack.errors import RpcError
from netstack.http import BadRequest, HttpRequest, parse_head
from runtime.graph.checkpoint_figures import TaskCheckpointFigures
from runtime.graph.enums import JobState
from runtime.graph.job_config import DEFAULT_BUFFER_BYTES, JobConfig

ROOT = Path(__file__).resolve().parents[2]


def test_parse_head_reads_method_path_query_and_keeps_header_values() -> None:
    req, length, keep = parse_head(b"POST /api/v1/jobs/job-1/cancel?x=1&y= HTTP/1.1\r\n"
                                   b"Authorization: Bearer AbC\r\nContent-Length: 2\r\n\r\n", 100)
    assert (req.method, req.path, req.query, length, keep) == ("POST", "/api/v1/jobs/job-1/cancel",
                                                               {"x": "1", "y": ""}, 2, True)
    assert req.headers["authorization"] == "Bearer AbC"


@pytest.mark.parametrize(("head", "status"), [
    (b"GET /\r\n\r\n", 400),
    (b"GET / HTTP/1.1\r\nContent-Length: 5\r\n\r\n", 400),  # no bodies at all on this listener
    (b"GET / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", 400),
    (b"GET / HTTP/1.1\r\nContent-Length: x\r\n\r\n", 400),
])
def test_parse_head_refuses_what_it_cannot_serve(head: bytes, status: int) -> None:
    with pytest.raises(BadRequest) as err:
        parse_head(head, 0)
    assert err.value.status == status


def test_parse_head_refuses_a_body_over_the_limit_with_413() -> None:
    with pytest.raises(BadRequest) as err:
        parse_head(b"POST /x HTTP/1.1\r\nContent-Length: 101\r\n\r\n", 100)
    assert err.value.status == 413


def test_http_1_0_closes_unless_asked_to_keep_alive() -> None:
    assert parse_head(b"GET / HTTP/1.0\r\n\r\n", 0)[2] is False
    assert parse_head(b"GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n", 0)[2] is True
    assert parse_head(b"GET / HTTP/1.1\r\nConnection: close\r\n\r\n", 0)[2] is False


def test_routes_match_with_their_parameters_and_tell_a_wrong_method() -> None:
    route, params, _ = match("GET", "/api/v1/jobs/job-ab12/graph")
    assert route is not None and route.name == "graph" and params == {"job_id": "job-ab12"}
    route, _, _ = match("POST", "/api/v1/jobs/job-ab12/checkpoints")
    assert route is not None and route.name == "checkpoint" and route.mutating
    assert match("DELETE", "/api/v1/jobs/job-ab12") == (None, {}, True)
    assert match("GET", "/api/v1/jobs/a/b/c") == (None, {}, False)
    assert match("GET", "/api/v1/jobs/../etc") == (None, {}, False)


@given(st.text(max_size=40))
def test_only_the_exact_bearer_token_is_authorized(given_token: str) -> None:
    token = "s3cret-token"
    assert authorized({"authorization": f"Bearer {given_token}"}, token) == (given_token.strip() == token)
    assert authorized({"authorization": f"bearer {token}"}, token)
    assert not authorized({"authorization": f"Basic {token}"}, token)
    assert not authorized({}, token)


def test_task_sample_turns_reports_into_rates_over_the_window() -> None:
    def report(at: float, rin: int, bp: float, busy: float) -> dict[str, float]:
        return {"records_in": rin, "records_out": rin // 2, "backpressured_s": bp, "busy_s": busy,
                "measured_at": at}

    first = task_sample(None, report(10.0, 100, 1.0, 0.5), 1000.0)
    assert first["records_in_per_s"] == 0.0 and first["backpressured_ratio"] == 0.0 and not first["rated"]
    # timed by the worker's clock: the heartbeat arriving 3 s late changes nothing
    second = task_sample(first, report(12.0, 300, 2.5, 0.75), 1005.0)
    assert (second["records_in_per_s"], second["records_out_per_s"]) == (100.0, 50.0)
    assert (second["backpressured_ratio"], second["busy_ratio"]) == (0.75, 0.125)
    # a burst-free second: the rate is the window's average, not reset or halved
    third = task_sample(second, report(13.0, 300, 3.5, 0.75), 1006.0)
    assert third["records_in_per_s"] == round(200 / 3, 4)
    assert third["backpressured_ratio"] == round(2.5 / 3, 4)
    # bursts every 4 s (a throttled source) read as their average once the window spans them
    sample = third
    for k in range(1, 30):
        sample = task_sample(sample, report(13.0 + k, 300 + 4000 * (k // 4), 3.5 + k, 0.75), 1006.0 + k)
    assert abs(sample["records_in_per_s"] - 1000.0) <= 1000.0 * 4 / RATE_WINDOW_S
    assert sample["backpressured_ratio"] == 1.0
    assert sample["window"][-1][0] - sample["window"][1][0] < RATE_WINDOW_S <= sample["window"][-1][0] - \
        sample["window"][0][0]
    # a new attempt starts its counters again: no negative rates, the window starts afresh
    fourth = task_sample(sample, report(50.0, 5, 0.0, 0.0), 1050.0)
    assert fourth["records_in_per_s"] == 0.0 and fourth["backpressured_ratio"] == 0.0 and not fourth["rated"]


@given(st.floats(min_value=0.0, max_value=1.0))
def test_backpressure_levels_follow_the_thresholds(ratio: float) -> None:
    expected = "HIGH" if ratio >= 0.5 else "LOW" if ratio >= 0.1 else "OK"
    assert backpressure_level(ratio) == expected


def test_views_of_a_job_without_a_plan_are_empty_not_errors() -> None:
    job = JobRecord("job-1", "mod:build", "mod:build", "", {})
    assert job_graph(job) == {"job_id": "job-1", "vertices": [], "edges": []}
    brief = job_brief(job)
    assert brief["state"] == JobState.CREATED and brief["last_checkpoint_id"] is None


def test_checkpoint_view_lists_per_task_figures_sorted() -> None:
    summary = {"checkpoint_id": 3, "status": "COMPLETED", "mode": "unaligned", "savepoint": False,
               "started_at": 1.0, "duration_s": 0.5, "state_bytes": 10, "inflight_bytes": 20, "alignment_s": 0.0,
               "start_delay_s": 0.1}
    view = checkpoint_view(summary, {
        "2:0": TaskCheckpointFigures.from_wire({"sync_s": 0.01, "async_s": 0.2, "inflight_bytes": 20}),
        "1:0": TaskCheckpointFigures(start_delay_s=0.1, backend_uploaded_bytes=5)})
    assert [t["task"] for t in view["tasks"]] == ["1:0", "2:0"]
    assert view["tasks"][1] == {"task": "2:0", "start_delay_s": 0.0, "alignment_s": 0.0, "sync_s": 0.01,
                                "async_s": 0.2, "state_bytes": 0, "inflight_bytes": 20, "unaligned": False,
                                "first_barrier_s": 0.0, "last_barrier_s": 0.0}
    assert view["tasks"][0]["backend_uploaded_bytes"] == 5  # an optional figure, where measured
    assert (view["state_bytes"], view["inflight_bytes"], view["start_delay_s"]) == (10, 20, 0.1)
    assert view["failure_reason"] == ""


def _openapi() -> dict[str, Any]:
    return json.loads((UI_DIR / "openapi.json").read_text())


def test_the_openapi_document_describes_exactly_the_routes_served() -> None:
    doc = _openapi()
    documented = {(method.upper(), path) for path, ops in doc["paths"].items() for method in ops}
    served = {(r.method, path_of(r)) for r in ROUTES}
    assert documented == served
    for route in ROUTES:  # every mutating call, and only those, needs the token
        op = doc["paths"][path_of(route)][route.method.lower()]
        assert ("security" in op) == route.mutating
        assert ("401" in op["responses"]) == route.mutating


def test_every_schema_reference_in_the_openapi_document_resolves() -> None:
    doc = _openapi()
    text = json.dumps(doc)
    refs = {part.split('"')[0] for part in text.split('"$ref": "#/components/schemas/')[1:]}
    assert refs and refs <= set(doc["components"]["schemas"])


def test_static_files_exist() -> None:
    for name, _ in STATIC.values():
        assert (UI_DIR / name).is_file(), name


def _api(calls: list[tuple[str, dict[str, Any]]], token: str = "tok") -> RestApi:
    async def call(method: str, args: dict[str, Any]) -> Any:
        calls.append((method, args))
        if args["job_id"] == "missing":
            raise RpcError("no job missing", "UnknownJob")
        return {"state": "CANCELLED"}

    return RestApi(jobs=dict, workers=WorkerRegistry(), token=token, call=call)


def _request(method: str, path: str, headers: dict[str, str] | None = None, body: bytes = b"") -> HttpRequest:
    return HttpRequest(method, path, {}, headers or {}, body)


def test_mutating_calls_need_the_token_and_reach_the_rpc_handler_with_its_arguments() -> None:
    calls: list[tuple[str, dict[str, Any]]] = []
    api = _api(calls)
    denied = asyncio.run(api(_request("POST", "/api/v1/jobs/j1/cancel")))
    assert denied.status == 401 and calls == []
    wrong = asyncio.run(api(_request("POST", "/api/v1/jobs/j1/cancel", {"authorization": "Bearer nope"})))
    assert wrong.status == 401 and calls == []
    auth = {"authorization": "Bearer tok"}
    ok = asyncio.run(api(_request("POST", "/api/v1/jobs/j1/savepoints", auth, b'{"directory": "/sp"}')))
    assert ok.status == 200 and calls == [("checkpoint", {"job_id": "j1", "savepoint": True, "directory": "/sp"})]
    missing = asyncio.run(api(_request("POST", "/api/v1/jobs/missing/cancel", auth)))
    assert missing.status == 404 and json.loads(missing.body) == {"error": "no job missing", "type": "UnknownJob"}
    bad = asyncio.run(api(_request("POST", "/api/v1/jobs/j1/rescale", auth, b"[1]")))
    assert bad.status == 400


def test_reads_are_open_and_unknown_paths_are_404() -> None:
    api = _api([])
    jobs = asyncio.run(api(_request("GET", "/api/v1/jobs")))
    assert jobs.status == 200 and json.loads(jobs.body) == {"jobs": []}
    assert asyncio.run(api(_request("GET", "/api/v1/jobs/nope"))).status == 404
    assert asyncio.run(api(_request("GET", "/nope"))).status == 404
    assert asyncio.run(api(_request("PUT", "/api/v1/jobs"))).status == 405
    bad_limit = HttpRequest("GET", "/api/v1/jobs", {"limit": "0"}, {})
    assert asyncio.run(api(bad_limit)).status == 400
    page = asyncio.run(api(_request("GET", "/")))
    assert page.status == 200 and b"<title>Sluice</title>" in page.body


def _planned_job() -> JobRecord:
    from runtime.graph.job_config import JobConfig
    from runtime.graph.plan import Plan
    job = JobRecord("job-1", "mod:build", "wm", "", JobConfig(parallelism={"*": 2}))
    job.plan = Plan.from_dict({
        "job_id": "job-1", "attempt": 0, "entry": "mod:build", "name": "wm", "config": {}, "sys_path": "",
        "channel_base": 1,
        "vertices": [{"id": 1, "name": "Src", "parallelism": 2, "nodes": []},
                     {"id": 2, "name": "Sink", "parallelism": 1, "nodes": []}],
        "edges": [{"id": 1, "up": 1, "down": 2, "partitioner": "rebalance", "input_index": 0, "channel_base": 0}],
        "placement": {"1:0": "w-1", "1:1": "w-2", "2:0": "w-1"}, "workers": {}})
    return job


def test_graph_shows_watermarks_their_lag_and_record_totals() -> None:
    from runtime.api.time import MAX_WATERMARK, MIN_WATERMARK
    job = _planned_job()
    job.task_stats = {"job-1/1:0": {"records_out": 10, "current_watermark": 995_000, "sampled_at": 100.0},
                      "job-1/1:1": {"records_out": 5, "current_watermark": 990_000, "sampled_at": 100.0},
                      "job-1/2:0": {"records_in": 15, "current_watermark": MIN_WATERMARK, "sampled_at": 100.0}}
    g = job_graph(job, wall_offset=900.0)  # sampled at Unix time 1000 s
    src, sink = g["vertices"]
    assert [(s["watermark"], s["watermark_lag_ms"]) for s in src["subtasks"]] == [(995_000, 5000), (990_000, 10000)]
    assert (src["watermark"], src["watermark_status"], src["watermark_lag_ms"]) == (990_000, "ACTIVE", 10000)
    assert (src["records_out"], sink["records_in"]) == (15, 15)
    assert (sink["watermark"], sink["watermark_status"]) == (None, "NONE")
    job.task_stats["job-1/2:0"]["current_watermark"] = MAX_WATERMARK
    assert job_graph(job)["vertices"][1]["watermark_status"] == "END"
    del job.task_stats["job-1/2:0"]["current_watermark"]  # no event time: no watermark at all
    assert job_graph(job)["vertices"][1]["watermark_status"] is None


def test_a_job_without_its_plan_shows_the_graph_it_last_had() -> None:
    job = _planned_job()
    job.task_stats = {"job-1/1:0": {"records_out": 10}, "job-1/1:1": {"records_out": 5}}
    saved = job.graph_snapshot()
    recovered = JobRecord("job-1", "mod:build", "wm", "", JobConfig())
    recovered.saved_graph = saved
    g = job_graph(recovered)
    assert [(v["name"], v["parallelism"], v["records_out"]) for v in g["vertices"]] == [("Src", 2, 15), ("Sink", 1, 0)]
    assert g["edges"] == [{"from": 1, "to": 2, "partitioner": "rebalance"}]
    assert recovered.total_tasks() == 3
    assert [v["name"] for v in recovered.summary()["vertices"]] == ["Src", "Sink"]  # `sluice status` too


def test_process_sample_gives_cpu_use_in_cores() -> None:
    first = process_sample(None, {"rss_bytes": 100, "cpu_s": 1.0}, 10.0)
    assert first["cpu_ratio"] == 0.0 and first["rss_bytes"] == 100
    second = process_sample(first, {"rss_bytes": 120, "cpu_s": 2.0}, 12.0)
    assert second["cpu_ratio"] == 0.5
    restarted = process_sample(second, {"rss_bytes": 50, "cpu_s": 0.1}, 13.0)  # a new process: no negative use
    assert restarted["cpu_ratio"] == 0.0
    # timed by the worker's clock, like the task rates: a heartbeat that arrives late stretches nothing
    timed = process_sample(None, {"cpu_s": 1.0, "measured_at": 5.0}, 100.0)
    late = process_sample(timed, {"cpu_s": 2.0, "measured_at": 7.0}, 110.0)
    assert late["cpu_ratio"] == 0.5


def test_exceptions_config_and_worker_tasks_views() -> None:
    from coordinator.checkpointing import CheckpointSettings
    job = _planned_job()
    job.checkpoint_settings = CheckpointSettings(1.0, mode="unaligned")
    job.note_failure("first", now=1.0)
    job.note_failure("second", now=2.0)
    assert [e["cause"] for e in exceptions_view(job, 1)["exceptions"]] == ["second"]
    assert [e["cause"] for e in exceptions_view(job, 10)["exceptions"]] == ["second", "first"]
    config = config_view(job)
    assert config["config"]["parallelism"] == {"*": 2} and config["config"]["buffer_bytes"] == DEFAULT_BUFFER_BYTES
    assert config["checkpoint"]["mode"] == "unaligned"
    assert config["restart"] is None
    job.state = JobState.RUNNING
    assert [(t["task"], t["name"]) for t in tasks_on([job], "w-1")] == [("1:0", "Src"), ("2:0", "Sink")]


def test_the_worker_page_has_its_log_tail_or_says_why_not() -> None:
    from coordinator.registry import WorkerRecord

    async def call(method: str, args: dict[str, Any]) -> Any:
        assert (method, args) == ("worker_log", {"worker_id": "w-1", "lines": 2})
        return {"lines": ["a", "b"]}

    workers = WorkerRegistry()
    workers.register(WorkerRecord("w-1", None, 2, "127.0.0.1", 1, None, 7))  # type: ignore[arg-type]
    api = RestApi(jobs=dict, workers=workers, token="t", call=call)
    page = asyncio.run(api(HttpRequest("GET", "/api/v1/workers/w-1", {"lines": "2"}, {})))
    assert page.status == 200 and json.loads(page.body)["log"] == ["a", "b"]
    assert asyncio.run(api(HttpRequest("GET", "/api/v1/workers/w-9", {}, {}))).status == 404

    async def refuse(method: str, args: dict[str, Any]) -> Any:
        raise RpcError("worker w-1 did not give its log: timed out", "WorkerLogUnavailable")

    api = RestApi(jobs=dict, workers=workers, token="t", call=refuse)
    body = json.loads(asyncio.run(api(_request("GET", "/api/v1/workers/w-1"))).body)
    assert body["log"] == [] and "timed out" in body["log_error"] and body["pid"] == 7


def test_log_tail_keeps_the_last_lines() -> None:
    import logging

    from runtime.worker.log_tail import LogTail, process_figures
    tail = LogTail(lines=3)
    logger = logging.getLogger("sluice.test_log_tail")
    logger.addHandler(tail)
    logger.setLevel(logging.INFO)
    try:
        for n in range(5):
            logger.info("line %d", n)
    finally:
        logger.removeHandler(tail)
    assert [line.rsplit(": ", 1)[1] for line in tail.tail(10)] == ["line 2", "line 3", "line 4"]
    figures = process_figures()
    assert figures["rss_bytes"] > 0 and figures["cpu_s"] >= 0


def test_query_numbers_int_refuses_are_the_documented_400_not_a_500() -> None:
    api = _api([])
    for bad in ("\u00b2", "1" * 5000, "\u0663", "-1", "1.5", "", "0x10", " 5"):
        for path, name in (("/api/v1/jobs", "limit"), ("/api/v1/workers/w-1", "lines")):
            response = asyncio.run(api(HttpRequest("GET", path, {name: bad}, {})))
            assert response.status == 400, (path, bad, response.status)
            body = json.loads(response.body)
            assert body["type"] == "BadRequest" and body["error"].startswith(f"{name} must be a"), body
            assert len(body["error"]) < 120, body  # a 5,000-digit value is not echoed whole
    assert whole_number("18") == 18 and whole_number("9" * 18) == 10**18 - 1 and whole_number("9" * 19) is None


def test_each_subtask_shows_its_connectors_figures_as_the_worker_reported_them() -> None:
    job = _planned_job()
    lag = {"name": "sluice_kafka_source_lag_records", "labels": {"topic": "orders", "partition": "3"}, "value": 12}
    job.task_stats = {"job-1/1:0": {"records_out": 10, "connectors": [lag]}, "job-1/1:1": {"records_out": 5}}
    src, sink = job_graph(job)["vertices"]
    assert [s["connectors"] for s in src["subtasks"]] == [[lag], []]
    assert sink["subtasks"][0]["connectors"] == []  # no report yet
