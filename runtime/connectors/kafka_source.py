"""KafkaSource: partitions as splits, offsets in every checkpoint, exact restore at any parallelism.

Each subtask reads the partitions it owns (kafka_core.owner: stable as partitions are added, so a subtask
claims a new partition on its own) through one consumer with a manual assignment: no group rebalances, the
checkpoint is the truth. A thread prefetches into one buffer per partition; `read_batch` hands out records
of one partition at a time, and `position()` (taken by the task before each batch) names that partition,
so the checkpointed "position + records of the next batch already emitted" is exact (kafka_core's module
docstring). On a rescale, kafka_core.redistribute deals every partition with its offset to its owner at the
new parallelism.

The group's offsets are committed when a checkpoint completes, for lag monitoring only; a restore uses the
checkpoint. read_committed by default: a Sluice job reading another's exactly-once output sees only
committed records.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import itertools
import re
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from runtime.api.functions import OutputTag
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
)
from runtime.connectors.kafka_core import KafkaRecord, MalformedKafkaRecord
from runtime.connectors.source import SideOutputBatch, Source

if TYPE_CHECKING:
    from runtime.connectors.submit import SubmitContext

TP = tuple[str, int]


class MalformedRecord(KafkaError):
    """The deserializer failed on a record: names where it is."""


# where a KafkaSource with on_malformed="side-output" sends the records it cannot read (MalformedKafkaRecord)
MALFORMED_KAFKA_RECORDS = OutputTag("kafka-malformed-records")


class KafkaSource(Source):
    """Reads Kafka topics (a list, or `topic_pattern`, a regular expression matched as partitions appear).

    `start`: "earliest", "latest", "committed" (the group's offsets, else earliest), {"timestamp_ms": t}, or
    explicit offsets {(topic, partition): offset}; where a partition starts when no checkpoint knows it (one
    discovered while running starts at its earliest). `bounded=True` stops at the end offsets found when the
    job first starts. `deserializer`: "json", "msgpack", "raw", "key_value", or a function of a KafkaRecord
    (key, value, headers, timestamp, topic/partition/offset). A record it cannot read fails the task naming
    topic/partition/offset (`on_malformed="fail"`); with `on_malformed="side-output"` it goes instead, as a
    MalformedKafkaRecord (topic, partition, offset, timestamp_ms, key, value, headers, error), to the source's
    side output `MALFORMED_KAFKA_RECORDS` (`stream.side_output(MALFORMED_KAFKA_RECORDS)`); or a function of
    (KafkaRecord, exception) returns the record to emit instead, None to drop it. Exactly once either way.
    """

    rescalable = True  # restored at another parallelism: its partitions are dealt anew (redistribute below)
    redistributes_positions = True
    extras = ("kafka",)

    def __init__(self, bootstrap_servers: str, topics: Sequence[str] | str | None = None, *,
                 group_id: str | None = None, start: Any = "earliest", bounded: bool = False,
                 deserializer: str | Callable[[KafkaRecord], Any] = "json",
                 on_malformed: str | Callable[[KafkaRecord, BaseException], Any] = "fail",
                 topic_pattern: str | None = None, isolation_level: str = "read_committed",
                 discovery_interval_s: float | None = 10.0, commit_offsets: bool = True,
                 max_buffered: int = 20_000, connect_timeout_s: float = 10.0, retry_s: float = 120.0,
                 client_options: dict[str, Any] | None = None) -> None:
        if isinstance(topics, str):
            topics = [topics]
        if not topics and topic_pattern is None:
            raise ValueError("KafkaSource needs topics or a topic_pattern")
        if isinstance(deserializer, str) and deserializer not in core.DESERIALIZERS:
            raise ValueError(f"deserializer must be one of {sorted(core.DESERIALIZERS)} or a function, "
                             f"got {deserializer!r}")
        if not callable(on_malformed) and on_malformed not in core.ON_MALFORMED:
            raise ValueError(f"on_malformed must be one of {list(core.ON_MALFORMED)} or a function, "
                             f"got {on_malformed!r}")
        if isolation_level not in ("read_committed", "read_uncommitted"):
            raise ValueError(f"isolation_level must be read_committed or read_uncommitted, got {isolation_level!r}")
        self.bootstrap_servers = bootstrap_servers
        self.topics = list(topics or [])
        self.topic_pattern = topic_pattern
        self.group_id = group_id
        self.start = core.parse_start(start)
        self.bounded = bounded
        self.deserializer = deserializer
        self.on_malformed = on_malformed
        self.isolation_level = isolation_level
        self.discovery_interval_s = discovery_interval_s
        self.commit_offsets = commit_offsets
        self.max_buffered = max_buffered
        self.connect_timeout_s = connect_timeout_s
        self.retry_s = retry_s
        self.client_options = dict(client_options or {})

    redistribute = staticmethod(core.redistribute)

    def check_at_submit(self, context: SubmitContext) -> None:
        """Refuse the job now, in one line, when the broker cannot be reached or a named topic is missing."""
        topics, _ = broker_facts(self.bootstrap_servers, self.connect_timeout_s)
        missing = sorted(set(self.topics) - topics)
        if missing:
            raise KafkaError(f"KafkaSource: topic(s) {missing} not found at {self.bootstrap_servers}")

    # -- lifecycle -------------------------------------------------------------------------------------------

    def open(self, subtask_index: int, parallelism: int) -> None:
        super().open(subtask_index, parallelism)
        self._decode = (core.DESERIALIZERS[self.deserializer] if isinstance(self.deserializer, str)
                        else self.deserializer)
        self._pattern = re.compile(self.topic_pattern) if self.topic_pattern else None
        self._lock = threading.Lock()  # buffers + fetch positions, shared with the fetch thread
        self._buffers: dict[TP, collections.deque[Any]] = {}
        self._fetched: dict[TP, int] = {}  # the consumer's position: next offset to fetch
        self._next: dict[TP, int] = {}  # the next offset to hand to the task
        self._end: dict[TP, int | None] = {}
        self._skip: dict[TP, int] = {}
        self._known: set[TP] | None = None
        self._batch_from: TP | None = None
        self._last_read: TP | None = None
        self._assignment_changed = True
        self._error: BaseException | None = None
        self._stopping = False
        self._fetcher: concurrent.futures.Future[Any] | None = None
        self._fetch_task: asyncio.Task[Any] | None = None
        self.records_read: dict[TP, int] = {}
        self._opened_at = time.monotonic()
        self._last_record_at: dict[TP, float] = {}
        self.end_offsets: dict[TP, int] = {}  # the broker's, refreshed by the fetch thread (for lag)
        self._thread = LoopThread(f"kafka-source-{subtask_index}")
        self._consumer: Any = None
        self._committer: Any = None
        self._committer_parts: set[TP] = set()
        self._commits: set[concurrent.futures.Future[Any]] = set()  # offset commits not answered yet
        self._commit_lock = asyncio.Lock()  # used on the client thread's loop only
        self._thread.call(self._connect(), self.connect_timeout_s + 5, f"connecting to {self.bootstrap_servers}")
        # where each partition starts when the job starts now; a restore replaces it
        self._thread.call(self._initial_assignment(), self.connect_timeout_s + 5, "reading partitions")

    async def _connect(self) -> None:
        kafka = aiokafka()
        # no group on the fetching consumer: with a group, aiokafka's coordinator routine fails on assignment
        # changes; offsets go to the group through a second consumer that never fetches (_group_consumer)
        self._consumer = kafka.AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap_servers, group_id=None, enable_auto_commit=False,
            isolation_level=self.isolation_level, auto_offset_reset="earliest",
            client_id=f"sluice-source-{self.subtask_index}", **self.client_options)
        try:
            await connect_checked(self._consumer.start(), self.bootstrap_servers, self.connect_timeout_s)
        except BaseException:
            await self._consumer.stop()
            self._consumer = None
            raise

    async def _partitions(self) -> list[TP]:
        """Every partition of the source's topics the broker has now."""
        cluster = await self._consumer._client.fetch_all_metadata()
        topics = (sorted(t for t in cluster.topics() if self._pattern.fullmatch(t)) if self._pattern
                  else self.topics)
        out = []
        for topic in topics:
            parts = cluster.partitions_for_topic(topic)
            if parts:
                out += [(topic, int(p)) for p in parts]
        return sorted(out)

    async def _initial_assignment(self) -> None:
        partitions = await self._partitions()
        missing = [t for t in self.topics if not any(tp[0] == t for tp in partitions)]
        if missing and not self._pattern:
            raise KafkaError(f"topic(s) {missing} not found at {self.bootstrap_servers}")
        mine = core.assigned(partitions, self.subtask_index, self.parallelism)
        offsets = await self._start_offsets(mine, self.start)
        ends = await self._broker_ends(mine) if self.bounded else {}
        for tp in mine:
            self._add(tp, offsets[tp], ends.get(tp))

    async def _start_offsets(self, mine: list[TP], start: core.Start) -> dict[TP, int]:
        kafka = aiokafka()
        tps = [kafka.TopicPartition(*tp) for tp in mine]
        if not tps:
            return {}
        consumer = self._consumer
        earliest = {(t.topic, t.partition): o for t, o in (await consumer.beginning_offsets(tps)).items()}
        latest = {(t.topic, t.partition): o for t, o in (await consumer.end_offsets(tps)).items()}
        by_time: dict[TP, int | None] = {}
        committed: dict[TP, int | None] = {}
        if start.kind == "timestamp":
            found = await consumer.offsets_for_times({t: start.timestamp_ms for t in tps})
            by_time = {(t.topic, t.partition): (o.offset if o is not None else None) for t, o in found.items()}
        if start.kind == core.COMMITTED:
            if self.group_id is None:
                raise KafkaError("start='committed' needs a group_id")
            group = await self._group_consumer(mine)
            for t in tps:
                committed[(t.topic, t.partition)] = await group.committed(t)
        return core.start_offsets(start, mine, earliest=earliest, latest=latest, by_time=by_time,
                                  committed=committed)

    async def _broker_ends(self, mine: list[TP]) -> dict[TP, int]:
        kafka = aiokafka()
        if not mine:
            return {}
        ends = await self._consumer.end_offsets([kafka.TopicPartition(*tp) for tp in mine])
        return {(t.topic, t.partition): int(o) for t, o in ends.items()}

    def _add(self, tp: TP, offset: int, end: int | None, skip: int = 0) -> None:
        with self._lock:
            self._buffers[tp] = collections.deque()
            self._fetched[tp] = offset
            self._next[tp] = offset
            self._end[tp] = end
            self._skip[tp] = skip
            self.records_read.setdefault(tp, 0)
            self._assignment_changed = True

    async def _group_consumer(self, partitions: list[TP]) -> Any:
        """A consumer of the group that never fetches: it reads and commits the group's offsets of
        `partitions` (aiokafka commits only partitions assigned to the consumer)."""
        kafka = aiokafka()
        if self._committer is None:
            committer = kafka.AIOKafkaConsumer(bootstrap_servers=self.bootstrap_servers, group_id=self.group_id,
                                               enable_auto_commit=False, **self.client_options)
            try:
                await connect_checked(committer.start(), self.bootstrap_servers, self.connect_timeout_s)
            except BaseException:  # failed, or cancelled by close: not left open
                await committer.stop()
                raise
            self._committer, self._committer_parts = committer, set()
        if set(partitions) != self._committer_parts:
            self._committer.assign([kafka.TopicPartition(*tp) for tp in sorted(partitions)])
            self._committer_parts = set(partitions)
        return self._committer

    def close(self) -> None:
        if not hasattr(self, "_thread"):
            return  # never opened (a restored task at its end does not read)
        with self._lock:
            commits = list(self._commits)
        for commit in commits:  # monitoring only: a commit a dead broker holds up is given up
            commit.cancel()
        self._stop_fetcher()

        async def closing() -> None:
            if self._consumer is not None:
                await self._consumer.stop()
            if self._committer is not None:
                await self._committer.stop()

        self._thread.stop(closing())

    # -- position -------------------------------------------------------------------------------------------

    def position(self) -> Any:
        with self._lock:
            self._batch_from = self._choose_next()
            parts = [[t, p, self._next[(t, p)], self._end[(t, p)], self._skip[(t, p)]] for t, p in sorted(self._next)]
        known = None if self._known is None else [list(tp) for tp in sorted(self._known | set(self._next))]
        return {"parts": parts, "known": known, "next": list(self._batch_from) if self._batch_from else None}

    def restore(self, position: Any) -> None:
        self._stop_fetcher()
        with self._lock:
            self._buffers.clear()
            self._fetched.clear()
            self._next.clear()
            self._end.clear()
            self._skip.clear()
        for topic, partition, offset, end, skip in position["parts"]:
            self._add((str(topic), int(partition)), int(offset), None if end is None else int(end), int(skip))
        known = position.get("known")
        self._known = None if known is None else {(str(t), int(p)) for t, p in known}
        nxt = position.get("next")
        self._batch_from = None if nxt is None else (str(nxt[0]), int(nxt[1]))
        self._last_read = None

    def _choose_next(self) -> TP | None:
        """The partition the next batch comes from: the first with buffered records after the last one read
        (round robin, so no partition starves)."""
        order = sorted(self._buffers)
        if not order:
            return None
        at = order.index(self._last_read) + 1 if self._last_read in self._buffers else 0
        for tp in order[at:] + order[:at]:
            if self._buffers[tp]:
                return tp
        return None

    # -- reading --------------------------------------------------------------------------------------------

    def read_batch(self, max_records: int) -> list[Any] | None:
        if self._error is not None:
            raise KafkaError(f"reading {self._describe_topics()}: {describe(self._error)}") from self._error
        if self._fetcher is None:
            self._fetcher = self._thread.submit(self._fetch_loop())
            self._fetcher.add_done_callback(self._fetcher_ended)
        tp = self._batch_from
        if tp is None:
            return None if self._finished() else []
        with self._lock:  # the fetch thread only appends: what is peeked here is still there to pop below
            buffer = self._buffers.get(tp)
            raw = list(itertools.islice(buffer, max_records)) if buffer else []
        if not raw:
            # not fetched yet (just restored: the task's skip of what was emitted reads on from this partition)
            if self._partition_done(tp):
                self._batch_from = None
            return []
        batch = self._decode_batch(raw)
        with self._lock:
            buffer = self._buffers[tp]
            for _ in range(len(batch)):
                buffer.popleft()
            self._next[tp] = raw[len(batch) - 1].offset + 1
            if not buffer:
                # all fetched was handed out: offsets up to the fetch position are read (or were markers)
                self._next[tp] = max(self._next[tp], self._fetched[tp])
            self.records_read[tp] = self.records_read.get(tp, 0) + len(batch)  # with _next: one snapshot
        self._last_read = tp
        self._last_record_at[tp] = time.monotonic()
        self._batch_from = None
        return batch

    def _decode_batch(self, raw: list[Any]) -> list[Any]:
        """The records before the first malformed one of `raw`; a malformed one leading `raw` alone: the task
        fails naming it, or it goes to the side output, or the user's function says what to emit."""
        records = [KafkaRecord(m.topic, m.partition, m.offset, m.timestamp, m.key, m.value, tuple(m.headers or ()),
                               timestamp_type=m.timestamp_type if m.timestamp_type is not None else -1)
                   for m in raw]
        values, bad = core.decode_prefix(records, self._decode)
        if bad is None or values:
            return values
        record, exc = bad
        if self.on_malformed == "fail":
            raise MalformedRecord(f"malformed record at {record.topic}/{record.partition}/{record.offset}: "
                                  f"{type(exc).__name__}: {exc}") from exc
        if self.on_malformed == "side-output":
            return SideOutputBatch(MALFORMED_KAFKA_RECORDS.name, [MalformedKafkaRecord.of(record, exc)],
                                   record.timestamp_ms)
        assert callable(self.on_malformed)
        value = self.on_malformed(record, exc)
        return [value] if value is not None else SideOutputBatch(None, [None])  # None: dropped, still counted

    def _finished(self) -> bool:
        if not self.bounded:
            return False
        with self._lock:
            return all(self._partition_done(tp) for tp in self._buffers)

    def _partition_done(self, tp: TP) -> bool:
        """Read to its bound (never, unbounded)."""
        end = self._end.get(tp)
        return end is not None and not self._buffers[tp] and self._next[tp] >= end

    def idle_wait_s(self) -> float:
        return 0.005

    def _describe_topics(self) -> str:
        return f"topics {self.topics}" if self.topics else f"topic pattern {self.topic_pattern!r}"

    def _fetcher_ended(self, future: concurrent.futures.Future[Any]) -> None:
        if not future.cancelled() and future.exception() is not None:
            self._error = future.exception()

    # -- the fetch thread -----------------------------------------------------------------------------------

    async def _fetch_loop(self) -> None:
        """Fetch into the per-partition buffers; discover partitions; retry a failing broker until `retry_s`
        of failures in a row (a broker restart is ridden out)."""
        kafka = aiokafka()
        self._fetch_task = asyncio.current_task()
        retry = RetryWindow(self.retry_s)
        next_discovery = time.monotonic() + (self.discovery_interval_s or 0)
        while not self._stopping:
            try:
                if self._assignment_changed:
                    self._reassign(kafka)
                if not self.bounded and self.discovery_interval_s and time.monotonic() >= next_discovery:
                    await self._discover()
                    next_discovery = time.monotonic() + self.discovery_interval_s
                buffered = sum(len(b) for b in self._buffers.values())
                if buffered >= self.max_buffered:
                    await asyncio.sleep(0.002)
                    continue
                data = await self._consumer.getmany(timeout_ms=100, max_records=2000)
                self._store(data)
                retry.succeeded()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if self._stopping:
                    return
                if not retry.failed(time.monotonic()):
                    raise KafkaError(f"failing for {self.retry_s:g}s: {describe(exc)}") from exc
                log.warning("kafka source %d: %s; retrying", self.subtask_index, describe(exc))
                self._assignment_changed = True  # seek again to what was fetched
                await asyncio.sleep(0.5)

    def _reassign(self, kafka: Any) -> None:
        with self._lock:
            self._assignment_changed = False
            active = {tp: off for tp, off in self._fetched.items() if (end := self._end[tp]) is None or off < end}
        tps = {tp: kafka.TopicPartition(*tp) for tp in active}
        self._consumer.assign(list(tps.values()))
        for tp, offset in active.items():
            self._consumer.seek(tps[tp], offset)

    def _store(self, data: dict[Any, list[Any]]) -> None:
        refit = False
        with self._lock:
            for tpo, messages in data.items():
                tp = (tpo.topic, tpo.partition)
                buffer = self._buffers.get(tp)
                if buffer is None:
                    continue
                end = self._end[tp]
                skip = self._skip[tp]
                for m in messages:
                    if m.offset < self._fetched[tp]:
                        continue  # a late answer to a fetch from before a seek
                    if end is not None and m.offset >= end:
                        break
                    if skip:
                        skip -= 1  # emitted by the old subtask before a rescale
                        self._next[tp] = m.offset + 1
                    else:
                        buffer.append(m)
                    self._fetched[tp] = m.offset + 1
                self._skip[tp] = skip
            for tpo in self._consumer.assignment():
                tp = (tpo.topic, tpo.partition)
                if tp not in self._fetched:
                    continue
                state = self._fetch_state(tpo)
                end = self._end[tp]
                if state is not None:
                    position, broker_end = state
                    if broker_end is not None:
                        self.end_offsets[tp] = broker_end
                    # past control records (transaction markers) and aborted ones that read_committed skips
                    if position is not None and position > self._fetched[tp] and not self._skip[tp]:
                        self._fetched[tp] = min(position, end) if end is not None else position
                if end is not None and self._fetched[tp] >= end:
                    refit = True  # read to its bound: stop fetching it
            if refit:
                self._assignment_changed = True

    def _fetch_state(self, tpo: Any) -> tuple[int | None, int | None] | None:
        """The consumer's fetch position of a partition and the broker's end (the last stable offset under
        read_committed, else the high watermark) as last seen, from aiokafka's subscription state (its public
        `position` is a coroutine that waits, `highwater`/`last_stable_offset` assert)."""
        try:
            state = self._consumer._subscription.subscription.assignment.state_value(tpo)
        except Exception:
            return None
        if state is None:
            return None
        end = state.lso if self.isolation_level == "read_committed" and (state.lso or -1) >= 0 else state.highwater
        position = state.position if state.has_valid_position else None
        return position, end

    async def _discover(self) -> None:
        partitions = await self._partitions()
        kafka = aiokafka()
        found = [tp for tp in partitions if tp not in self._next and (self._known is None or tp not in self._known)
                 and core.owner(tp[0], tp[1], self.parallelism) == self.subtask_index]
        if not found:
            return
        earliest = await self._consumer.beginning_offsets([kafka.TopicPartition(*tp) for tp in found])
        for t, offset in earliest.items():
            log.info("kafka source %d: new partition %s/%d from offset %d", self.subtask_index, t.topic,
                     t.partition, offset)
            self._add((t.topic, t.partition), int(offset), None)

    def _stop_fetcher(self) -> None:
        if self._fetcher is not None:
            self._stopping = True
            task = self._fetch_task
            if task is not None:
                self._thread.loop.call_soon_threadsafe(task.cancel)
            try:
                self._fetcher.result(5)
            except BaseException:  # cancelled, or the error it had already
                pass
            self._fetcher = None
            self._fetch_task = None
            self._stopping = False
            self._assignment_changed = True

    # -- event time -----------------------------------------------------------------------------------------

    def watermark_generator(self, strategy: Any, state: Any) -> core.PartitionWatermarks:
        """Watermarks per partition, combined in the source (the task asks for this instead of its own
        generator); a partition without a record for the strategy's idle_timeout_ms does not hold them back."""
        idle_s = strategy.idle_timeout_ms / 1000 if strategy.idle_timeout_ms is not None else None
        return core.PartitionWatermarks(strategy.max_delay_ms, strategy.granularity_ms, state,
                                        current=lambda: self._last_read, partitions=lambda: list(self._next),
                                        idle=lambda: self._idle_partitions(idle_s))

    def _idle_partitions(self, idle_s: float | None) -> set[TP]:
        if idle_s is None:
            return set()
        now = time.monotonic()
        with self._lock:
            return {tp for tp in self._next if not self._buffers[tp]
                    and now - self._last_record_at.get(tp, self._opened_at) >= idle_s}

    # -- checkpoints and metrics ----------------------------------------------------------------------------

    def checkpoint_complete(self, checkpoint_id: int, position: Any = None) -> None:
        """Commit the completed checkpoint's offsets to the group (Flink's rule), for lag monitoring only: a
        restore uses the checkpoint. Without its position, the offsets handed out so far."""
        if not self.commit_offsets or self.group_id is None or self._consumer is None:
            return
        if isinstance(position, dict) and "parts" in position:
            offsets = {(str(t), int(p)): int(offset) for t, p, offset, *_ in position["parts"]}
        else:
            with self._lock:
                offsets = dict(self._next)
        if offsets:
            future = self._thread.submit(self._commit(offsets))
            with self._lock:
                self._commits.add(future)
            future.add_done_callback(self._committed)

    async def _commit(self, offsets: dict[TP, int]) -> None:
        kafka = aiokafka()
        # one at a time: commits queue up while the broker is away, and each would otherwise start a group
        # consumer of its own while the first one's start waits
        async with self._commit_lock:
            group = await self._group_consumer(sorted(offsets))
            await group.commit({kafka.TopicPartition(*tp): o for tp, o in offsets.items()})

    def _committed(self, future: concurrent.futures.Future[Any]) -> None:
        with self._lock:
            self._commits.discard(future)
        if not future.cancelled() and future.exception() is not None:
            log.warning("kafka source %d: committing offsets to group %s: %s", self.subtask_index, self.group_id,
                        describe(future.exception() or RuntimeError()))

    def partition_statistics(self) -> dict[TP, tuple[int, int, int]]:
        """Per partition: (records read, lag behind the broker's end as last seen, the next offset to hand to
        the job); none before open. Read together, so offset + lag is the end the source last saw."""
        if not hasattr(self, "_next"):
            return {}
        with self._lock:
            nxt = dict(self._next)
            read = dict(self.records_read)
            lags = core.lag(self.end_offsets, nxt)
        return {tp: (read.get(tp, 0), lags.get(tp, 0), offset) for tp, offset in nxt.items()}
