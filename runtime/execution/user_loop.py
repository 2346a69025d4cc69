"""A task's `async def` user code on an event loop of its own, on a thread of its own.

The worker's event loop runs every task's mailbox, the data links, credit, RPC and heartbeats. An `async def`
user function (an async_map function, an AsyncKeyedProcessFunction) that blocks inside (a `time.sleep`, a
synchronous client), or a plain function chained with it, would stop all of them if it ran there. So a task
with an asynchronous operator runs its whole chain, the operator included, on a `UserLoop`: a private asyncio
loop on a thread named after the task (like the `TaskThread` of runtime/execution/isolation.py).

- `run(coroutine)`, awaited on the worker's loop, runs the coroutine as a task on the user loop and returns
  its result (or raises its exception). Cancelling the awaiting task (a timeout, the task ending) cancels the
  user task too; a user task cancelled by its own code cancels the awaiting one.
- `call(fn, *args)` runs a plain function (a run of the chain) in a callback of the user loop, handed over as
  a TaskThread hands over its calls (runtime/execution/handover.py): waited for with the worker's loop blocked,
  up to `sync_wait_s`, after a run that held the GIL while no user coroutine waits on the loop; else awaited.
- `exclusive(fn, *args)`, awaited on the worker's loop, parks the user loop (a callback there waits) and runs
  `fn(*args)` on the worker's loop meanwhile: how the task's mailbox, snapshots and flushes touch the chain;
  also while `stop()` cancels what runs there, until the loop's thread has ended. `parked()` holds the park
  around a block that also hands user calls to the parked callback (`Park.call`: a sink's pre-commit or commit),
  which runs them on the loop's thread: awaited, so a blocking one holds up its own task only.
- A tick every TICK_S tells the worker's `CallWatchdog` (runtime/execution/user_code.py) that the loop is
  not stuck: a user loop that has not ticked for the slow-call threshold is reported like a slow call, with
  the function on its thread's stack.

A blocked user loop delays only its own task's calls: the worker's loop, other tasks and this task's
checkpoints (its operator snapshots the records in flight at once) go on.

Every call accepted is answered: a call made once `stop()` began is refused at once; a `sys.exit()` that
escapes user code the loop runs (a task user code started itself) fails the calls waiting then and is
reported (`on_failure`), and the loop runs on; calls still waiting when the loop's thread ends fail.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import functools
import queue
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any

from runtime.execution.handover import HandedCall
from runtime.execution.isolation import IsolationSettings
from runtime.execution.user_code import UserCodeExit

TICK_S = 0.1  # how often the user loop says it is alive (the watchdog's threshold is seconds)


class UserLoop:
    """One task's private event loop on its own daemon thread (see the module docstring)."""

    def __init__(self, name: str, *, settings: IsolationSettings = IsolationSettings()) -> None:
        self.name = name
        self.sync_wait_s = settings.sync_wait_s  # how long the worker's loop waits, blocked, for a run (`call`)
        self.held_gil = True  # whether the last run held the GIL
        self.runs = 0  # runs handed over (`call`)
        self.waited_blocked = 0  # runs the worker's loop waited for blocked, and got (for tests and benchmarks)
        # whether user coroutines wait on the loop (its task sets it: records its asynchronous operator has in
        # flight); by default, those handed over by `run` and not answered yet
        self.coroutines_waiting: Callable[[], bool] = lambda: bool(self._pending)
        self.loop = _new_event_loop()
        self.ticks = 0  # with `seen`, tells one stall from the next (the watchdog reports each once)
        self.seen = time.monotonic()  # when the loop last ticked
        self.ident = 0  # the thread's, once it runs (the watchdog reads its stack by it)
        self._home: asyncio.AbstractEventLoop | None = None  # the worker's loop, which awaits the calls
        # calls handed over and outcomes handed back, each drained by one wake-up of the loop it goes to: with
        # many calls in flight, one thread hand-off serves several (deque's append and popleft are atomic)
        self._inbox: collections.deque[tuple[Coroutine[Any, Any, Any], asyncio.Future[Any],
                                             list[asyncio.Task[Any]]]] = collections.deque()
        self._inbox_posted = False
        self._outbox: collections.deque[tuple[asyncio.Future[Any], asyncio.Task[Any]]] = collections.deque()
        self._outbox_posted = False
        self._stopped = False  # stop() began: a call made now would not be answered (nothing would start it)
        self._closed = False  # the loop's thread ended
        self._ended_cleanly = False  # stop() saw every task of the loop end (the thread ends right after)
        # the shutdown the first stop() handed to the loop: a later stop() waits for it, not for a second one, which
        # could land on the loop after the first had stopped it and never run
        self._shutdown: concurrent.futures.Future[None] | None = None
        # the callers' futures of the calls accepted and not answered yet (touched on the worker's loop only)
        self._pending: set[asyncio.Future[Any]] = set()
        self._parks: set[asyncio.Future[None]] = set()  # exclusive() waiting for its park (the worker's loop only)
        # a sys.exit() escaped user code on the loop (not from a call's own coroutine): called on the worker's loop
        self.on_failure: Callable[[BaseException], None] = lambda error: None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        self.ident = threading.get_ident()
        loop = self.loop
        asyncio.set_event_loop(loop)
        loop.call_soon(self._tick)
        try:
            while True:
                try:
                    loop.run_forever()
                    break
                except (SystemExit, KeyboardInterrupt) as exc:
                    # asyncio re-raises these out of the loop: from a task user code started on its own (a call's
                    # coroutine turns its sys.exit into UserCodeExit), it would end the thread and leave every
                    # caller waiting. The task fails instead, and the loop runs on for its close.
                    self._post_home(self._user_code_exited, UserCodeExit.of(exc))
        finally:
            loop.close()
            self._post_home(self._ended)

    def _post_home(self, fn: Callable[..., None], *args: Any) -> None:
        home = self._home
        if home is None:  # no call was ever made: nobody waits
            return
        try:
            home.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the worker's loop closed (the worker is stopping): nobody waits
            pass

    def _user_code_exited(self, error: UserCodeExit) -> None:
        """On the worker's loop: fail the calls waiting now (the exit may be what they wait for), report it."""
        self._fail_pending(error)
        self.on_failure(error)

    def _ended(self) -> None:
        """On the worker's loop: the loop's thread ended; calls still waiting can no longer be answered."""
        self._closed = True
        for parked in self._parks:  # handed over as the loop stopped, never run: nothing can run there now
            _resolve(parked)
        self._fail_pending(RuntimeError(f"{self.name}: the task's loop has stopped"))
        while self._inbox:
            coroutine, _, _ = self._inbox.popleft()
            coroutine.close()

    def _fail_pending(self, error: BaseException) -> None:
        for done in list(self._pending):
            if not done.done():
                done.set_exception(error)

    def _tick(self) -> None:
        self.seen = time.monotonic()
        self.ticks += 1
        self.loop.call_later(TICK_S, self._tick)

    def running_since(self) -> float | None:
        """The last time the loop was seen running (time.monotonic()); None once it stopped (its ticks ended with
        it: a stopped loop is not a stuck one). Read from any thread."""
        if self._ended_cleanly or not self._thread.is_alive():
            return None
        return self.seen

    # -- the worker's loop awaits user code -------------------------------------------------------------

    async def run(self, awaitable: Awaitable[Any]) -> Any:
        """Run `awaitable` (a coroutine) on the user loop and return its result; awaited on the worker's loop."""
        coroutine = awaitable if asyncio.iscoroutine(awaitable) else _awaited(awaitable)
        if self._stopped or self._closed:  # stop() began: nothing would start it, nothing would answer
            coroutine.close()
            raise RuntimeError(f"{self.name}: the task's loop has stopped")
        home = self._home
        if home is None:
            home = self._home = asyncio.get_running_loop()
        done: asyncio.Future[Any] = home.create_future()
        box: list[asyncio.Task[Any]] = []
        self._pending.add(done)
        self._inbox.append((coroutine, done, box))
        if not self._inbox_posted:  # one wake-up of the user loop for every call handed over meanwhile
            self._inbox_posted = True
            try:
                self.loop.call_soon_threadsafe(self._take_inbox)
            except RuntimeError:  # the user loop is closed (the task is ending): the call cannot run
                self._pending.discard(done)
                self._inbox.clear()
                coroutine.close()
                raise RuntimeError(f"{self.name}: the task's loop has stopped") from None
        try:
            return await done
        except asyncio.CancelledError:
            if not done.done() or done.cancelled():
                self._cancel_soon(box)
            raise
        finally:
            self._pending.discard(done)

    def _take_inbox(self) -> None:
        """On the user loop: start the user tasks handed over."""
        self._inbox_posted = False  # before taking: a call handed over from now on posts again
        inbox = self._inbox
        while inbox:
            coroutine, done, box = inbox.popleft()
            if done.cancelled():  # read across threads: at worst the task starts and is cancelled at once
                coroutine.close()
                continue
            task = self.loop.create_task(_exit_fails_the_call(coroutine))
            box.append(task)
            task.add_done_callback(functools.partial(self._finished, done))

    def _finished(self, done: asyncio.Future[Any], task: asyncio.Task[Any]) -> None:
        """On the user loop: a user task ended; its outcome goes back to the worker's loop, with the others that
        end before that loop takes them (one wake-up)."""
        self._outbox.append((done, task))
        if not self._outbox_posted:
            self._outbox_posted = True
            home = self._home
            assert home is not None
            try:
                home.call_soon_threadsafe(self._take_outbox)
            except RuntimeError:  # the worker's loop closed (the worker is stopping): nobody waits
                pass

    def _take_outbox(self) -> None:
        """On the worker's loop: settle the callers' futures as their user tasks ended."""
        self._outbox_posted = False
        outbox = self._outbox
        while outbox:
            done, task = outbox.popleft()
            _settle(done, task)

    def _cancel_soon(self, box: list[asyncio.Task[Any]]) -> None:
        def cancel() -> None:
            for task in box:
                task.cancel()

        try:
            self.loop.call_soon_threadsafe(cancel)
        except RuntimeError:
            pass

    async def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """`fn(*args)` (a plain function: a run of a task's chain) in a callback of the user loop, as a TaskThread
        runs its calls (runtime/execution/handover.py): waited for with the worker's loop blocked, up to
        `sync_wait_s`, when the last run held the GIL and no user coroutine waits on the loop (`coroutines_waiting`:
        their I/O completions would run there ahead of this run, which the worker's loop would wait through);
        else awaited."""
        if self._stopped or self._closed:  # stop() began: nothing would run it, nothing would answer
            raise RuntimeError(f"{self.name}: the task's loop has stopped")
        home = asyncio.get_running_loop()
        if self._home is None:
            self._home = home
        call = HandedCall(fn, args, home)
        try:
            self.loop.call_soon_threadsafe(self._execute, call)
        except RuntimeError:  # the user loop is closed (the task is ending): the call cannot run
            raise RuntimeError(f"{self.name}: the task's loop has stopped") from None
        blocked = self.held_gil and self.sync_wait_s > 0 and not self.coroutines_waiting()
        self.runs += 1
        try:
            return await call.wait(self.sync_wait_s if blocked else 0.0, self._pending)
        finally:
            if call.blocked:
                self.waited_blocked += 1

    def _execute(self, call: HandedCall) -> None:
        """On the user loop: a run handed over by `call` (not one its caller gave up on before it began)."""
        if not call.abandoned():
            call.execute(self)

    def ran(self) -> None:
        """On the user loop, after a call (runtime/execution/handover.py): nothing to note, `call` counts the runs."""

    async def exclusive(self, fn: Callable[..., Any], *args: Any) -> Any:
        """`fn(*args)` here, on the worker's loop, while the user loop is parked: it waits in a callback of its own
        until `fn` returns, so nothing of the task's runs there meanwhile (a snapshot, a flush of the outputs).
        Awaited: a user loop stuck in a user call delays only this, not the worker's loop.

        Also once `stop()` began, for as long as the loop runs: the user tasks it cancels run their clean-up there
        (a coroutine that catches its cancel may still emit, or return a result its operator emits), and a stop
        that gave up on blocking user code leaves that code to go on once it returns. Only a closed loop lets
        `fn` run unparked; a park handed over as the loop stops, too late to run, is released by `_ended`."""
        async with self.parked():
            return fn(*args)

    @contextlib.asynccontextmanager
    async def parked(self) -> AsyncIterator[Park]:
        """The user loop parked for as long as the block runs (see `exclusive`); `Park.call` runs user code on the
        loop's thread meanwhile (a sink's pre-commit or commit), which the block awaits: the loop stays parked
        around it, so none of the task's records runs there in between."""
        if self._closed:  # the loop's thread ended: nothing runs there any more, the caller has it to itself
            yield Park(self, None)
            return
        home = asyncio.get_running_loop()
        if self._home is None:
            self._home = home  # where `_ended` is posted
        parked: asyncio.Future[None] = home.create_future()
        park = Park(self, home)

        def hold() -> None:
            park.holding = True  # before the caller hears it parked: its calls come here from then on
            home.call_soon_threadsafe(_resolve, parked)
            park.serve()

        try:
            self.loop.call_soon_threadsafe(hold)
        except RuntimeError:  # the user loop closed meanwhile
            yield Park(self, None)
            return
        self._parks.add(parked)
        try:
            await parked
            yield park
        finally:
            self._parks.discard(parked)
            park.release()  # also when cancelled before it parked: the park then passes straight through

    # -- the end ----------------------------------------------------------------------------------------

    async def stop(self, timeout_s: float | None = 10.0) -> bool:
        """Cancel the user tasks still running, wait for them, and end the loop and its thread. False when the
        loop did not come back within `timeout_s` (None: no limit; user code blocking it: the daemon thread is
        left behind)."""
        self._stopped = True
        if self.loop.is_closed():
            return True

        async def shut() -> None:
            # every task of the loop: the calls, and what user code started on its own (a client's reader)
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            # the loop ends itself, right after this task's end is handed back (a stop now would skip that): also
            # when user code held it past `timeout_s` and the caller gave up, whose thread would otherwise run an
            # empty loop for ever once that code returned
            asyncio.get_running_loop().call_soon(asyncio.get_running_loop().stop)

        if self._shutdown is None:
            try:
                self._shutdown = asyncio.run_coroutine_threadsafe(shut(), self.loop)
            except RuntimeError:
                return True
        stopped = self._shutdown
        try:
            async with asyncio.timeout(timeout_s):
                # shielded: giving up on the wait must not cancel the stop itself (see shut)
                await asyncio.shield(asyncio.wrap_future(stopped))
        except TimeoutError:
            return False
        except Exception:  # a user task that swallowed its cancel and failed: the loop still ends
            pass
        self._ended_cleanly = True
        return True


class Park:
    """A user loop held in a callback of its own (`UserLoop.parked`), which runs the calls handed to it there, on
    the loop's thread, one at a time, until released: user calls a task's mail deferred (a sink's pre-commit or
    commit), awaited, and no runs (runtime/execution/handover.py). `home` None: the loop has ended, calls run on
    the caller's."""

    def __init__(self, user: UserLoop, home: asyncio.AbstractEventLoop | None) -> None:
        self._user = user
        self._home = home
        self._calls: queue.SimpleQueue[HandedCall | None] = queue.SimpleQueue()  # None releases the park
        self.holding = False  # its callback runs on the loop's thread (set there): calls are served

    async def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """`fn(*args)` on the parked loop's thread, awaited (the worker's loop runs on while it takes)."""
        if not self.holding or self._home is None:  # the loop ended before it parked: nothing else runs there
            return fn(*args)
        call = HandedCall(fn, args, self._home, run=False)
        self._calls.put(call)
        return await call.wait(0.0)

    def serve(self) -> None:
        """On the loop's thread: run the calls handed over until released."""
        while (call := self._calls.get()) is not None:
            call.execute(self._user)

    def release(self) -> None:
        self._calls.put(None)


def _new_event_loop() -> asyncio.AbstractEventLoop:
    """The worker's kind of loop (netstack/transport.py `run`): the user's clients do their I/O on this one."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


async def _awaited(awaitable: Awaitable[Any]) -> Any:
    return await awaitable


async def _exit_fails_the_call(coroutine: Coroutine[Any, Any, Any]) -> Any:
    """sys.exit() in user code fails its call (its task), not the loop: asyncio re-raises a SystemExit out of
    the loop, which would end the loop's thread and leave every caller waiting."""
    try:
        return await coroutine
    except SystemExit as exc:
        raise UserCodeExit.of(exc) from exc


def _settle(target: asyncio.Future[Any], source: asyncio.Future[Any]) -> None:
    """Give `target` (this loop's) the outcome of `source` (the other loop's, done), unless it was settled already."""
    if target.done():
        return
    if source.cancelled():
        target.cancel()
    elif source.exception() is not None:
        target.set_exception(source.exception())  # type: ignore[arg-type]
    else:
        target.set_result(source.result())
