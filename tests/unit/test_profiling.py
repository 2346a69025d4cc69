"""A worker's profile (runtime/worker/profiling.py, profiler.py, the `profile` RPC and its REST route): py-spy's
collapsed stacks parsed and attributed to tasks, cut to a reply's size, and every refusal in one line while
the worker goes on serving."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from coordinator.registry import WorkerRecord, WorkerRegistry
from coordinator.rest import RestApi
from coordinator.rest_views import profile_view
from coordinator.server import Coordinator, CoordinatorConfig
from netstack.errors import Conflict, InvalidRequest, JobNotFound, RpcError
from netstack.http import HttpRequest
from runtime.execution.isolation import task_thread_name
from runtime.graph import protocol as p
from runtime.worker.profiler import Profiler, find_py_spy
from runtime.worker.profiling import (
    PTRACE_HINT,
    Stack,
    bounded,
    failure_line,
    parse_collapsed,
    py_spy_command,
    task_of_thread,
)
from runtime.worker.worker import Worker, WorkerConfig

RAW = """\
thread (0x7F3A2C1E5740): MainThread;<module> (sluice:8);run (runtime/worker/worker.py:140) 3
thread (0x7F3A28FFF640): sluice-task job-1/2:0;_run (runtime/execution/isolation.py:95);spin (job.py:9) 40
thread (0x7F3A28FFF640): sluice-task job-1/2:0;_run (runtime/execution/isolation.py:95);spin (job.py:10) 2
thread (0x7F3A2B7FE640);write (runtime/checkpointing/writer.py:70) 1
garbage without a count
thread (0x7F3A28FFF640): sluice-task job-1/2:0;_run (runtime/execution/isolation.py:95);spin (job.py:9) 5

"""


def test_collapsed_stacks_become_stacks_of_their_threads_most_samples_first() -> None:
    stacks = parse_collapsed(RAW)
    assert stacks == [
        Stack("sluice-task job-1/2:0", ("_run (runtime/execution/isolation.py:95)", "spin (job.py:9)"), 45),
        Stack("MainThread", ("<module> (sluice:8)", "run (runtime/worker/worker.py:140)"), 3),
        Stack("sluice-task job-1/2:0", ("_run (runtime/execution/isolation.py:95)", "spin (job.py:10)"), 2),
        Stack("0x7F3A2B7FE640", ("write (runtime/checkpointing/writer.py:70)",), 1),  # a thread without a name
    ]
    assert [s.task for s in stacks] == ["job-1/2:0", None, "job-1/2:0", None]
    assert stacks[0].to_wire() == ["sluice-task job-1/2:0", "job-1/2:0",
                                   "_run (runtime/execution/isolation.py:95);spin (job.py:9)", 45]
    assert task_of_thread(task_thread_name("j/1:3")) == "j/1:3" and task_of_thread("MainThread") is None
    assert parse_collapsed("") == []


def test_a_reply_keeps_the_widest_stacks_that_fit_and_counts_the_samples_left_out() -> None:
    stacks = [Stack("t", ("f" * 90,), 50), Stack("t", ("g" * 90,), 3), Stack("t", ("h" * 90,), 20)]
    size = stacks[0].chars()
    kept, dropped = bounded(stacks, max_chars=2 * size)
    assert kept == [stacks[0], stacks[2]] and dropped == 3
    assert bounded(stacks, max_chars=size - 1) == ([], 73)


def test_py_spy_records_the_worker_as_collapsed_stacks_rooted_at_threads_without_stopping_it() -> None:
    assert py_spy_command("/bin/py-spy", 42, 5, "/tmp/out.txt") == [
        "/bin/py-spy", "record", "--pid", "42", "--duration", "5", "--rate", "100", "--format", "raw",
        "--threads", "--nonblocking", "--output", "/tmp/out.txt"]


@pytest.mark.parametrize(("stderr", "expected"), [
    # what py-spy prints when it may not read the process, as a user and as root in a container
    ("Permission Denied: Try running again with elevated permissions by going 'sudo env \"PATH=$PATH\" !!'\n",
     f"py-spy could not profile the worker: {PTRACE_HINT}"),
    ("Permission Denied\n\nIt looks like you are running in a docker container. Please make sure you started your "
     "container with the SYS_PTRACE capability.\n", f"py-spy could not profile the worker: {PTRACE_HINT}"),
    ("Error: Operation not permitted (os error 1)\n", f"py-spy could not profile the worker: {PTRACE_HINT}"),
    ("Error: Failed to find python version from target process\nReason: no such file\n",
     "py-spy could not profile the worker (exit status 1): Error: Failed to find python version from target "
     "process"),
    ("", "py-spy could not profile the worker (exit status 1): it wrote no reason"),
])
def test_why_py_spy_failed_is_one_line(stderr: str, expected: str) -> None:
    assert failure_line(1, stderr) == expected
    assert "\n" not in failure_line(1, stderr)


def _refusal(profiler: Profiler, seconds: int) -> RpcError:
    with pytest.raises(RpcError) as info:
        asyncio.run(profiler.record(seconds))
    return info.value


def test_a_profile_outside_1_to_30_seconds_is_refused_before_anything_runs() -> None:
    profiler = Profiler(executable=find_py_spy())
    for seconds in (0, 31, -1):
        refused = _refusal(profiler, seconds)
        assert isinstance(refused, InvalidRequest) and refused.code == "BadProfileRequest"
        assert str(refused) == f"a profile lasts 1 to 30 seconds, not {seconds}"
    assert not profiler.busy


def test_without_py_spy_the_refusal_says_how_to_install_it_and_the_next_one_says_it_again(tmp_path: Any) -> None:
    for executable in (None, str(tmp_path / "no-py-spy-here")):
        profiler = Profiler(executable=executable)
        for _ in range(2):  # the first refusal leaves nothing behind: no busy flag, no process
            refused = _refusal(profiler, 1)
            assert isinstance(refused, Conflict) and refused.code == "ProfilerUnavailable"
            assert "py-spy is not installed on this worker: pip install 'sluice-dataflow[profile]'" in str(refused)
            assert "\n" not in str(refused) and not profiler.busy


def test_a_worker_without_py_spy_refuses_a_profile_and_goes_on_serving() -> None:
    worker = Worker(WorkerConfig(coordinator_host="127.0.0.1", coordinator_port=1, token="t"))
    worker.profiler = Profiler(executable=None)

    async def calls() -> tuple[RpcError, Any]:
        with pytest.raises(Conflict) as info:
            await worker.on_rpc(None, "profile", {"seconds": 2})  # type: ignore[arg-type]
        return info.value, await worker.on_rpc(None, "log_tail", {"lines": 5})  # type: ignore[arg-type]

    refused, log = asyncio.run(calls())
    assert refused.code == "ProfilerUnavailable" and log["worker_id"] == worker.worker_id


def test_the_coordinator_refuses_a_bad_length_or_an_unknown_worker(tmp_path: Any) -> None:
    coordinator = Coordinator(CoordinatorConfig(token="t", metrics_port=None, state_dir=str(tmp_path)))
    coordinator.leading = lambda: True  # type: ignore[method-assign]  # no lease needed to refuse

    def refusal(args: dict[str, Any]) -> RpcError:
        with pytest.raises(RpcError) as info:
            asyncio.run(coordinator.on_rpc(None, "worker_profile", args))  # type: ignore[arg-type]
        return info.value

    assert refusal({"worker_id": "w-1", "seconds": 60}).code == "BadProfileRequest"
    assert refusal({"worker_id": "w-1", "seconds": "5"}).code == "BadArgs"
    missing = refusal({"worker_id": "w-9", "seconds": 5})
    assert isinstance(missing, JobNotFound) and missing.code == "UnknownWorker"
    assert p.PROFILE_SECONDS == (1, 30)


PROFILE = {"worker_id": "w-1", "seconds": 2, "rate_hz": 100, "samples": 50, "dropped_samples": 1,
           "stacks": [["sluice-task j/2:0", "j/2:0", "_run (i.py:9);spin (job.py:9)", 45],
                      ["MainThread", None, "run (w.py:1)", 4]]}


def _api(answer: Any) -> tuple[RestApi, list[tuple[str, dict[str, Any]]]]:
    calls: list[tuple[str, dict[str, Any]]] = []

    async def call(method: str, args: dict[str, Any]) -> Any:
        calls.append((method, args))
        if isinstance(answer, Exception):
            raise answer
        return answer

    workers = WorkerRegistry()
    workers.register(WorkerRecord("w-1", None, 2, "127.0.0.1", 1, None, 7))  # type: ignore[arg-type]
    return RestApi(jobs=dict, workers=workers, token="t", call=call), calls


def _get(api: RestApi, query: dict[str, str]) -> tuple[int, Any]:
    response = asyncio.run(api(HttpRequest("GET", "/api/v1/workers/w-1/profile", query, {})))
    return response.status, json.loads(response.body)


def test_the_rest_answer_gives_each_stack_its_thread_and_task_and_each_thread_its_samples() -> None:
    api, calls = _api(PROFILE)
    status, body = _get(api, {"seconds": "2"})
    assert status == 200 and calls == [("worker_profile", {"worker_id": "w-1", "seconds": 2})]
    assert body == profile_view(PROFILE) == {
        "worker_id": "w-1", "seconds": 2, "rate_hz": 100, "samples": 50, "dropped_samples": 1,
        "threads": [{"thread": "sluice-task j/2:0", "task": "j/2:0", "samples": 45},
                    {"thread": "MainThread", "task": None, "samples": 4}],
        "stacks": [{"thread": "sluice-task j/2:0", "task": "j/2:0", "frames": ["_run (i.py:9)", "spin (job.py:9)"],
                    "samples": 45},
                   {"thread": "MainThread", "task": None, "frames": ["run (w.py:1)"], "samples": 4}]}
    assert _get(api, {})[0] == 200 and calls[-1][1]["seconds"] == 5  # five seconds unless asked


@pytest.mark.parametrize(("refusal", "status"), [
    (Conflict("py-spy could not profile the worker: no permission", "ProfilerUnavailable"), 503),
    (Conflict("this worker is being profiled already: one profile at a time", "ProfileInProgress"), 409),
    (InvalidRequest("a profile lasts 1 to 30 seconds, not 31", "BadProfileRequest"), 400),
    (JobNotFound("no worker w-1", "UnknownWorker"), 404),
    (Conflict("worker w-1 did not give its profile: timed out", "WorkerProfileUnavailable"), 503),
])
def test_a_refused_profile_is_one_error_line_with_its_status(refusal: RpcError, status: int) -> None:
    api, _ = _api(refusal)
    assert _get(api, {"seconds": "3"}) == (status, {"error": str(refusal), "type": refusal.code})


def test_a_seconds_that_is_no_whole_number_is_refused_without_asking_the_worker() -> None:
    api, calls = _api(PROFILE)
    status, body = _get(api, {"seconds": "2.5"})
    assert status == 400 and body["type"] == "BadRequest" and calls == []
