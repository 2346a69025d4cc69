"""A source and a sink for NATS JetStream, exactly-once across failures.

Source. A JetStream stream is read by stream sequence number. The stream's
subjects are split into partitions `<subject>.0 .. <subject>.<n-1>`; subtask i
of p reads the partitions n with n mod p == i through one pull consumer whose
filter is exactly those subjects, so it sees its messages in stream-sequence
order. Its position is the last stream sequence it handed to the task (one
number per subtask; with the bound below); a restore starts a new consumer at
that sequence + 1, and since a stream is append-only, the messages after it
are the same messages in the same order: replay is exact. Without partitions
the whole `subject` (or the whole stream) is one unit read by subtask 0.
Bounded mode reads up to the stream's last sequence when the job first
starts; that bound is part of the position, so a restored job stops at the
same message. Unbounded mode never ends.

Sink. Records are buffered. A checkpoint's snapshot pre-commits the buffer:
the records, and the message id each will carry, go into the checkpoint. When
the checkpoint completes (`commit`), they are published with the JetStream
`Nats-Msg-Id` header, `<token>-<subtask>-<checkpoint>-<index>`, where the token
is drawn once per opened sink and stored with the batch. A restore from
checkpoint K publishes K's pre-committed batches again under the same ids, and
the stream drops the ones it already has (its duplicate window must cover a
restart). Records after K were never published (nothing after K was
committed, or the restore would be from a later checkpoint), so they are
simply produced again.

nats-py is asyncio; the task loop calls sources and sinks synchronously. Each
source and sink therefore runs its connection on its own event loop in a
thread (`_LoopThread`): the source prefetches into a bounded queue that
`read_batch` drains without waiting, and the sink hands committed batches to
its thread and returns at once. Only `open` (connect) and `close` (drain what
was committed) wait, with deadlines.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import json
import logging
import secrets
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any

from runtime.common import extras
from runtime.common.backoff import RetryWindow
from runtime.connectors.sinks import ForgedSinkState, Sink
from runtime.connectors.source import Source

log = logging.getLogger("sluice.nats")

MSG_ID_HEADER = "Nats-Msg-Id"


class NatsError(RuntimeError):
    """The broker could not be reached, or refused what the connector asked for."""


class MissingDependency(RuntimeError):
    pass


def _nats() -> Any:
    try:
        import nats
        import nats.js.api
    except ImportError as exc:
        raise MissingDependency(extras.describe_missing(["nats"])) from exc
    return nats


# -- pure parts ----------------------------------------------------------------------------------------------


def partition_subjects(subject: str | None, partitions: int | None) -> list[str | None]:
    """Every unit of input in partition order: `<subject>.<n>` per partition, or the one subject (None: the
    whole stream)."""
    if partitions is None:
        return [subject]
    if subject is None:
        raise ValueError("partitions need a subject: partition n is '<subject>.<n>'")
    if partitions < 1:
        raise ValueError("partitions must be >= 1")
    return [f"{subject}.{n}" for n in range(partitions)]


def assigned_subjects(subject: str | None, partitions: int | None, subtask: int,
                      parallelism: int) -> list[str | None]:
    """The units subtask `subtask` of `parallelism` reads: unit n goes to subtask n mod parallelism."""
    return partition_subjects(subject, partitions)[subtask::parallelism]


def message_id(token: str, subtask: int, checkpoint_id: int, index: int) -> str:
    """The id of the `index`-th record pre-committed by `subtask` at `checkpoint_id`: the same on every
    publication of that batch, distinct from every other record's."""
    return f"{token}-{subtask}-{checkpoint_id}-{index}"


def at_end(seq: int, end: int | None, pending_after: int | None = None) -> bool:
    """Has a bounded reader that just got stream sequence `seq` read everything up to `end`? Also true when the
    broker says no message of its subjects follows (`pending_after` == 0), since every message up to `end`
    was already in the stream when the bound was taken."""
    if end is None:
        return False
    return seq >= end or pending_after == 0


def encode_json(record: Any) -> bytes:
    return json.dumps(record, separators=(",", ":"), ensure_ascii=False).encode()


def decode_json(data: bytes) -> Any:
    value = json.loads(data)
    return tuple(value) if isinstance(value, list) else value  # as JsonLinesSource: arrays become tuples


def _acknowledged(future: concurrent.futures.Future[Any]) -> bool:
    return future.done() and not future.cancelled() and future.exception() is None


# -- the connection thread -----------------------------------------------------------------------------------


class _LoopThread:
    """An asyncio loop in a daemon thread, owning one NATS connection."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()
        self.nc: Any = None
        self.js: Any = None
        self.last_error: Exception | None = None
        self._logged: tuple[str, float] = ("", 0.0)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def submit(self, coro: Coroutine[Any, Any, Any]) -> concurrent.futures.Future[Any]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def call(self, coro: Coroutine[Any, Any, Any], timeout_s: float) -> Any:
        future = self.submit(coro)
        try:
            return future.result(timeout_s)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise NatsError(f"no answer from NATS within {timeout_s:g}s") from None

    def connect(self, url: str, *, name: str, timeout_s: float) -> None:
        nats = _nats()

        async def connect() -> None:
            # reconnects go on forever (a broker restart is waited out); the first connect has a deadline
            self.nc = await nats.connect(servers=[url], name=name, connect_timeout=timeout_s,
                                         max_reconnect_attempts=-1, reconnect_time_wait=0.2,
                                         error_cb=self._on_error)
            self.js = self.nc.jetstream()

        try:
            self.call(connect(), timeout_s)
        except Exception as exc:
            cause = self.last_error or exc
            raise NatsError(f"cannot connect to NATS at {url}: {str(cause) or type(cause).__name__}") from None

    async def _on_error(self, exc: Exception) -> None:
        """One line per distinct error every few seconds, instead of nats-py's traceback per attempt."""
        self.last_error = exc
        now = time.monotonic()
        if str(exc) != self._logged[0] or now - self._logged[1] > 5.0:
            self._logged = (str(exc), now)
            log.warning("nats: %s", str(exc) or type(exc).__name__)

    def stop(self, timeout_s: float = 5.0) -> None:
        async def shutdown() -> None:
            # the owner has stopped its own coroutines; closing the connection ends nats-py's tasks
            if self.nc is not None and not self.nc.is_closed:
                await self.nc.close()

        if self.thread.is_alive():
            try:
                self.call(shutdown(), timeout_s)
            except Exception as exc:  # closing must not hide the task's own outcome
                log.warning("nats: error while closing: %s", exc)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout_s)
        if not self.thread.is_alive():
            self.loop.close()


# -- source --------------------------------------------------------------------------------------------------


class NatsSource(Source):
    """Reads JetStream stream `stream` by sequence number (see the module docstring).

    `subject`/`partitions` name the input: partitions n = 0..partitions-1 are the subjects `<subject>.<n>`,
    split over the subtasks; without partitions, `subject` (None: every subject of the stream) is read by
    subtask 0 alone. `bounded=True` stops at the stream's last message when the job starts.
    """

    # what subtask i of p reads depends only on i, p and its position: restored at another parallelism, each
    # old subtask's consumer is moved whole to one new subtask (connectors/splits.py)
    subtask_splits = True
    extras = ("nats",)

    def __init__(self, url: str, stream: str, *, subject: str | None = None, partitions: int | None = None,
                 bounded: bool = True, deserializer: Callable[[bytes], Any] = decode_json,
                 fetch_batch: int = 512, max_buffered: int = 8192, connect_timeout_s: float = 10.0,
                 retry_s: float = 30.0) -> None:
        partition_subjects(subject, partitions)  # validates
        self.url = url
        self.stream = stream
        self.subject = subject
        self.partitions = partitions
        self.bounded = bounded
        self.deserializer = deserializer
        self.fetch_batch = fetch_batch
        self.max_buffered = max_buffered
        self.connect_timeout_s = connect_timeout_s
        self.retry_s = retry_s

    def open(self, subtask_index: int, parallelism: int) -> None:
        super().open(subtask_index, parallelism)
        self._subjects = assigned_subjects(self.subject, self.partitions, subtask_index, parallelism)
        self._buffer: collections.deque[tuple[int, Any]] = collections.deque()
        self._position = 0  # the last stream sequence handed to the task
        self._fetched = 0  # the last stream sequence put in the buffer
        self._end: int | None = None
        self._done = False
        self._error: BaseException | None = None
        self._fetcher: concurrent.futures.Future[Any] | None = None
        self._stopping = False  # nats-py's fetch can swallow a cancel: the loop also checks this
        self._fetch_task: asyncio.Task[Any] | None = None
        self._thread: _LoopThread | None = None
        if not self._subjects:
            self._done = True  # more subtasks than partitions: this one has nothing to read
            return
        self._thread = _LoopThread(f"nats-source-{subtask_index}")
        self._thread.connect(self.url, name=f"sluice-source-{self.stream}-{subtask_index}",
                             timeout_s=self.connect_timeout_s)
        if self.bounded:
            self._end = self._thread.call(self._last_sequence(), self.connect_timeout_s)

    async def _last_sequence(self) -> int:
        assert self._thread is not None
        try:
            info = await self._thread.js.stream_info(self.stream)
        except Exception as exc:
            raise NatsError(f"cannot read stream {self.stream!r}: {str(exc) or type(exc).__name__}") from exc
        return int(info.state.last_seq)

    def position(self) -> Any:
        return [self._position, self._end, self._subjects]

    def restore(self, position: Any) -> None:
        if len(position) > 2 and list(position[2]) != self._subjects:
            # one sequence covers all of a subtask's partitions: it cannot be split over another parallelism
            raise NatsError(f"restored position of stream {self.stream!r} is for subjects {position[2]}, but "
                            f"this subtask reads {self._subjects}: restore a NatsSource with the parallelism "
                            f"and partitions it was checkpointed with")
        self._stop_fetcher()
        self._position = self._fetched = int(position[0])
        self._end = None if position[1] is None else int(position[1])
        self._buffer.clear()
        self._done = not self._subjects or (self._end is not None and self._position >= self._end)

    def read_batch(self, max_records: int) -> list[Any] | None:
        if self._error is not None:
            raise NatsError(f"reading stream {self.stream!r}: {self._error}") from self._error
        done = self._done  # read before draining: the fetcher fills the buffer, then sets done
        if self._fetcher is None and not done:
            assert self._thread is not None
            self._fetcher = self._thread.submit(self._fetch_loop())
            self._fetcher.add_done_callback(self._fetcher_ended)
        buffer = self._buffer
        n = min(max_records, len(buffer))
        if n == 0:
            return None if done else []
        out = []
        seq = self._position
        for _ in range(n):
            seq, value = buffer.popleft()
            out.append(value)
        self._position = seq
        return out

    def idle_wait_s(self) -> float:
        return 0.005

    def _fetcher_ended(self, future: concurrent.futures.Future[Any]) -> None:
        if not future.cancelled() and future.exception() is not None:
            self._error = future.exception()

    async def _fetch_loop(self) -> None:
        """Fill the buffer from a consumer starting after the last fetched sequence; on a broken consumer or
        connection, start a new one there, until `retry_s` of failures in a row (a fetch that finds nothing,
        or a pause while the task is backpressured, is no failure; the consumer may have been dropped as idle
        during such a pause, and a new one continues where the old one stopped)."""
        nats = _nats()
        self._fetch_task = asyncio.current_task()
        retry = RetryWindow(self.retry_s)
        while not self._stopping:
            sub = None
            try:
                sub = await self._subscribe(self._fetched + 1)
                while not self._stopping:
                    if await self._fetch_once(sub, nats):
                        self._done = True
                        return
                    retry.succeeded()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if self._stopping:
                    return
                if not retry.failed(time.monotonic()):
                    raise NatsError(f"failing for {self.retry_s:g}s: {str(exc) or type(exc).__name__}") from exc
                log.warning("nats source %s/%s: %s; resubscribing at %d", self.stream, self.subtask_index,
                            str(exc) or type(exc).__name__, self._fetched + 1)
                await asyncio.sleep(0.2)
            finally:
                if sub is not None:
                    await self._unsubscribe(sub)

    async def _subscribe(self, start_seq: int) -> Any:
        nats = _nats()
        api = nats.js.api
        assert self._thread is not None
        subjects = [s for s in self._subjects if s is not None]
        config = api.ConsumerConfig(
            deliver_policy=api.DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=start_seq,
            ack_policy=api.AckPolicy.NONE, inactive_threshold=30.0, mem_storage=True,
            filter_subjects=subjects if len(subjects) > 1 else None)
        self._consumer_seq = 0
        # one subject: the consumer's filter; several: filter_subjects; none: the whole stream (empty filter)
        return await self._thread.js.pull_subscribe(subjects[0] if len(subjects) == 1 else "", stream=self.stream,
                                                    config=config)

    async def _unsubscribe(self, sub: Any) -> None:
        assert self._thread is not None
        try:
            await asyncio.wait_for(sub.unsubscribe(), 1.0)
            await asyncio.wait_for(self._thread.js.delete_consumer(self.stream, sub._consumer), 1.0)
        except (Exception, asyncio.CancelledError):  # the consumer goes away by itself after inactive_threshold
            pass

    async def _fetch_once(self, sub: Any, nats: Any) -> bool:
        """One fetch into the buffer; true at the end of a bounded input."""
        if len(self._buffer) >= self.max_buffered:
            await asyncio.sleep(0.002)
            return False
        try:
            msgs = await sub.fetch(self.fetch_batch, timeout=0.5)
        except (nats.errors.TimeoutError, TimeoutError):  # nothing new within the fetch's wait
            if self._end is None:
                return False
            info = await sub.consumer_info()
            return int(info.num_pending) == 0
        for msg in msgs:
            meta = msg.metadata
            seq = meta.sequence.stream
            if meta.sequence.consumer != self._consumer_seq + 1:
                if meta.sequence.consumer <= self._consumer_seq:
                    continue  # a late delivery of an earlier fetch
                raise NatsError(f"consumer skipped from {self._consumer_seq} to {meta.sequence.consumer}")
            self._consumer_seq = meta.sequence.consumer
            if seq <= self._fetched:
                continue
            if self._end is not None and seq > self._end:
                return True
            self._buffer.append((seq, self.deserializer(msg.data)))
            self._fetched = seq
            if at_end(seq, self._end, meta.num_pending):
                return True
        return False

    def _stop_fetcher(self) -> None:
        if self._fetcher is not None:
            self._stopping = True
            task, thread = self._fetch_task, self._thread
            if task is not None and thread is not None:
                thread.loop.call_soon_threadsafe(task.cancel)  # not the future's cancel: that returns at once
            try:
                self._fetcher.result(5)
            except BaseException:  # cancelled, or the error it had already
                pass
            self._fetcher = None
            self._stopping = False

    def close(self) -> None:
        if not hasattr(self, "_subjects"):
            return  # never opened (a restored task at its end does not read)
        self._stop_fetcher()
        if self._thread is not None:
            self._thread.stop()
            self._thread = None


# -- sink ----------------------------------------------------------------------------------------------------


class NatsSink(Sink):
    """Publishes records to JetStream, exactly once per checkpoint (see the module docstring).

    `subject` is a subject, or a function of the record that returns one (to partition the output). The
    stream that holds the subjects must have a `duplicate_window` longer than a restart takes.
    """

    extras = ("nats",)

    def __init__(self, url: str, subject: str | Callable[[Any], str], *,
                 serializer: Callable[[Any], bytes] = encode_json, id_prefix: str = "sluice",
                 connect_timeout_s: float = 10.0, close_timeout_s: float = 60.0, cancel_wait_s: float = 2.0,
                 publish_retries: int = 20, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.url = url
        self.subject = subject
        self.serializer = serializer
        self.id_prefix = id_prefix
        self.connect_timeout_s = connect_timeout_s
        self.close_timeout_s = close_timeout_s
        self.cancel_wait_s = cancel_wait_s
        self.publish_retries = publish_retries

    def open(self, subtask_index: int, parallelism: int, attempt: int) -> None:
        super().open(subtask_index, parallelism, attempt)
        # new per opened sink, so batches of different runs never share ids (checkpoint ids can repeat
        # across submissions); a batch keeps the token it was pre-committed with
        self._token = f"{self.id_prefix}-{secrets.token_hex(6)}"
        self._buffer: list[list[Any]] = []  # [subject, payload] since the last snapshot
        self._pending: list[list[Any]] = []  # [checkpoint id, token, items], pre-committed
        # committed batches handed to the thread, until the stream acknowledged all of their messages: until
        # then they stay in every snapshot, so a restore from a later checkpoint still publishes them
        self._publishing: list[tuple[concurrent.futures.Future[Any], list[Any]]] = []
        self._finished = False
        self._error: BaseException | None = None
        self._thread = _LoopThread(f"nats-sink-{subtask_index}")
        self._thread.connect(self.url, name=f"sluice-sink-{subtask_index}", timeout_s=self.connect_timeout_s)
        self._lock = self._thread.call(self._make_lock(), self.connect_timeout_s)
        self.published = 0
        self.duplicates = 0

    @staticmethod
    async def _make_lock() -> asyncio.Lock:
        return asyncio.Lock()  # created on the thread's loop, which it serves

    def _check(self) -> None:
        if self._error is not None:
            raise NatsError(f"publishing to NATS: {self._error}") from self._error

    def write(self, record: Any) -> None:
        subject = self.subject if isinstance(self.subject, str) else self.subject(record)
        self._buffer.append([subject, self.serializer(record)])

    def snapshot_state(self, checkpoint_id: int) -> Any:
        self._check()
        if self._buffer:
            self._pending = [*self._pending, [checkpoint_id, self._token, self._buffer]]
            self._buffer = []
        self._publishing = [(f, e) for f, e in self._publishing if not _acknowledged(f)]
        return {"pending": [e for _, e in self._publishing] + self._pending, "checkpoint": checkpoint_id}

    def commit(self, checkpoint_id: int) -> None:
        self._check()
        due = [p for p in self._pending if p[0] <= checkpoint_id]
        self._pending = [p for p in self._pending if p[0] > checkpoint_id]
        for entry in due:
            self._publish_later(entry)

    def restore_state(self, state: Any) -> None:
        # the restored checkpoint completed: its batches are published (again); the stream drops the ids it has
        pending = (state or {}).get("pending", [])
        for entry in pending:  # every batch checked before any is published
            self._check_restored(entry)
        for entry in pending:
            self._publish_later(entry)

    def _check_restored(self, entry: Any) -> None:
        """A restored batch is [checkpoint id, token, [[subject, payload bytes], ...]], and with a fixed subject
        every message goes to that subject: a forged checkpoint must not publish elsewhere (ForgedSinkState)."""
        try:
            checkpoint_id, token, items = entry
            shaped = type(checkpoint_id) is int and isinstance(token, str) and all(
                isinstance(subject, str) and isinstance(payload, bytes) for subject, payload in items)
            foreign = isinstance(self.subject, str) and any(subject != self.subject for subject, _ in items)
        except (TypeError, ValueError):
            shaped, foreign = False, False
        if not shaped or foreign:
            raise ForgedSinkState(f"NatsSink {self.subtask_index}: the restored state holds a batch that is not one "
                                  "this sink pre-committed (malformed, or for another subject): refused")

    def _publish_later(self, entry: list[Any]) -> None:
        self._publishing = [(f, e) for f, e in self._publishing if not _acknowledged(f)]
        future = self._thread.submit(self._publish(entry))
        future.add_done_callback(self._published)
        self._publishing.append((future, entry))

    def finish(self) -> None:
        self._finished = True

    def _published(self, future: concurrent.futures.Future[Any]) -> None:
        if not future.cancelled() and future.exception() is not None and self._error is None:
            self._error = future.exception()

    async def _publish(self, entry: list[Any]) -> None:
        checkpoint_id, token, items = entry
        js = self._thread.js
        async with self._lock:  # FIFO: batches go out in commit order
            todo = list(range(len(items)))
            for attempt in range(self.publish_retries + 1):
                sent = []
                for i in todo:
                    subject, payload = items[i]
                    headers = {MSG_ID_HEADER: message_id(token, self.subtask_index, checkpoint_id, i)}
                    sent.append((i, await js.publish_async(subject, payload, headers=headers)))
                acks = await asyncio.gather(*(f for _, f in sent), return_exceptions=True)
                failed = [(i, a) for (i, _), a in zip(sent, acks, strict=True) if isinstance(a, BaseException)]
                self.published += len(sent) - len(failed)
                self.duplicates += sum(1 for a in acks if not isinstance(a, BaseException) and a.duplicate)
                if not failed:
                    return
                todo = [i for i, _ in failed]
                log.warning("nats sink %d: %d of checkpoint %d's messages not acknowledged (%s); retrying",
                            self.subtask_index, len(todo), checkpoint_id, failed[0][1])
                await asyncio.sleep(min(0.1 * 2**attempt, 2.0))
            raise NatsError(f"{len(todo)} messages of checkpoint {checkpoint_id} not acknowledged: {failed[0][1]}")

    def close(self) -> None:
        """At the end of a bounded input, waits (up to close_timeout_s) until the stream has acknowledged every
        committed batch, so a FINISHED job's output is all there. After a cancel or failure it waits at most
        cancel_wait_s, never holding the worker's loop for long: what is not acknowledged yet is in the
        checkpoint the restore starts from, and is published again then. Uncommitted records are dropped:
        the restore produces them again."""
        if not hasattr(self, "_thread"):
            return  # never opened
        self.wait_published(self.close_timeout_s if self._finished else self.cancel_wait_s)
        self._publishing = []
        self._thread.stop()

    def wait_published(self, timeout_s: float) -> bool:
        """Wait until the stream has acknowledged every committed batch; false (and one log line) if not."""
        deadline = time.monotonic() + timeout_s
        for future, _ in self._publishing:
            try:
                future.result(max(0.0, deadline - time.monotonic()))
            except Exception as exc:
                log.warning("nats sink %d: committed batch not acknowledged within %gs: %s", self.subtask_index,
                            timeout_s, str(exc) or type(exc).__name__)
                return False
        return True
