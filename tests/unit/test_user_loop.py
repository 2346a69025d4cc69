"""A task's user loop (runtime/execution/user_loop.py): user coroutines on a loop and thread of their own, their
results, errors and cancellation carried back to the awaiting loop, a blocking call that stalls only that loop,
plain runs, the park that lets the caller touch what lives there, and a stop that gives up on a loop user code
holds."""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from collections.abc import AsyncIterator

import pytest

from runtime.execution.user_code import UserCodeExit
from runtime.execution.user_loop import TICK_S, UserLoop


class Stepper:
    """A record's coroutine on the user loop that steps all the time: parking the loop must stop its count."""

    def __init__(self) -> None:
        self.steps = 0
        self._stop, self._stepping = threading.Event(), threading.Event()
        self._running: asyncio.Future[None] | None = None

    @classmethod
    async def start(cls, user: UserLoop) -> Stepper:
        stepper = cls()
        stepper._running = asyncio.ensure_future(user.run(stepper._step()))
        assert await asyncio.to_thread(stepper._stepping.wait, 10.0)
        return stepper

    async def _step(self) -> None:
        while not self._stop.is_set():
            self.steps += 1
            if self.steps == 100:
                self._stepping.set()
            await asyncio.sleep(0)

    async def stop(self) -> None:
        self._stop.set()
        assert self._running is not None
        await asyncio.wait_for(self._running, 10.0)


@pytest.fixture
async def user() -> AsyncIterator[UserLoop]:
    loop = UserLoop("test user loop")
    yield loop
    await loop.stop(10.0)


async def test_a_coroutine_runs_on_the_user_loops_thread_and_returns_its_result(user: UserLoop) -> None:
    async def where() -> str:
        await asyncio.sleep(0)
        return threading.current_thread().name

    assert await user.run(where()) == "test user loop"


async def test_an_exception_and_sys_exit_come_back_to_the_caller(user: UserLoop) -> None:
    async def fails() -> None:
        raise ValueError("bad record")

    async def exits() -> None:
        raise SystemExit(3)

    with pytest.raises(ValueError, match="bad record"):
        await user.run(fails())
    with pytest.raises(UserCodeExit, match=r"sys.exit\(3\)"):
        await user.run(exits())


async def test_a_timeout_on_the_caller_cancels_the_user_task(user: UserLoop) -> None:
    cancelled = threading.Event()

    async def forever() -> None:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.1):
            await user.run(forever())
    assert await asyncio.to_thread(cancelled.wait, 10.0)


async def test_a_user_task_cancelled_by_its_own_code_cancels_the_caller(user: UserLoop) -> None:
    async def cancels_itself() -> None:
        asyncio.current_task().cancel()  # type: ignore[union-attr]
        await asyncio.sleep(1)

    with pytest.raises(asyncio.CancelledError):
        await user.run(cancels_itself())


async def test_a_blocking_call_stalls_only_the_user_loop_and_stops_its_ticks(user: UserLoop) -> None:
    release = threading.Event()

    async def blocks() -> str:
        release.wait(10.0)  # a synchronous client inside an async function
        return "done"

    call = asyncio.ensure_future(user.run(blocks()))
    ticks: list[float] = []
    for _ in range(10):  # the caller's loop keeps running meanwhile
        await asyncio.sleep(TICK_S)
        ticks.append(user.running_since())
    assert not call.done()
    assert time.monotonic() - user.running_since() >= 5 * TICK_S  # the watchdog sees the loop stalled
    release.set()
    assert await asyncio.wait_for(call, 10.0) == "done"
    seen = user.running_since()
    await asyncio.sleep(3 * TICK_S)
    assert user.running_since() > seen  # ticking again


async def test_exclusive_parks_the_user_loop_while_its_function_runs_here(user: UserLoop) -> None:
    """A task's mailbox and snapshots touch its chain while its loop is parked: nothing runs there meanwhile,
    and a loop held by a blocking call delays the park, never the caller's loop."""
    busy = await Stepper.start(user)
    home_thread = threading.get_ident()

    def snapshot() -> tuple[int, int, bool]:
        before = busy.steps
        time.sleep(0.05)  # the user loop would step thousands of times meanwhile
        return before, busy.steps, threading.get_ident() == home_thread

    before, after, here = await user.exclusive(snapshot)
    assert before == after and here
    release, started = threading.Event(), threading.Event()

    def blocking() -> bool:  # a run blocking on the user loop
        started.set()
        return release.wait(10.0)

    blocked = asyncio.ensure_future(user.call(blocking))
    assert await asyncio.to_thread(started.wait, 10.0)
    parked = asyncio.ensure_future(user.exclusive(lambda: "parked"))
    ticks = 0
    for _ in range(5):  # the caller's loop runs on while the park waits for the blocking call
        await asyncio.sleep(TICK_S / 2)
        ticks += 1
    assert ticks == 5 and not parked.done()
    release.set()
    assert await asyncio.wait_for(blocked, 10.0) is True
    assert await asyncio.wait_for(parked, 10.0) == "parked"
    await busy.stop()


async def test_exclusive_releases_the_park_when_its_function_fails_or_its_caller_gives_up(user: UserLoop) -> None:
    def fails() -> None:
        raise ValueError("snapshot failed")

    with pytest.raises(ValueError, match="snapshot failed"):
        await user.exclusive(fails)
    assert await asyncio.wait_for(user.call(lambda: "runs"), 10.0) == "runs"  # not parked for ever
    release, started = threading.Event(), threading.Event()
    blocked = asyncio.ensure_future(user.call(lambda: (started.set(), release.wait(10.0))))
    assert await asyncio.to_thread(started.wait, 10.0)
    parked = asyncio.ensure_future(user.exclusive(lambda: "parked"))
    await asyncio.sleep(TICK_S)
    parked.cancel()  # before the park began (a task cancelled meanwhile): the park passes straight through
    with pytest.raises(asyncio.CancelledError):
        await parked
    release.set()
    await asyncio.wait_for(blocked, 10.0)
    assert await asyncio.wait_for(user.call(lambda: "runs"), 10.0) == "runs"


async def test_a_parked_call_runs_on_the_loops_thread_while_it_stays_parked(user: UserLoop) -> None:
    """A checkpoint's user calls (a sink's pre-commit, its commit) run on the parked loop's thread, in order, with
    no coroutine of the loop stepping between them and the caller's code; one that blocks holds up the park only,
    never the caller's loop; the park is released when the block ends, also when a call fails."""
    busy = await Stepper.start(user)
    home = threading.get_ident()
    release = threading.Event()
    seen: list[tuple[str, int, bool]] = []

    def pre_commit(name: str) -> str:
        seen.append((name, busy.steps, threading.get_ident() == user.ident))
        if name == "blocks":
            release.wait(10.0)
        return name

    ticks = 0
    async with user.parked() as park:
        at_park = busy.steps
        assert await park.call(pre_commit, "first") == "first"
        blocked = asyncio.ensure_future(park.call(pre_commit, "blocks"))
        while not blocked.done() and ticks < 5:  # the caller's loop runs on while the parked call blocks
            await asyncio.sleep(TICK_S / 2)
            ticks += 1
        assert ticks == 5 and not blocked.done()
        release.set()
        assert await asyncio.wait_for(blocked, 10.0) == "blocks"
        assert busy.steps == at_park and threading.get_ident() == home
    assert seen == [("first", at_park, True), ("blocks", at_park, True)]
    assert user.held_gil and user.runs == 0  # user calls a task's mail deferred are no runs (handover.py)
    with pytest.raises(ValueError, match="commit failed"):
        async with user.parked() as park:
            await park.call(lambda: (_ for _ in ()).throw(ValueError("commit failed")))
    assert await asyncio.wait_for(user.call(lambda: "runs"), 10.0) == "runs"  # not parked for ever
    await asyncio.to_thread(time.sleep, 0.05)
    assert busy.steps > at_park  # unparked, the loop steps again
    await busy.stop()


async def test_a_run_is_a_plain_call_on_the_user_loop(user: UserLoop) -> None:
    def where(tag: str) -> tuple[str, str]:
        asyncio.get_running_loop()  # a run may start asyncio tasks there (an operator's records)
        return tag, threading.current_thread().name

    assert await user.call(where, "run") == ("run", "test user loop")
    with pytest.raises(UserCodeExit):
        await user.call(sys.exit, 3)


async def test_stop_cancels_what_runs_and_gives_up_on_a_blocked_loop() -> None:
    user = UserLoop("test user loop")
    started = threading.Event()

    async def sleeps() -> None:
        started.set()
        await asyncio.sleep(60)

    call = asyncio.ensure_future(user.run(sleeps()))
    assert await asyncio.to_thread(started.wait, 10.0)
    assert await user.stop(10.0)
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(call, 10.0)

    stuck = UserLoop("test stuck loop")
    release, blocking = threading.Event(), threading.Event()

    async def blocks() -> None:
        blocking.set()
        release.wait(30.0)

    blocked = asyncio.ensure_future(stuck.run(blocks()))
    # not a sleep: on a busy machine the stop could come before blocks() began, and cancel it cleanly
    assert await asyncio.to_thread(blocking.wait, 10.0)
    assert not await stuck.stop(0.3)  # user code holds its loop: the stop gives up, the caller goes on
    release.set()
    await asyncio.wait_for(blocked, 10.0)
    assert await stuck.stop(10.0)


async def test_a_call_made_once_stop_began_is_refused_at_once() -> None:
    """A call handed over while stop() cancels what runs came after its sweep of the loop's tasks, or after the
    loop stopped: it was accepted and never answered. Now it is refused at once."""
    user = UserLoop("test user loop")
    entered, hold, began = threading.Event(), threading.Event(), threading.Event()

    async def slow_to_cancel() -> None:
        try:
            began.set()
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            entered.set()
            hold.wait(30.0)  # user code cleaning up: the stop is under way meanwhile
            raise

    started = asyncio.ensure_future(user.run(slow_to_cancel()))
    assert await asyncio.to_thread(began.wait, 10.0)  # a stop before it began would cancel it cleanly
    stopping = asyncio.ensure_future(user.stop(30.0))
    assert await asyncio.to_thread(entered.wait, 10.0)

    async def late() -> str:
        await asyncio.sleep(1)
        return "late"

    try:
        with pytest.raises(RuntimeError, match="the task's loop has stopped"):
            await asyncio.wait_for(user.run(late()), 5.0)
        with pytest.raises(RuntimeError, match="the task's loop has stopped"):
            await asyncio.wait_for(user.call(lambda: "late"), 5.0)
    finally:
        hold.set()
    assert await asyncio.wait_for(stopping, 10.0)
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(started, 10.0)
    with pytest.raises(RuntimeError, match="the task's loop has stopped"):
        await asyncio.wait_for(user.call(lambda: "after"), 5.0)


async def test_a_sys_exit_in_a_task_user_code_started_fails_the_waiting_calls_and_the_loop_runs_on(
        user: UserLoop) -> None:
    """asyncio re-raises a SystemExit out of the loop: from a task user code started itself (no call's own
    coroutine, which turns it into UserCodeExit) it ended the loop's thread, and every caller waited for ever."""
    failures: list[BaseException] = []
    user.on_failure = failures.append
    go = threading.Event()

    async def background_exit() -> None:
        await asyncio.to_thread(go.wait, 10.0)
        sys.exit(5)

    def starts_a_task() -> None:  # a client's reader task, say
        asyncio.get_running_loop().create_task(background_exit())

    await user.call(starts_a_task)
    began = threading.Event()

    async def waits() -> None:
        began.set()
        await asyncio.sleep(30)

    waiting = asyncio.ensure_future(user.run(waits()))  # a run waiting on the loop
    assert await asyncio.to_thread(began.wait, 10.0)
    go.set()
    with pytest.raises(UserCodeExit, match=r"sys.exit\(5\) in .*background_exit"):
        await asyncio.wait_for(waiting, 10.0)
    assert len(failures) == 1 and isinstance(failures[0], UserCodeExit)
    assert await asyncio.wait_for(user.call(lambda: "still here"), 10.0) == "still here"


async def test_a_stop_that_gave_up_on_blocking_user_code_still_ends_the_thread_once_it_returns() -> None:
    user = UserLoop("test stuck loop")
    release, started = threading.Event(), threading.Event()
    blocked = asyncio.ensure_future(user.call(lambda: (started.set(), release.wait(30.0))))
    assert await asyncio.to_thread(started.wait, 10.0)
    assert not await user.stop(0.2)  # user code holds its loop: the stop gives up, the caller goes on
    release.set()
    await asyncio.wait_for(blocked, 10.0)
    await asyncio.to_thread(user._thread.join, 10.0)
    assert not user._thread.is_alive()  # it ran an empty loop for ever before


async def test_exclusive_parks_the_loop_while_stop_cancels_what_runs_there() -> None:
    """stop() cancels the user tasks, and their clean-up runs on the user loop (a coroutine that catches its cancel
    may go on emitting): a snapshot or flush the task's mailbox makes meanwhile must still find the loop parked. Once
    the loop's thread has ended, `fn` runs at once, also when its park was handed over too late to run."""
    user = UserLoop("test stopping loop")
    steps = 0
    cleaning, finish, began = threading.Event(), threading.Event(), threading.Event()

    async def cleans_up_slowly() -> None:
        nonlocal steps
        try:
            began.set()
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            while not finish.is_set():  # clean-up that keeps stepping (emitting) on the loop
                steps += 1
                if steps == 100:
                    cleaning.set()
                await asyncio.sleep(0)
            raise

    started = asyncio.ensure_future(user.run(cleans_up_slowly()))
    assert await asyncio.to_thread(began.wait, 10.0)
    stopping = asyncio.ensure_future(user.stop(30.0))
    try:
        assert await asyncio.to_thread(cleaning.wait, 10.0)  # stop() began, and the clean-up runs there now

        def snapshot() -> tuple[int, int]:
            before = steps
            time.sleep(0.05)  # an unparked loop steps hundreds of times meanwhile
            return before, steps

        before, after = await asyncio.wait_for(user.exclusive(snapshot), 10.0)
        assert before == after
    finally:
        finish.set()
    assert await asyncio.wait_for(stopping, 10.0)
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(started, 10.0)
    # the loop is ending or has ended: a park handed over now may never run, and must not be waited for
    assert await asyncio.wait_for(user.exclusive(lambda: "after the stop"), 10.0) == "after the stop"
    await asyncio.to_thread(user._thread.join, 10.0)
    assert await asyncio.wait_for(user.exclusive(lambda: "after the end"), 10.0) == "after the end"


async def test_a_run_that_held_the_gil_is_waited_for_blocked_unless_coroutines_wait_on_the_loop(
        user: UserLoop) -> None:
    """UserLoop.call hands a run over as a TaskThread does (runtime/execution/handover.py): after a run that held
    the GIL the next is waited for with the caller's loop blocked; after one that waited (a sleep, I/O), or while
    user coroutines wait on the loop (their completions would run there first), it is awaited."""
    user.sync_wait_s = 30.0  # no timing in this test: every blocked wait gets its run
    on_loop: list[int] = []

    def where(a: int, b: int) -> tuple[int, int]:
        on_loop.append(threading.get_ident())
        return divmod(a, b)

    assert await user.call(where, 7, 2) == (3, 1)  # the first run is waited for blocked
    assert user.waited_blocked == 1 and on_loop == [user.ident]
    with pytest.raises(ZeroDivisionError):  # an error comes back the same way
        await user.call(divmod, 1, 0)
    with pytest.raises(UserCodeExit):  # and sys.exit() in the run fails the run, not the loop
        await user.call(sys.exit, 3)
    assert user.waited_blocked == 3
    await user.call(time.sleep, 0.05)  # waited for blocked, and releases the GIL
    assert not user.held_gil and user.waited_blocked == 4
    assert await user.call(divmod, 9, 4) == (2, 1)  # awaited: the last run released the GIL
    assert user.waited_blocked == 4 and user.held_gil
    # a coroutine handed over by run() waits on the loop (by default what counts; a task counts its records in
    # flight): the run is awaited, though the last one held the GIL
    sleeping = asyncio.ensure_future(user.run(asyncio.sleep(0.2)))
    await asyncio.sleep(0)
    assert user.coroutines_waiting()
    assert await user.call(divmod, 9, 4) == (2, 1)
    assert user.waited_blocked == 4
    await asyncio.wait_for(sleeping, 10.0)
    assert not user.coroutines_waiting()
    assert await user.call(divmod, 9, 4) == (2, 1)
    assert user.waited_blocked == 5
