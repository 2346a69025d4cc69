"""Async I/O in a chain (`stream.async_map`): calls in flight, checkpointed as input.

`AsyncIOOperator` drives the pure queue of runtime/execution/async_io_queue.py. The chain hands it lists of
records (`feed`); they wait in an admission queue and enter the ordering queue while it has room. Each admitted
record's call runs as an asyncio task, with its timeout and retries, on the loop the operator lives on: with
the rest of its task's chain, the task's own (runtime/execution/user_loop.py), so a blocking call there stalls
only that task, never the worker; a finished call
reports its result to the queue, and what may leave then goes into the rest of the chain in one list, soon
after (`call_soon`), never inside the chain's own call. The task sees a non-empty admission queue (`backlog`)
and takes no input until it empties, serving its mailbox meanwhile: at `capacity` calls the upstream channels
run out of credit (backpressure), and input waits at `capacity` records plus at most one chunk.

For the task it looks like the asynchronous keyed state operator (runtime/execution/async_operator.py): the
same `backlog`, `bind`, `finish`, `snapshot` and `restore`, always in capture mode. A snapshot is taken at once
(it never waits for a slow call, so an unaligned barrier passes at once): the queue's records not emitted yet,
then the admission queue, are the operator's in-flight document in the task's state file, and a restore adds
them first, before restored channel state and new input. Each record's output therefore reaches the output
exactly once; its call may be made again after a failure.

Rescaling: a document is cut by key group (keyed variant) or dealt round robin by the restore plan
(runtime/checkpointing/rescaling.py); watermarks are kept only when the task restores its own document as it
was written (another subtask's watermark says nothing about this subtask's records).
"""

from __future__ import annotations

import asyncio
import bisect
import inspect
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from runtime.api.async_io import AsyncMap
from runtime.execution.async_io_queue import NO_KEY, AsyncIOQueue, Mark, Start
from runtime.execution.user_code import UserCodeExit
from runtime.graph.partitioning import key_group, key_group_range
from runtime.state.backend import PendingSnapshot, StateBackendError
from runtime.state.codec import hashable

FORMAT = 1
KIND = "io"  # the in-flight document's kind, beside the asynchronous state operator's documents
LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


@dataclass
class AsyncIOStatistics:
    """Counters for metrics (runtime/worker/metrics.py): read at scrape time, kept as plain numbers."""

    completed: int = 0  # calls that succeeded (after retries)
    timed_out: int = 0  # attempts that ran over the timeout
    retried: int = 0  # attempts after the first
    failed: int = 0  # calls that failed for good (each fails the task)
    captured: int = 0  # records checkpoints captured for replay, over all
    latency_buckets: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BUCKETS_S) + 1))
    latency_sum_s: float = 0.0

    def observe(self, latency_s: float) -> None:
        self.latency_buckets[bisect.bisect_left(LATENCY_BUCKETS_S, latency_s)] += 1
        self.latency_sum_s += latency_s


class AsyncIOFailed(RuntimeError):
    """A call failed for good (after its retries): the task fails and the job restarts from its checkpoint."""


class AsyncIOOperator:
    drain = False  # always capture: a checkpoint never waits for calls in flight

    def __init__(self, spec: AsyncMap, *, node_id: int, name: str, key_fn: Callable[[Any], Any] | None,
                 subtask_index: int, parallelism: int, max_parallelism: int, timed: bool,
                 emit: Callable[[list[Any]], None], forward_watermark: Callable[[int], None]) -> None:
        self.spec = spec
        self._closed = False  # the function's close() was called
        self._closing = False  # aclose() began: no call starts any more
        self.node_id = node_id
        self.name = name
        self._key_fn = key_fn
        self._timed = timed
        self._subtask = subtask_index
        self._parallelism = parallelism
        self._max_parallelism = max_parallelism
        self._emit = emit
        self._forward_watermark = forward_watermark
        self._queue = AsyncIOQueue(spec.capacity, ordered=spec.ordered)
        self._admission: deque[Any] = deque()  # records and Marks handed over, not yet in the queue
        self._calls: set[asyncio.Task[None]] = set()
        self._flush_posted = False
        self._error: BaseException | None = None
        self._wake: Callable[[], None] = lambda: None
        self._on_failure: Callable[[BaseException], None] = lambda e: None
        self._idle: asyncio.Event | None = None  # set while nothing is queued (finish waits on it)
        self.stats = AsyncIOStatistics()
        self.blocked_s = 0.0  # time the task waited for admission (Task accounts it)
        self.last_captured_records = 0

    def bind(self, *, wake: Callable[[], None], on_failure: Callable[[BaseException], None]) -> None:
        """The task's wake-up (admission progress) and how a failed call fails the task."""
        self._wake = wake
        self._on_failure = on_failure

    def run_on(self, loop: asyncio.AbstractEventLoop) -> None:
        """Live on `loop`, the task's own, with the rest of the chain: nothing to rebind (calls start on the
        running loop)."""

    # -- what the chain calls ----------------------------------------------------------------------

    def feed(self, records: list[Any]) -> None:
        self._admission.extend(records)
        self.pump()

    def feed_watermark(self, timestamp: int) -> None:
        self._admission.append(Mark(timestamp))
        self.pump()

    def pump(self) -> None:
        """Admit what waits while the queue has room; start the calls it allows."""
        admission, queue = self._admission, self._queue
        if self._error is not None:
            return
        key_fn, timed = self._key_fn, self._timed
        marked = False
        while admission:
            item = admission[0]
            if item.__class__ is Mark:
                queue.add_watermark(item.timestamp)
                marked = True
            elif not queue.has_room():
                break
            elif key_fn is None:
                self._start(queue.add(item))
            else:
                self._start(queue.add(item, hashable(key_fn(item[1] if timed else item))))
            admission.popleft()
        if marked:
            self._post_flush()  # a watermark admitted behind finished records may leave at once
        elif queue.empty() and not admission:
            self._set_idle()

    # -- what the task asks ------------------------------------------------------------------------

    @property
    def backlog(self) -> bool:
        """Input handed over but not admitted: the task takes no more until it is."""
        return bool(self._admission)

    @property
    def in_flight(self) -> int:
        return self._queue.in_flight

    @property
    def captured_records(self) -> int:
        return self.stats.captured

    def quiet(self) -> bool:
        return not self._admission and self._queue.empty()

    def raise_if_failed(self) -> None:
        if self._error is not None:
            raise self._error

    # -- calls -------------------------------------------------------------------------------------

    def _start(self, starts: list[Start]) -> None:
        if self._closing:  # aclose took the calls to cancel: one started now would run on after the close
            return
        loop = asyncio.get_running_loop()
        for s in starts:
            task = loop.create_task(self._call(s.seq, s.record))
            self._calls.add(task)
            task.add_done_callback(self._calls.discard)

    async def _call(self, seq: int, record: Any) -> None:
        spec, stats, retry = self.spec, self.stats, self.spec.retry
        value = record[1] if self._timed else record
        started = time.monotonic()
        attempt = 1
        while True:
            limit = asyncio.timeout(spec.timeout_s)  # None: no limit
            try:
                async with limit:
                    result = await spec.fn(value)
                break
            except TimeoutError as e:
                error: BaseException = e
                if limit.expired():
                    stats.timed_out += 1
                    give_up = attempt >= retry.max_attempts  # our timeout is always worth a retry while any are left
                else:  # the function's own TimeoutError (its client's timeout): like any exception it raises
                    give_up = not retry.retries(e, attempt)
            except asyncio.CancelledError as e:
                if asyncio.current_task().cancelling():  # type: ignore[union-attr]  # aclose(): the task ends
                    raise
                # the function's own code was cancelled (a future it awaited, a client closed under it): not
                # a retry's business, and ending this call without a result would leave the queue waiting
                error, give_up = e, True
            except Exception as e:
                error = e
                give_up = not retry.retries(e, attempt)
            except SystemExit as e:  # the task fails with the function named; out of its task, it ended the loop
                error, give_up = UserCodeExit.of(e), True
            if give_up:
                stats.failed += 1
                what = (f"timed out (timeout_s={spec.timeout_s})" if limit.expired()
                        else f"failed: {type(error).__name__}: {error}")
                self._fail(AsyncIOFailed(f"{self.name}: a call {what} after {attempt} attempt(s) "
                                         f"(record {value!r})"), error)
                return
            await asyncio.sleep(retry.backoff_s(attempt))
            attempt += 1
            stats.retried += 1
        stats.completed += 1
        stats.observe(time.monotonic() - started)
        if self._error is not None:
            return
        self._start(self._queue.complete(seq, (record[0], result) if self._timed else result))
        self._post_flush()

    def _post_flush(self) -> None:
        # soon, not now: the chain must not be entered from inside its own call (feed -> pump -> here)
        if not self._flush_posted:
            self._flush_posted = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        """Hand on what may leave (runs of results as one list, watermarks between), then admit more."""
        self._flush_posted = False
        if self._error is not None or self._closing:  # closing: the chain is closed next, maybe on another thread
            return
        ready = self._queue.take_ready()
        try:
            run: list[Any] = []
            for item in ready:
                if item.__class__ is Mark:
                    if run:
                        self._emit(run)
                        run = []
                    self._forward_watermark(item.timestamp)
                else:
                    run.append(item)
            if run:
                self._emit(run)
        except Exception as e:  # an operator after this one failed: the task fails (not the loop's handler)
            self._fail(e, e)
            return
        if ready or self._admission:
            self.pump()
            self._wake()
        elif self._queue.empty():
            self._set_idle()

    def _fail(self, error: BaseException, cause: BaseException) -> None:
        if self._error is None:
            error.__cause__ = cause
            self._error = error
            self._on_failure(error)
            self._wake()
            self._set_idle()  # finish() raises instead of waiting

    def _set_idle(self) -> None:
        if self._idle is not None:
            self._idle.set()

    # -- life cycle --------------------------------------------------------------------------------

    async def open(self) -> None:
        self.pump()  # restored records start now, on the task's loop

    async def finish(self) -> None:
        """End of input, nothing left in admission: wait until every call finished and its output left."""
        while not self._queue.empty() and self._error is None:
            self._idle = asyncio.Event()
            self._post_flush()
            await self._idle.wait()
        self.raise_if_failed()

    async def aclose(self) -> None:
        """The task ends (finished, failed or cancelled): cancel the calls still running, wait for them, then
        close the function once (its `close()`, plain or `async def`, where it has one: the clients, pools and
        threads it opened go with the task instead of at garbage collection). No call starts from now on."""
        self._closing = True
        for task in list(self._calls):
            task.cancel()
        await asyncio.gather(*self._calls, return_exceptions=True)
        close = getattr(self.spec.fn, "close", None)
        if close is None or self._closed:
            return
        self._closed = True
        await _close(close)

    # -- checkpoints -------------------------------------------------------------------------------

    def snapshot(self, checkpoint_id: int) -> tuple[PendingSnapshot | None, dict[str, Any]]:
        """The synchronous part: what has not left yet, in arrival order, as the in-flight document."""
        replay: list[list[Any]] = []
        for e in self._queue.snapshot():
            replay.append(["w", e.timestamp] if isinstance(e, Mark) else
                          ["r", None if e[0] is NO_KEY else e[0], e[1]])
        for item in self._admission:
            if item.__class__ is Mark:
                replay.append(["w", item.timestamp])
            else:
                replay.append(["r", self._key_of(item), item])
        self.last_captured_records = sum(1 for e in replay if e[0] == "r")
        self.stats.captured += self.last_captured_records
        return None, {"format": FORMAT, "kind": KIND, "keyed": self._key_fn is not None,
                      "subtask": self._subtask, "parallelism": self._parallelism, "replay": replay}

    def _key_of(self, record: Any) -> Any:
        if self._key_fn is None:
            return None
        return hashable(self._key_fn(record[1] if self._timed else record))

    def restore(self, docs: list[dict[str, Any]]) -> None:
        """Before any input: the records (and, restoring its own document, the watermarks) to call first."""
        own = (len(docs) == 1 and docs[0].get("subtask") == self._subtask
               and docs[0].get("parallelism") == self._parallelism)
        groups = key_group_range(self._max_parallelism, self._parallelism, self._subtask)
        replay: list[Any] = []
        for doc in docs:
            for item in decode_replay(doc, f"async I/O of operator {self.node_id}"):
                if isinstance(item, Mark):
                    if own:
                        replay.append(item)
                elif own or self._key_fn is None or key_group(item[0], self._max_parallelism) in groups:
                    replay.append(item[1])
        self._admission.extendleft(reversed(replay))


def is_io_document(doc: dict[str, Any]) -> bool:
    return doc.get("kind") == KIND


def decode_replay(doc: dict[str, Any], origin: str) -> list[tuple[Any, Any] | Mark]:
    """An in-flight document's replay list: (key, record) pairs and Marks. Raises StateBackendError when it
    does not decode."""
    try:
        if doc.get("format") != FORMAT or doc.get("kind") != KIND:
            raise ValueError(f"format {doc.get('format')!r} of kind {doc.get('kind')!r}")
        out: list[tuple[Any, Any] | Mark] = []
        for item in doc["replay"]:
            if item[0] == "r":
                out.append((hashable(item[1]), item[2]))
            elif item[0] == "w":
                out.append(Mark(int(item[1])))
            else:
                raise ValueError(f"replay element of kind {item[0]!r}")
        return out
    except (ValueError, KeyError, TypeError, IndexError) as e:
        raise StateBackendError(f"{origin}: in-flight document does not decode: {e}") from e


async def _close(close: Callable[[], Any]) -> None:
    result = close()
    if inspect.isawaitable(result):
        await result
