"""User code that misbehaves (runtime/execution/user_code.py): slow calls are reported once with the function and
its stack, sys.exit() fails its task and nothing else, a cancelled task whose call never returns is handed to
the worker's fatal handler after the cancel timeout. Real tasks and threads on one event loop, in this process."""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from typing import Any

import pytest

from runtime.api import DiscardSink, GeneratorSource, Job
from runtime.execution.channels import OutputGate
from runtime.execution.isolation import IsolationSettings, TaskThread
from runtime.execution.operators import Chain
from runtime.execution.task import Credits, Task, TaskKey
from runtime.execution.user_code import (
    CallWatchdog,
    RunningCall,
    SlowCall,
    UserCodeCancelled,
    UserCodeExit,
    user_function,
)
from runtime.graph.enums import TaskState

DEADLINE_S = 30.0


def exits_with_3(record: Any) -> Any:
    if record[1] == 10:
        sys.exit(3)
    return record


def _task(fn: Any, *, mode: str = "thread", count: int | None = 100) -> Task:
    job = Job()
    job.source(GeneratorSource(count=count, keys=5, seed=1), name="src").map(fn).sink(DiscardSink())
    chain = Chain(job, [0, 1, 2], subtask_index=0, parallelism=1, attempt=0, outputs=[])
    return Task(key=TaskKey("job", 0, 0, "src", 1), chain=chain, outputs=[], output_gate=OutputGate(), inputs=[],
                credits=Credits(2, 8), source=job.nodes[0].payload, flush_timeout_s=0.05,
                isolation=IsolationSettings(mode))


@pytest.mark.parametrize("mode", ["thread", "inline"])
def test_sys_exit_in_a_map_fails_its_task_with_the_function_named(mode: str) -> None:
    async def main() -> None:
        task = _task(exits_with_3, mode=mode)
        with pytest.raises(UserCodeExit) as raised:
            await task.run()
        assert task.state == TaskState.FAILED
        message = str(raised.value)
        assert "sys.exit(3)" in message and "test_user_code.exits_with_3" in message, message
        await asyncio.sleep(0)  # the loop is still there: SystemExit did not leave it

    asyncio.run(main())


def test_the_task_thread_survives_a_sys_exit_and_runs_the_next_call() -> None:
    async def main() -> None:
        thread = TaskThread("exits")
        with pytest.raises(UserCodeExit):
            await thread.call(sys.exit, 4)
        assert await thread.call(lambda: 5) == 5
        assert await thread.stop(timeout_s=5)

    asyncio.run(main())


class Gate:
    """A user call that blocks until released (a synchronous client that hangs)."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()

    def wait_for_release(self, record: Any) -> Any:
        if record[1] == 5:
            self.entered.set()
            self.release.wait(DEADLINE_S)
        return record


def _wait(predicate: Any, what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def test_a_call_past_the_threshold_is_reported_once_with_its_function_and_stack() -> None:
    gate = Gate()
    task = _task(gate.wait_for_release)
    reports: list[SlowCall] = []
    watchdog = CallWatchdog(lambda: [c for c in [task.running_call()] if c is not None], slow_call_s=0.2,
                            on_slow=reports.append)

    async def main() -> None:
        running = asyncio.create_task(task.run())
        await asyncio.to_thread(gate.entered.wait, DEADLINE_S)
        call = task.running_call()
        assert call is not None
        assert watchdog.check(call.started + 0.1) == []  # not yet past the threshold
        (slow,) = watchdog.check(call.started + 0.3)
        assert watchdog.check(call.started + 5.0) == []  # once per call
        assert slow.task_id == task.task_id and slow.running_s >= 0.2
        assert "test_user_code.Gate.wait_for_release" in slow.function, slow.function
        assert "self.release.wait(DEADLINE_S)" in slow.stack
        gate.release.set()
        await running

    asyncio.run(main())
    assert len(reports) == 1 and watchdog.reports == 1


def test_a_stuck_event_loop_is_reported_with_the_function_holding_it() -> None:
    reports: list[SlowCall] = []
    watchdog = CallWatchdog(lambda: [], slow_call_s=0.1, on_slow=reports.append, loop_thread=threading.get_ident())
    watchdog.loop_alive()
    watchdog.start()

    def holds_the_loop() -> None:
        deadline = time.monotonic() + DEADLINE_S
        while not reports and time.monotonic() < deadline:
            time.sleep(0.01)

    try:
        holds_the_loop()
    finally:
        watchdog.stop()
    assert len(reports) == 1 and reports[0].task_id is None
    assert "holds_the_loop" in reports[0].function, reports[0].function


def test_a_cancelled_task_whose_call_never_returns_goes_to_on_stuck_after_the_timeout() -> None:
    gate = Gate()
    task = _task(gate.wait_for_release, count=None)
    task.cancel_timeout_s = 0.3
    stuck: list[tuple[Task, RunningCall | None]] = []
    task.on_stuck = lambda t: stuck.append((t, t.running_call()))

    async def main() -> None:
        running = asyncio.create_task(task.run())
        await asyncio.to_thread(gate.entered.wait, DEADLINE_S)
        t0 = time.monotonic()
        running.cancel()
        with pytest.raises(asyncio.CancelledError):
            await running
        assert time.monotonic() - t0 >= 0.3
        assert task.state == TaskState.CANCELLED

    try:
        asyncio.run(main())
    finally:
        gate.release.set()
    assert len(stuck) == 1 and stuck[0][0] is task
    call = stuck[0][1]
    assert call is not None and call.task_id == task.task_id  # the worker names the call in its fatal line


def test_user_function_names_the_innermost_user_frame() -> None:
    def inner() -> str:
        return user_function(_frames())

    assert user_function([]) == "?"
    assert "test_user_code.test_user_function_names_the_innermost_user_frame.<locals>.inner" in inner()


def _frames() -> list[Any]:
    frames = []
    frame = sys._getframe(1)
    while frame is not None:
        frames.append(frame)
        frame = frame.f_back  # type: ignore[assignment]
    return frames[::-1]


STUCK_WORKER = '''
import asyncio, logging, sys, threading
from runtime.api import DiscardSink, GeneratorSource, Job
from runtime.execution.channels import OutputGate
from runtime.execution.operators import Chain
from runtime.execution.task import Credits, Task, TaskKey
from runtime.worker.worker import Worker

logging.basicConfig(level=logging.INFO)
never = threading.Event()


def hangs_for_good(record):
    never.wait()


job = Job()
job.source(GeneratorSource(count=None, keys=5, seed=1)).map(hangs_for_good).sink(DiscardSink())
chain = Chain(job, [0, 1, 2], subtask_index=0, parallelism=1, attempt=0, outputs=[])
task = Task(key=TaskKey("job", 0, 0, "src", 1), chain=chain, outputs=[], output_gate=OutputGate(), inputs=[],
            credits=Credits(2, 8), source=job.nodes[0].payload, flush_timeout_s=0.05)
task.cancel_timeout_s = 0.2
task.on_stuck = lambda t: Worker._user_code_stuck(None, t)  # the worker's handler: it uses nothing of the worker


async def main():
    running = asyncio.create_task(task.run())
    while task.running_call() is None:
        await asyncio.sleep(0.01)
    running.cancel()
    await asyncio.gather(running, return_exceptions=True)


asyncio.run(main())
print("the worker was not ended")
'''


def test_the_worker_exits_with_status_70_when_a_cancelled_call_never_returns(tmp_path: Any) -> None:
    """The worker's side of the cancellation watchdog, in a real process: it names the call and exits."""
    import os
    import subprocess

    from runtime.worker.worker import EXIT_USER_CODE_STUCK

    script = tmp_path / "stuck_worker.py"
    script.write_text(STUCK_WORKER)
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=DEADLINE_S,
                          env=env, check=False)
    assert done.returncode == EXIT_USER_CODE_STUCK == 70, (done.stdout, done.stderr)
    assert "the worker was not ended" not in done.stdout
    assert "user call __main__.hangs_for_good" in done.stderr and "never.wait()" in done.stderr, done.stderr


class ClosingSink(DiscardSink):
    """A sink whose close() blocks until released (a client waiting for a broker that is down)."""

    def __init__(self, release: threading.Event) -> None:
        super().__init__()
        self.release = release
        self.closed_on: str | None = None

    def close(self) -> None:
        self.closed_on = threading.current_thread().name
        self.release.wait(DEADLINE_S)
        super().close()


def _closing_task(sink: ClosingSink) -> Task:
    job = Job()
    job.source(GeneratorSource(count=50, keys=5, seed=1), name="src").sink(sink)
    chain = Chain(job, [0, 1], subtask_index=0, parallelism=1, attempt=0, outputs=[])
    return Task(key=TaskKey("job", 0, 0, "src", 1), chain=chain, outputs=[], output_gate=OutputGate(), inputs=[],
                credits=Credits(2, 8), source=job.nodes[0].payload, flush_timeout_s=0.05)


def test_a_blocking_close_runs_on_the_tasks_thread_and_the_loop_runs_on() -> None:
    release = threading.Event()
    sink = ClosingSink(release)
    task = _closing_task(sink)

    async def main() -> None:
        running = asyncio.create_task(task.run())
        ticks = 0
        while sink.closed_on is None or ticks < 20:  # the loop keeps turning while close() blocks
            assert not running.done()
            await asyncio.sleep(0.01)
            ticks += 1
        call = task.running_call()
        assert call is not None and call.task_id == task.task_id  # the watchdog sees the close running
        release.set()
        await asyncio.wait_for(running, DEADLINE_S)
        assert task.state == TaskState.FINISHED

    asyncio.run(main())
    assert sink.closed_on == "sluice-task job/0:0"


def test_a_close_that_never_returns_goes_to_on_stuck_after_the_timeout() -> None:
    release = threading.Event()
    task = _closing_task(ClosingSink(release))
    task.cancel_timeout_s = 0.2  # a finished task's closes get twice that
    stuck: list[RunningCall | None] = []
    task.on_stuck = lambda t: stuck.append(t.running_call())

    async def main() -> None:
        t0 = time.monotonic()
        await asyncio.wait_for(task.run(), DEADLINE_S)  # the task ends; its close is left running
        assert time.monotonic() - t0 >= 0.4

    try:
        asyncio.run(main())
    finally:
        release.set()
    assert len(stuck) == 1 and stuck[0] is not None and stuck[0].task_id == "job/0:0"  # named in the fatal line


async def exits_on_10(value: Any) -> Any:
    if value[1] == 10:
        sys.exit(3)
    return value


@pytest.mark.parametrize("mode", ["thread", "inline"])
def test_sys_exit_in_an_async_map_function_fails_its_task_with_the_function_named(mode: str) -> None:
    """On the task's own loop the SystemExit left the record's asyncio task, ended the loop's thread and the task
    waited for ever (cancelled, it then took the worker down as stuck); inline it ended the worker's loop."""

    async def main() -> None:
        job = Job()
        job.source(GeneratorSource(count=100, keys=5, seed=1), name="src").async_map(exits_on_10, timeout_s=30) \
            .sink(DiscardSink())
        chain = Chain(job, [0, 1, 2], subtask_index=0, parallelism=1, attempt=0, outputs=[])
        task = Task(key=TaskKey("job", 0, 0, "src", 1), chain=chain, outputs=[], output_gate=OutputGate(),
                    inputs=[], credits=Credits(2, 8), source=job.nodes[0].payload, flush_timeout_s=0.05,
                    isolation=IsolationSettings(mode))
        with pytest.raises(Exception) as raised:
            await asyncio.wait_for(task.run(), DEADLINE_S)
        assert task.state == TaskState.FAILED
        causes = []
        error: BaseException | None = raised.value
        while error is not None:
            causes.append(error)
            error = error.__cause__
        exit_error = next((e for e in causes if isinstance(e, UserCodeExit)), None)
        assert exit_error is not None, causes
        assert "sys.exit(3)" in str(exit_error) and "test_user_code.exits_on_10" in str(exit_error), str(exit_error)
        await asyncio.sleep(0)  # the loop is still there

    asyncio.run(main())


def test_sys_exit_in_a_task_an_async_function_started_fails_its_task_while_it_waits_for_admission() -> None:
    """No call of the task waits when the exit comes (its records fill the operator's capacity, it waits for
    admission): the loop reports it and the task fails, naming the function; before, the loop's thread ended
    and the task waited for ever."""
    go, holding = threading.Event(), threading.Event()
    never: list[asyncio.Event] = []

    async def exits_later() -> None:
        await asyncio.to_thread(go.wait, DEADLINE_S)
        sys.exit(6)

    async def starts_a_task_and_holds(value: Any) -> Any:
        if not never:
            never.append(asyncio.Event())
            asyncio.get_running_loop().create_task(exits_later())  # a client's background task, say
        if value[1] == 1:
            holding.set()
        await never[0].wait()  # the capacity fills: the task then waits for admission
        return value

    async def main() -> None:
        job = Job()
        job.source(GeneratorSource(count=None, keys=5, seed=1), name="src") \
            .async_map(starts_a_task_and_holds, timeout_s=None, capacity=2).sink(DiscardSink())
        chain = Chain(job, [0, 1, 2], subtask_index=0, parallelism=1, attempt=0, outputs=[])
        task = Task(key=TaskKey("job", 0, 0, "src", 1), chain=chain, outputs=[], output_gate=OutputGate(),
                    inputs=[], credits=Credits(2, 8), source=job.nodes[0].payload, flush_timeout_s=0.05)
        running = asyncio.ensure_future(task.run())
        assert await asyncio.to_thread(holding.wait, DEADLINE_S)
        op = chain.async_operator
        assert op is not None
        deadline = time.monotonic() + DEADLINE_S
        while not op.backlog:  # the task waits for admission now, no call of it on the loop
            assert time.monotonic() < deadline, "the async_map never filled its capacity"
            await asyncio.sleep(0.01)
        go.set()
        with pytest.raises(UserCodeExit, match=r"sys.exit\(6\) in .*exits_later"):
            await asyncio.wait_for(running, DEADLINE_S)
        assert task.state == TaskState.FAILED

    asyncio.run(main())


def cancels_on_10(record: Any) -> Any:
    if record[1] == 10:
        raise asyncio.CancelledError()  # a client's own cancellation, raised through the function
    return record


@pytest.mark.parametrize("mode", ["thread", "inline"])
def test_a_cancelled_error_user_code_raises_fails_its_task_with_the_function_named(mode: str) -> None:
    """The task ended cancelled though nobody cancelled it: the worker takes a cancelled task for one it stopped
    on purpose and reports nothing, so the job waited for it for ever."""

    async def main() -> None:
        task = _task(cancels_on_10, mode=mode)
        runner = asyncio.ensure_future(task.run())
        await asyncio.wait([runner], timeout=DEADLINE_S)
        assert runner.done() and not runner.cancelled()
        error = runner.exception()
        assert isinstance(error, UserCodeCancelled), error
        assert "test_user_code.cancels_on_10" in str(error), str(error)
        assert task.state == TaskState.FAILED

    asyncio.run(main())


async def passed_on(value: Any) -> Any:
    return value


def test_a_task_whose_own_loop_stopped_is_not_reported_as_a_slow_call() -> None:
    """A stopped loop ticks no more: its last tick aged, and a finished job (kept 30 s for status) had each of
    its asynchronous tasks reported as a user call running past the threshold, in its exception history."""

    async def main() -> None:
        job = Job()
        job.source(GeneratorSource(count=100, keys=5, seed=1), name="src").async_map(passed_on).sink(DiscardSink())
        chain = Chain(job, [0, 1, 2], subtask_index=0, parallelism=1, attempt=0, outputs=[])
        task = Task(key=TaskKey("job", 0, 0, "src", 1), chain=chain, outputs=[], output_gate=OutputGate(),
                    inputs=[], credits=Credits(2, 8), source=job.nodes[0].payload, flush_timeout_s=0.05)
        running = asyncio.ensure_future(task.run())
        deadline = time.monotonic() + DEADLINE_S
        while task.running_call() is None:  # its loop runs: the watchdog watches it
            assert time.monotonic() < deadline
            await asyncio.sleep(0.001)
        await asyncio.wait_for(running, DEADLINE_S)
        assert task.state == TaskState.FINISHED and task.isolation.user_loop
        assert task.running_call() is None
        reports: list[SlowCall] = []
        watchdog = CallWatchdog(lambda: [c for c in [task.running_call()] if c is not None], slow_call_s=5.0,
                                on_slow=reports.append)
        assert watchdog.check(time.monotonic() + 60.0) == [] and reports == []

    asyncio.run(main())


class ClosedUnderIt:
    """An async_map function whose client's close is cancelled under it."""

    async def __call__(self, value: Any) -> Any:
        return value

    async def close(self) -> None:
        cancelled: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        cancelled.cancel()
        await cancelled


@pytest.mark.parametrize("mode", ["thread", "inline"])
def test_a_finished_task_whose_async_function_close_raises_cancelled_error_ends_finished(mode: str) -> None:
    """The CancelledError left the task's close: the finished task ended as a cancelled asyncio task, which the
    worker takes for a stop on purpose, so it reported nothing (no TaskFinished)."""

    async def main() -> None:
        job = Job()
        job.source(GeneratorSource(count=100, keys=5, seed=1), name="src").async_map(ClosedUnderIt()) \
            .sink(DiscardSink())
        chain = Chain(job, [0, 1, 2], subtask_index=0, parallelism=1, attempt=0, outputs=[])
        task = Task(key=TaskKey("job", 0, 0, "src", 1), chain=chain, outputs=[], output_gate=OutputGate(),
                    inputs=[], credits=Credits(2, 8), source=job.nodes[0].payload, flush_timeout_s=0.05,
                    isolation=IsolationSettings(mode))
        runner = asyncio.ensure_future(task.run())
        await asyncio.wait([runner], timeout=DEADLINE_S)
        assert runner.done() and not runner.cancelled() and runner.exception() is None
        assert task.state == TaskState.FINISHED and task.chain.records_out == 100

    asyncio.run(main())
