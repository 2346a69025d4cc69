"""KafkaSink: exactly-once (transactions committed with the checkpoint), at-least-once or no guarantee.

Exactly-once. aiokafka (like every Python client) cannot resume a transaction another producer pre-committed,
which is how Flink's KafkaSink commits after a recovery. So a checkpoint's records are the pre-commit: the
snapshot puts them into the checkpoint (the sink's state), and when the checkpoint completes they are produced
in one transaction that also commits the checkpoint id as the offset of a consumer group named after the sink
and subtask (send_offsets_to_transaction: atomic with the records). A recovery reads that group's offset and
produces only the restored batches whose checkpoint did not reach the topic (kafka_core.batches_to_produce);
a transaction whose outcome is unknown (the broker went away during the commit) is decided the same way.
The transactional id is stable (prefix + subtask), so a restarted producer fences its predecessor and aborts
what it had open; after a scale-down the ids of the subtasks that are gone are fenced too. Consumers in
read_committed see each checkpoint's records at once, when it completes.

At-least-once: records are sent as they come (idempotent producer, acks=all) and every snapshot waits until
the broker acknowledged all of them. None: sent as they come, nothing waited for.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import secrets
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from runtime.common.backoff import RetryWindow
from runtime.connectors import kafka_core as core
from runtime.connectors.kafka_client import (
    KafkaError,
    LoopThread,
    aiokafka,
    broker_facts,
    connect_checked,
    describe,
    log,
    retriable,
)
from runtime.connectors.sinks import ForgedSinkState, Sink

if TYPE_CHECKING:
    from runtime.connectors.submit import SubmitContext

DELIVERIES = ("exactly-once", "at-least-once", "none")
SEND_AHEAD = 2000  # at-least-once/none: records handed to the producer thread in chunks of this many


def _done(future: concurrent.futures.Future[Any]) -> bool:
    return future.done() and not future.cancelled() and future.exception() is None


class KafkaSink(Sink):
    """Writes records to `topic` (or a function of the record returning the topic; then `marker_topic` names
    an existing topic whose partition 0 carries the exactly-once commit markers). `key`, `partition`,
    `headers`, `timestamp`: functions of the record (key: bytes, str or anything str() turns into the key;
    headers: a list of (name, bytes); timestamp: the record's CreateTime in epoch ms, None for now).
    `serializer`: "json", "msgpack", "raw" or a function of the record returning bytes (None: a tombstone, a
    record with no value)."""

    extras = ("kafka",)

    def __init__(self, bootstrap_servers: str, topic: str | Callable[[Any], str], *,
                 delivery: str = "exactly-once", transactional_id_prefix: str | None = None,
                 key: Callable[[Any], Any] | None = None, partition: Callable[[Any], int] | None = None,
                 headers: Callable[[Any], list[tuple[str, bytes]]] | None = None,
                 timestamp: Callable[[Any], int | None] | None = None,
                 serializer: str | Callable[[Any], bytes | None] = "json", marker_topic: str | None = None,
                 transaction_timeout_ms: int = 60_000, connect_timeout_s: float = 10.0,
                 close_timeout_s: float = 60.0, cancel_wait_s: float = 2.0, retry_s: float = 120.0,
                 client_options: dict[str, Any] | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if delivery not in DELIVERIES:
            raise ValueError(f"delivery must be one of {', '.join(DELIVERIES)}, got {delivery!r}")
        if delivery == "exactly-once" and not transactional_id_prefix:
            raise ValueError("KafkaSink(delivery='exactly-once') needs a transactional_id_prefix, unique to this "
                             "sink of this job (its transactional ids and commit-marker groups are named after it)")
        if isinstance(serializer, str) and serializer not in core.SERIALIZERS:
            raise ValueError(f"serializer must be one of {sorted(core.SERIALIZERS)} or a function, got {serializer!r}")
        if not isinstance(topic, str) and delivery == "exactly-once" and marker_topic is None:
            raise ValueError("a KafkaSink whose topic is a function needs marker_topic (an existing topic) for "
                             "its exactly-once commit markers")
        self.bootstrap_servers = bootstrap_servers
        self.topic = topic
        self.delivery = delivery
        self.transactional_id_prefix = transactional_id_prefix
        self.key = key
        self.partition = partition
        self.headers = headers
        self.timestamp = timestamp
        self.serializer = serializer
        self.marker_topic = marker_topic or (topic if isinstance(topic, str) else None)
        self.transaction_timeout_ms = transaction_timeout_ms
        self.connect_timeout_s = connect_timeout_s
        self.close_timeout_s = close_timeout_s
        self.cancel_wait_s = cancel_wait_s
        self.retry_s = retry_s
        self.client_options = dict(client_options or {})

    def check_at_submit(self, context: SubmitContext) -> None:
        """Refuse the job now, in one line: the broker cannot be reached, the topic is missing, or (exactly
        once) the transaction timeout does not fit the checkpoint interval or the broker's maximum."""
        topics, max_ms = broker_facts(self.bootstrap_servers, self.connect_timeout_s)
        for topic in (self.topic, self.marker_topic):
            if isinstance(topic, str) and topic not in topics:
                raise KafkaError(f"KafkaSink: topic {topic!r} not found at {self.bootstrap_servers}")
        if self.delivery == "exactly-once":
            core.check_transaction_timeout(self.transaction_timeout_ms, max_ms, context.checkpoint_interval_s,
                                           topic=str(self.topic))

    # -- lifecycle -------------------------------------------------------------------------------------------

    def open(self, subtask_index: int, parallelism: int, attempt: int) -> None:
        super().open(subtask_index, parallelism, attempt)
        self._encode = core.SERIALIZERS[self.serializer] if isinstance(self.serializer, str) else self.serializer
        # drawn once per job run and kept through restores (restore_state), so commit markers of an earlier
        # submission of the same sink (checkpoint ids start again at 1) are never taken for this run's
        self._token = secrets.token_hex(6)
        # [topic, partition, key, value, headers, timestamp] since the last snapshot
        self._buffer: list[list[Any]] = []
        self._pending: list[list[Any]] = []  # [checkpoint id, subtask, token, items]: pre-committed
        # committed batches handed to the thread, until their transaction committed: they stay in every
        # snapshot until then, so a restore from a later checkpoint still produces (or skips) them
        self._producing: list[tuple[concurrent.futures.Future[Any], list[Any]]] = []
        self._sends: list[concurrent.futures.Future[Any]] = []  # at-least-once/none
        self._recovery: concurrent.futures.Future[Any] | None = None
        self._finished = False
        self._error: BaseException | None = None
        self._producer: Any = None
        self._admin: Any = None
        self.transactions = 0
        self.produced = 0
        self.replayed = 0
        self.skipped_on_recovery = 0
        self._open_since: float | None = None  # the transaction in progress (for the open-transaction age)
        self._thread = LoopThread(f"kafka-sink-{subtask_index}")
        self._lock = self._thread.call(self._make_lock(), 5, "starting")
        self._thread.call(self._connect(), self.connect_timeout_s + 5, f"connecting to {self.bootstrap_servers}")

    @staticmethod
    async def _make_lock() -> asyncio.Lock:
        return asyncio.Lock()  # created on the thread's loop, which it serves

    def _producer_options(self, transactional_id: str | None) -> dict[str, Any]:
        options: dict[str, Any] = {"bootstrap_servers": self.bootstrap_servers, "linger_ms": 5,
                                   "client_id": f"sluice-sink-{self.subtask_index}", **self.client_options}
        if self.delivery == "exactly-once":
            options.update(transactional_id=transactional_id, enable_idempotence=True,
                           transaction_timeout_ms=self.transaction_timeout_ms)
        elif self.delivery == "at-least-once":
            options.update(acks="all", enable_idempotence=True)
        else:
            options.update(acks=1)
        return options

    async def _connect(self) -> None:
        kafka = aiokafka()
        tid = (core.transactional_id(str(self.transactional_id_prefix), self.subtask_index)
               if self.delivery == "exactly-once" else None)
        producer = kafka.AIOKafkaProducer(**self._producer_options(tid))
        try:
            # starting a transactional producer fences the previous one with the id and aborts its open txn
            await connect_checked(producer.start(), self.bootstrap_servers, self.connect_timeout_s)
        except BaseException:
            await producer.stop()
            raise
        self._producer = producer
        if self.delivery == "exactly-once":
            admin = kafka.admin.AIOKafkaAdminClient(bootstrap_servers=self.bootstrap_servers,
                                                    client_id=f"sluice-sink-admin-{self.subtask_index}")
            await connect_checked(admin.start(), self.bootstrap_servers, self.connect_timeout_s)
            self._admin = admin

    def close(self) -> None:
        """At the end of a bounded input, waits (up to close_timeout_s) until every committed batch's
        transaction committed, so a FINISHED job's output is all there; after a cancel or failure at most
        cancel_wait_s: what is not committed yet is in the checkpoint a restore starts from."""
        if not hasattr(self, "_thread"):
            return  # never opened
        self.wait_committed(self.close_timeout_s if self._finished else self.cancel_wait_s)
        self._producing = []

        async def closing() -> None:
            if self._producer is not None:
                await self._producer.stop()
            if self._admin is not None:
                await self._admin.close()

        self._thread.stop(closing(), timeout_s=10.0)

    def wait_committed(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        recovery = [self._recovery] if self._recovery is not None else []
        for future in recovery + [f for f, _ in self._producing] + self._sends:
            try:
                future.result(max(0.0, deadline - time.monotonic()))
            except Exception as exc:
                log.warning("kafka sink %d: not committed within %gs: %s", self.subtask_index, timeout_s,
                            describe(exc))
                return False
        return True

    def finish(self) -> None:
        self._finished = True
        if self.delivery != "exactly-once":
            self._send_buffer()

    def _check(self) -> None:
        if self._error is not None:
            raise KafkaError(f"producing to Kafka: {describe(self._error)}") from self._error

    # -- records ---------------------------------------------------------------------------------------------

    def write(self, record: Any) -> None:
        topic = self.topic if isinstance(self.topic, str) else self.topic(record)
        self._buffer.append([topic, self.partition(record) if self.partition else None,
                             core.encode_key(self.key(record)) if self.key else None, self._encode(record),
                             list(self.headers(record)) if self.headers else None,
                             self.timestamp(record) if self.timestamp else None])
        if self.delivery != "exactly-once" and len(self._buffer) >= SEND_AHEAD:
            self._send_buffer()

    # -- at-least-once / none --------------------------------------------------------------------------------

    def _send_buffer(self) -> None:
        self._check()
        if not self._buffer:
            return
        items, self._buffer = self._buffer, []
        self._sends = [f for f in self._sends if not _done(f)]
        future = self._thread.submit(self._send(items))
        future.add_done_callback(self._failed)
        self._sends.append(future)

    async def _send(self, items: list[list[Any]]) -> None:
        async with self._lock:  # in order
            futures = [await self._producer.send(t, value=v, key=k, partition=p, headers=h,
                                                 timestamp_ms=ts[0] if ts else None)
                       for t, p, k, v, h, *ts in items]  # (a pending batch of an older snapshot has no ts)
            if self.delivery == "at-least-once":
                await asyncio.gather(*futures)
            self.produced += len(items)

    def _failed(self, future: concurrent.futures.Future[Any]) -> None:
        if not future.cancelled() and future.exception() is not None and self._error is None:
            self._error = future.exception()

    # -- two-phase commit ------------------------------------------------------------------------------------

    def snapshot_state(self, checkpoint_id: int) -> Any:
        self._check()
        if self.delivery != "exactly-once":
            self._send_buffer()
            if self.delivery == "at-least-once" and not self.wait_committed(self.retry_s):
                self._check()
                raise KafkaError(f"records not acknowledged by Kafka within {self.retry_s:g}s")
            return None
        if self._buffer:
            self._pending = [*self._pending, [checkpoint_id, self.subtask_index, self._token, self._buffer]]
            self._buffer = []
        self._producing = [(f, e) for f, e in self._producing if not _done(f)]
        return {"pending": [e for _, e in self._producing] + self._pending, "checkpoint": checkpoint_id,
                "token": self._token}

    def commit(self, checkpoint_id: int) -> None:
        self._check()
        due = [p for p in self._pending if p[0] <= checkpoint_id]
        self._pending = [p for p in self._pending if p[0] > checkpoint_id]
        for entry in due:
            self._produce_later(entry)

    def restore_state(self, state: Any) -> None:
        """The restored checkpoint completed: its batches are produced unless their commit marker says they
        reached the topic; subtasks that a scale-down removed are fenced."""
        if self.delivery != "exactly-once" or not state:
            return
        pending = list(state.get("pending", []))
        for entry in pending:  # every batch checked before any is produced
            self._check_restored(entry)
        own = [e for e in pending if int(e[1]) == self.subtask_index]
        # the token of this subtask's group: the state's (not rescaled), else that of the batches this subtask
        # wrote before a rescale (its old subtask's batches always come to it), so one group never holds
        # batches of two tokens; a subtask without either starts a token of its own (its group has nothing
        # of this run pending)
        if state.get("token"):
            self._token = state["token"]
        elif own:
            self._token = own[-1][2]
        gone = [j for j in state.get("subtasks", []) if j != self.subtask_index and j >= self.parallelism]
        future = self._thread.submit(self._recover(pending, gone))
        future.add_done_callback(self._failed)
        self._recovery = future
        # the batches it may produce stay in the snapshots until it is done
        self._producing = [(future, entry) for entry in pending]

    def _check_restored(self, entry: Any) -> None:
        """A restored batch is [checkpoint id, subtask, token, records], and with a fixed topic every record goes
        to that topic: a forged checkpoint must not produce elsewhere (ForgedSinkState)."""
        try:
            checkpoint_id, subtask, token, records = entry
            shaped = type(checkpoint_id) is int and type(subtask) is int and isinstance(token, str) and all(
                isinstance(r[0], str) for r in records)
            foreign = isinstance(self.topic, str) and any(r[0] != self.topic for r in records)
        except (TypeError, ValueError, IndexError):
            shaped, foreign = False, False
        if not shaped or foreign:
            raise ForgedSinkState(f"KafkaSink {self.subtask_index}: the restored state holds a batch that is not "
                                  "one this sink pre-committed (malformed, or for another topic): refused")

    async def _recover(self, pending: list[list[Any]], gone: list[int]) -> None:
        async with self._lock:
            for j in gone:  # a transaction a removed subtask had open would hold read_committed readers back
                await self._fence(core.transactional_id(str(self.transactional_id_prefix), j))
            markers = {s: await self._marker(s) for s in sorted({int(e[1]) for e in pending})}
            todo = core.batches_to_produce(pending, markers)
            self.skipped_on_recovery += len(pending) - len(todo)
            for entry in todo:
                await self._transaction(entry)
                self.replayed += 1

    async def _fence(self, transactional_id: str) -> None:
        kafka = aiokafka()
        producer = kafka.AIOKafkaProducer(**self._producer_options(transactional_id))
        try:
            await connect_checked(producer.start(), self.bootstrap_servers, self.connect_timeout_s)
        finally:
            await producer.stop()

    async def _marker(self, subtask: int) -> tuple[int, str | None] | None:
        group = core.sink_group(str(self.transactional_id_prefix), subtask)
        offsets = await self._admin.list_consumer_group_offsets(group)
        for tp, meta in offsets.items():
            if tp.topic == self.marker_topic and tp.partition == 0 and meta.offset >= 0:
                return int(meta.offset), core.marker_token(meta.metadata)
        return None

    def _produce_later(self, entry: list[Any]) -> None:
        self._producing = [(f, e) for f, e in self._producing if not _done(f)]
        future = self._thread.submit(self._commit_entry(entry))
        future.add_done_callback(self._failed)
        self._producing.append((future, entry))

    async def _commit_entry(self, entry: list[Any]) -> None:
        async with self._lock:  # FIFO: transactions in checkpoint order, so markers only go up
            await self._transaction(entry)

    async def _transaction(self, entry: list[Any]) -> None:
        """Produce one pre-committed batch and its marker in one transaction; on a failure, ask the marker
        whether it committed (a lost answer to the commit) and retry with a new producer if not."""
        kafka = aiokafka()
        checkpoint_id, subtask, token, items = int(entry[0]), int(entry[1]), entry[2], entry[3]
        group = core.sink_group(str(self.transactional_id_prefix), subtask)
        marker = {kafka.TopicPartition(self.marker_topic, 0):
                  kafka.structs.OffsetAndMetadata(checkpoint_id, core.marker_metadata(token))}
        retry = RetryWindow(self.retry_s)
        while True:
            try:
                self._open_since = time.monotonic()
                async with self._producer.transaction():
                    futures = [await self._producer.send(t, value=v, key=k, partition=p, headers=h,
                                                         timestamp_ms=ts[0] if ts else None)
                               for t, p, k, v, h, *ts in items]  # (a pending batch of an older snapshot has no ts)
                    await asyncio.gather(*futures)
                    await self._producer.send_offsets_to_transaction(marker, group)
                self._open_since = None
                self.transactions += 1
                self.produced += len(items)
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._open_since = None
                if not retry.failed(time.monotonic()) or not (retriable(exc) or _recoverable(exc)):
                    raise KafkaError(f"transaction of checkpoint {checkpoint_id} failed: {describe(exc)}") from exc
                log.warning("kafka sink %d: transaction of checkpoint %d: %s; retrying", self.subtask_index,
                            checkpoint_id, describe(exc))
                await asyncio.sleep(0.5)
                try:
                    await self._restart_producer()
                    found = await self._marker(subtask)
                except Exception as again:
                    log.warning("kafka sink %d: %s", self.subtask_index, describe(again))
                    continue
                if found is not None and found[1] == token and found[0] >= checkpoint_id:
                    self.transactions += 1  # the commit went through; only its answer was lost
                    self.produced += len(items)
                    return

    async def _restart_producer(self) -> None:
        """A new producer with the same id: fences the old one and aborts whatever it had open."""
        kafka = aiokafka()
        old, self._producer = self._producer, None
        if old is not None:
            try:
                await asyncio.wait_for(old.stop(), 5)
            except Exception:
                pass
        tid = core.transactional_id(str(self.transactional_id_prefix), self.subtask_index)
        producer = kafka.AIOKafkaProducer(**self._producer_options(tid))
        try:
            await connect_checked(producer.start(), self.bootstrap_servers, self.connect_timeout_s)
        except BaseException:
            await producer.stop()
            self._producer = kafka.AIOKafkaProducer(**self._producer_options(tid))  # started on the next retry
            raise
        self._producer = producer

    def open_transaction_age_s(self) -> float:
        since = self._open_since
        return 0.0 if since is None else time.monotonic() - since


def _recoverable(exc: BaseException) -> bool:
    """Errors a new producer gets past: the broker forgot our producer (restarted, timed the transaction
    out) or aiokafka gave up on a request."""
    name = type(exc).__name__
    return name in {"KafkaTimeoutError", "KafkaConnectionError", "NodeNotReadyError", "RequestTimedOutError",
                    "NotCoordinatorError", "CoordinatorNotAvailableError", "CoordinatorLoadInProgressError",
                    "InvalidProducerEpoch", "UnknownProducerIdError", "InvalidTxnStateError",
                    "OutOfOrderSequenceNumber", "IllegalStateError", "ConcurrentTransactions"} \
        or isinstance(exc, (OSError, asyncio.TimeoutError))
