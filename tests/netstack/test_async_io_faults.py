"""Async I/O (`async_map`, runtime/execution/async_io.py, with runtime/connectors/http_client.py) against a real
HTTP service that misbehaves on chosen requests (tests/support/faulty_http_service.py): answers past the
timeout, 503s, garbage, truncated JSON, a connection cut mid-body, or no answer at all. A call is tried as the
retry policy says, then fails the task with the cause named, within a bounded time; a service that recovers
within the retries gives the exact output, also after a restart that killed every kept-alive connection."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest

from runtime.api import RetryPolicy
from runtime.api.async_io import AsyncMap
from runtime.connectors.http_client import HttpClient, HttpError
from runtime.examples.lookup_service import score
from runtime.execution.async_io import AsyncIOFailed, AsyncIOOperator
from tests.support.faulty_http_service import Fault, FaultyHttpService, always, faults_first, faulty_service

TIMEOUT_S = 0.2
# the timeout of the faults that are not about time: a stall of the loaded machine longer than 0.2 s must not
# turn a 503 into a timeout (a CI run once counted one request fewer than the three attempts it asserted)
UNTIMED_S = 10.0
DELAY_S = 1.0  # a delayed answer comes this late: well past the timeout
DEADLINE_S = 20.0  # no test waits longer for the operator, however loaded the machine
RETRY = RetryPolicy(max_attempts=3, initial_backoff_s=0.01)

# what a call fails with when every attempt meets the fault: the cause's type, and the operator's message
FAILURES: dict[Fault, tuple[type[BaseException], str]] = {
    Fault.DELAY: (TimeoutError, f"a call timed out (timeout_s={TIMEOUT_S}) after 3 attempt(s) (record 'k1')"),
    Fault.NEVER: (TimeoutError, f"a call timed out (timeout_s={TIMEOUT_S}) after 3 attempt(s) (record 'k1')"),
    Fault.ANSWER_503: (HttpError, "a call failed: HttpError: GET /lookup/k1: HTTP 503 "
                                  "b'{\"error\": \"unavailable\"}' after 3 attempt(s) (record 'k1')"),
    Fault.GARBAGE_BODY: (json.JSONDecodeError, "a call failed: JSONDecodeError: Expecting value: line 1 column 1 "
                                               "(char 0) after 3 attempt(s) (record 'k1')"),
    Fault.NOT_HTTP: (HttpError, "a call failed: HttpError: not an HTTP answer: '\\x00\\x13garbage, not HTTP' "
                                "after 3 attempt(s) (record 'k1')"),
    Fault.TRUNCATED_JSON: (json.JSONDecodeError, "a call failed: JSONDecodeError: Expecting property name enclosed "
                                                 "in double quotes: line 1 column 14 (char 13) after 3 attempt(s) "
                                                 "(record 'k1')"),
    Fault.CUT_OFF: (ConnectionError, "a call failed: ConnectionError: the service closed the connection after 13 "
                                     "of the 26 bytes of an answer's body after 3 attempt(s) (record 'k1')"),
}


class Enrichment:
    """An async_map operator whose function looks each key up in the service, run on this loop."""

    def __init__(self, port: int, *, retry: RetryPolicy = RETRY, capacity: int = 4,
                 timeout_s: float | None = TIMEOUT_S) -> None:
        self.client = HttpClient("127.0.0.1", port)
        self.out: list[Any] = []
        self.failures: list[BaseException] = []
        self.op = AsyncIOOperator(AsyncMap(self.lookup, capacity, timeout_s, True, retry), node_id=1,
                                  name="lookup", key_fn=None, subtask_index=0, parallelism=1, max_parallelism=128,
                                  timed=False, emit=self.out.extend, forward_watermark=lambda ts: None)
        self.op.bind(wake=lambda: None, on_failure=self.failures.append)

    async def lookup(self, key: str) -> Any:
        return (await self.client.get_json(f"/lookup/{key}"))["score"]

    async def run(self, keys: list[str]) -> None:
        """Feed `keys` as the task does (a chunk, then wait for admission), then finish."""
        deadline = time.monotonic() + DEADLINE_S
        for i in range(0, len(keys), 4):
            self.op.feed(keys[i:i + 4])
            while self.op.backlog:
                self.op.raise_if_failed()
                assert time.monotonic() < deadline, "input never admitted"
                await asyncio.sleep(0.002)
        await asyncio.wait_for(self.op.finish(), deadline - time.monotonic())

    async def close(self) -> None:
        await self.op.aclose()
        self.client.close()


def keys(n: int, start: int = 0) -> list[str]:
    return [f"k{i}" for i in range(start, start + n)]


@pytest.mark.parametrize("fault", list(Fault), ids=lambda f: f.value)
async def test_a_service_that_keeps_misbehaving_fails_the_call_after_its_retries_with_the_cause(fault: Fault) -> None:
    cause_type, message = FAILURES[fault]
    async with faulty_service(always(fault), delay_s=DELAY_S) as service:
        e = Enrichment(service.port, timeout_s=TIMEOUT_S if cause_type is TimeoutError else UNTIMED_S)
        started = time.monotonic()
        try:
            with pytest.raises(AsyncIOFailed) as failed:
                await e.run(["k1"])
        finally:
            await e.close()
        elapsed = time.monotonic() - started
    assert str(failed.value) == f"lookup: {message}"
    assert type(failed.value.__cause__) is cause_type
    assert e.failures == [failed.value]  # the task was told once
    assert service.requests == 3 and e.out == []  # each of the three attempts reached the service
    timed_out = 3 if cause_type is TimeoutError else 0
    assert (e.op.stats.failed, e.op.stats.retried, e.op.stats.timed_out) == (1, 2, timed_out)
    # bounded: three attempts and two backoffs, never the delayed answer nor a hang (room for a loaded machine)
    assert elapsed < (3 * TIMEOUT_S if timed_out else 0) + 0.03 + 5.0


@pytest.mark.parametrize("fault", list(Fault), ids=lambda f: f.value)
async def test_a_service_that_recovers_within_the_retries_gives_the_exact_output(fault: Fault) -> None:
    timed = FAILURES[fault][0] is TimeoutError
    async with faulty_service(faults_first(2, fault), delay_s=DELAY_S) as service:
        e = Enrichment(service.port, timeout_s=TIMEOUT_S if timed else UNTIMED_S)
        try:
            await e.run(keys(10))
        finally:
            await e.close()
    assert e.out == [score(k) for k in keys(10)] and e.failures == []
    assert [f for _, f in service.faults] == [fault, fault] and service.requests == 12
    assert (e.op.stats.completed, e.op.stats.retried, e.op.stats.failed) == (10, 2, 0)


async def test_every_kind_of_fault_in_one_run_is_ridden_out_in_order() -> None:
    kinds = list(Fault)  # requests 1..7 meet one fault each; a call retried 7 times always gets through
    # 40 good calls must each answer within the timeout: 1 s, not 0.2, so a loaded machine's stall does not
    # time one out (a busy unit run once counted 51 requests for 47); the delayed answer stays well past it
    async with faulty_service(lambda n: kinds[n - 1] if n <= len(kinds) else None, delay_s=3.0) as service:
        e = Enrichment(service.port, capacity=8, timeout_s=1.0,
                       retry=RetryPolicy(max_attempts=len(kinds) + 1, initial_backoff_s=0.01, max_backoff_s=0.05))
        try:
            await e.run(keys(40))
        finally:
            await e.close()
    assert e.out == [score(k) for k in keys(40)] and e.failures == []
    assert [n for n, _ in service.faults] == list(range(1, 8)) and service.requests == 47
    assert (e.op.stats.retried, e.op.stats.timed_out) == (7, 2)


async def test_a_restarted_service_is_called_again_on_new_connections_without_a_retry() -> None:
    # a service restart closes every kept-alive connection in the client's pool; the next calls (no retries
    # at all) must not fail on a dead pooled connection
    service = FaultyHttpService(lambda n: None)
    await service.start()
    e = Enrichment(service.port, capacity=8, retry=RetryPolicy(max_attempts=1))
    try:
        await e.run(keys(16))
        assert len(e.client._idle) > 1  # kept-alive connections wait in the pool
        await service.stop()
        await service.start(service.port)
        await e.run(keys(16, start=16))
    finally:
        await e.close()
        await service.stop()
    assert e.out == [score(k) for k in keys(32)] and e.failures == []


async def test_a_function_cancelled_from_inside_fails_the_call_instead_of_hanging() -> None:
    async def cancelled_inside(key: str) -> Any:
        raise asyncio.CancelledError()  # e.g. a future it awaited was cancelled by a client closing under it

    op = AsyncIOOperator(AsyncMap(cancelled_inside, 4, TIMEOUT_S, True, RETRY), node_id=1, name="lookup",
                         key_fn=None, subtask_index=0, parallelism=1, max_parallelism=128, timed=False,
                         emit=lambda rs: None, forward_watermark=lambda ts: None)
    op.bind(wake=lambda: None, on_failure=lambda e: None)
    op.feed(["k1"])
    with pytest.raises(AsyncIOFailed) as failed:
        await asyncio.wait_for(op.finish(), DEADLINE_S)
    await op.aclose()
    assert str(failed.value) == "lookup: a call failed: CancelledError:  after 1 attempt(s) (record 'k1')"
    assert type(failed.value.__cause__) is asyncio.CancelledError


async def test_the_functions_own_timeout_is_named_as_its_failure_not_as_the_operators() -> None:
    async with faulty_service(always(Fault.NEVER)) as service:
        client = HttpClient("127.0.0.1", service.port)

        async def lookup(key: str) -> Any:
            async with asyncio.timeout(0.05):  # the function's own client timeout, shorter than timeout_s
                return await client.get_json(f"/lookup/{key}")

        op = AsyncIOOperator(AsyncMap(lookup, 4, 5.0, True, RETRY), node_id=1, name="lookup", key_fn=None,
                             subtask_index=0, parallelism=1, max_parallelism=128, timed=False,
                             emit=lambda rs: None, forward_watermark=lambda ts: None)
        op.bind(wake=lambda: None, on_failure=lambda e: None)
        op.feed(["k1"])
        try:
            with pytest.raises(AsyncIOFailed) as failed:
                await asyncio.wait_for(op.finish(), DEADLINE_S)
        finally:
            await op.aclose()
            client.close()
    assert str(failed.value) == "lookup: a call failed: TimeoutError:  after 3 attempt(s) (record 'k1')"
    assert op.stats.timed_out == 0 and service.requests == 3  # retried as an exception, not as timeout_s
