"""The Kafka connector's decisions, without I/O: which subtask reads a partition, what a source position holds
and how positions are dealt on a rescale, where a partition starts, which pre-committed sink batches a recovery
must still produce, names, the built-in (de)serializers and the transaction-timeout check.

Everything here is a plain function of its arguments (no clock, no broker), so each rule is a unit test with an
exact answer (tests/unit/test_kafka_core.py); kafka_source.py and kafka_sink.py bind it to aiokafka.

Source positions are msgpack documents (they go into checkpoints):

    {"parts": [[topic, partition, next_offset, end_offset|None, skip], ...],   # what this subtask reads
     "known": [[topic, partition], ...] | None,   # every partition the job had seen (after a rescale)
     "next": [topic, partition] | None}            # the partition the next batch comes from

`next_offset` is the offset of the next record to hand to the task; `end_offset` the bound of a bounded
source (the partition's end when the job first started); `skip` records of the partition still to drop after
`next_offset` (what the old subtask had emitted of its last batch, folded in on a rescale). A batch holds
records of one partition only, and the position taken before it names that partition (`next`), so "position
+ records of the next batch already emitted" (what the task checkpoints) is exact for every partition.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

# -- partition assignment ------------------------------------------------------------------------------------


def owner(topic: str, partition: int, parallelism: int) -> int:
    """The subtask that reads `topic`/`partition` at `parallelism`: Flink's KafkaTopicPartitionAssigner (a
    topic's partitions round robin from a start that depends on the topic), stable as partitions and topics
    are added, so a subtask can claim a newly discovered partition without asking the others."""
    start = (zlib.crc32(topic.encode()) * 31 & 0x7FFFFFFF) % parallelism
    return (start + partition) % parallelism


def assigned(partitions: Iterable[tuple[str, int]], subtask: int, parallelism: int) -> list[tuple[str, int]]:
    return sorted(tp for tp in partitions if owner(tp[0], tp[1], parallelism) == subtask)


# -- start positions -----------------------------------------------------------------------------------------

EARLIEST, LATEST, COMMITTED = "earliest", "latest", "committed"


@dataclass(frozen=True, slots=True)
class Start:
    """Where a partition that no checkpoint knows starts: `kind` is earliest, latest, committed (the group's
    offset, else `fallback`), timestamp (the first record at or after `timestamp_ms`), or offsets (explicit
    `offsets`, else `fallback`)."""

    kind: str
    timestamp_ms: int | None = None
    offsets: tuple[tuple[str, int, int], ...] = ()
    fallback: str = EARLIEST


def parse_start(start: Any) -> Start:
    """The `start=` argument: "earliest", "latest", "committed", {"timestamp_ms": t}, or explicit offsets as
    {(topic, partition): offset} / {"topic:partition": offset}."""
    if isinstance(start, Start):
        return start
    if start in (EARLIEST, LATEST, COMMITTED):
        return Start(start)
    if isinstance(start, dict) and set(start) == {"timestamp_ms"}:
        return Start("timestamp", timestamp_ms=int(start["timestamp_ms"]))
    if isinstance(start, dict) and start:
        offsets = []
        for key, offset in start.items():
            if isinstance(key, str) and ":" in key:
                topic, _, part = key.rpartition(":")
                key = (topic, int(part))
            if not (isinstance(key, tuple) and len(key) == 2):
                raise ValueError(f"explicit start offsets are {{(topic, partition): offset}}, got key {key!r}")
            offsets.append((str(key[0]), int(key[1]), int(offset)))
        return Start("offsets", offsets=tuple(sorted(offsets)))
    raise ValueError(f"start must be 'earliest', 'latest', 'committed', {{'timestamp_ms': t}} or "
                     f"{{(topic, partition): offset}}, got {start!r}")


def start_offsets(start: Start, partitions: list[tuple[str, int]], *, earliest: dict[tuple[str, int], int],
                  latest: dict[tuple[str, int], int], by_time: dict[tuple[str, int], int | None],
                  committed: dict[tuple[str, int], int | None]) -> dict[tuple[str, int], int]:
    """The first offset of every partition of `partitions`, from the broker's answers (`by_time`: the offset of
    the first record at or after the start timestamp, None when there is none: the partition's end)."""
    explicit = {(t, p): o for t, p, o in start.offsets}
    out = {}
    for tp in partitions:
        if start.kind == EARLIEST:
            offset = earliest[tp]
        elif start.kind == LATEST:
            offset = latest[tp]
        elif start.kind == "timestamp":
            found = by_time.get(tp)
            offset = latest[tp] if found is None else found
        else:
            chosen = explicit.get(tp) if start.kind == "offsets" else committed.get(tp)
            offset = (earliest[tp] if start.fallback == EARLIEST else latest[tp]) if chosen is None else chosen
        out[tp] = max(offset, earliest[tp])  # an offset already deleted by retention: its first live one
    return out


# -- source positions ----------------------------------------------------------------------------------------


def fold_emitted(position: dict[str, Any], emitted: int) -> dict[str, Any]:
    """A checkpointed [position, emitted] -> a position alone: the `emitted` records of the batch after it came
    from partition `next`, which then skips them."""
    parts = [list(p) for p in position["parts"]]
    if emitted and position.get("next") is not None:
        topic, partition = position["next"]
        for p in parts:
            if p[0] == topic and p[1] == partition:
                p[4] = int(p[4]) + int(emitted)
                break
        else:
            raise ValueError(f"position names {topic}/{partition} as its next batch's partition but does not hold it")
    return {"parts": parts, "known": position.get("known"), "next": None}


def redistribute(states: list[Any], new_parallelism: int) -> list[Any]:
    """Old subtasks' source states ([position, emitted] each; None for one that had finished) -> the new
    subtasks' ([position, 0]): every partition goes, with its offset, bound and skip, to its owner at the new
    parallelism, and every new position knows every partition the job had seen, so discovery claims only
    partitions nobody had. Pure; deterministic."""
    parts: list[list[Any]] = []
    known: set[tuple[str, int]] = set()
    for state in states:
        if not state:
            continue
        position = fold_emitted(state[0], int(state[1]))
        parts += position["parts"]
        known.update((str(t), int(p)) for t, p in position.get("known") or ())
    known.update((str(p[0]), int(p[1])) for p in parts)
    everything = [list(tp) for tp in sorted(known)]
    out = []
    for subtask in range(new_parallelism):
        mine = sorted((p for p in parts if owner(p[0], p[1], new_parallelism) == subtask),
                      key=lambda p: (p[0], p[1]))
        out.append([{"parts": mine, "known": everything, "next": None}, 0])
    return out


def lag(end_offsets: dict[tuple[str, int], int],
        next_offsets: dict[tuple[str, int], int]) -> dict[tuple[str, int], int]:
    """Records in each partition after the next one to read (what the broker holds that the job has not read)."""
    return {tp: max(0, end_offsets[tp] - offset) for tp, offset in next_offsets.items() if tp in end_offsets}


# -- the exactly-once sink: which pre-committed batches a recovery produces ----------------------------------


def sink_group(prefix: str, subtask: int) -> str:
    """The consumer group whose committed offset records the last checkpoint sink subtask `subtask` (of the
    sink with transactional id prefix `prefix`) wrote to the topic: written in the same transaction as the
    records (send_offsets_to_transaction), so it is exactly as committed as they are."""
    return f"{prefix}-sluice-sink-{subtask}"


def transactional_id(prefix: str, subtask: int) -> str:
    """Stable across restarts and rescales: a new producer with the id fences the old one and aborts what it
    had open."""
    return f"{prefix}-{subtask}"


def marker_metadata(token: str) -> str:
    return json.dumps({"sluice": token}, separators=(",", ":"))


def marker_token(metadata: str | None) -> str | None:
    try:
        doc = json.loads(metadata or "")
    except ValueError:
        return None
    return doc.get("sluice") if isinstance(doc, dict) else None


def batches_to_produce(pending: list[list[Any]],
                       committed: dict[int, tuple[int, str | None] | None]) -> list[list[Any]]:
    """After a restore, the pre-committed batches ([checkpoint id, subtask, token, records]) that have not
    reached the topic. `committed[subtask]` is that subtask's group marker (checkpoint id, token), None when it
    has none. A batch reached the topic iff the marker has the batch's token (the run that wrote it: checkpoint
    ids start again at 1 in a new submission) and an id >= the batch's. In checkpoint order per subtask."""
    out = []
    for entry in sorted(pending, key=lambda e: (int(e[1]), int(e[0]))):
        checkpoint_id, subtask, token = int(entry[0]), int(entry[1]), entry[2]
        marker = committed.get(subtask)
        if marker is not None and marker[1] == token and marker[0] >= checkpoint_id:
            continue
        out.append(entry)
    return out


class TransactionTimeoutTooShort(ValueError):
    pass


def check_transaction_timeout(transaction_timeout_ms: int, broker_max_ms: int | None, interval_s: float | None,
                              *, topic: str) -> None:
    """A checkpoint's records are produced in one transaction when it completes, so a transaction lives about
    as long as producing them takes, but Flink's rule still holds for the producer's own timeout: it must be
    within the broker's maximum (or the producer is refused) and longer than the checkpoint interval (a
    recovery's replay can carry that much)."""
    if broker_max_ms is not None and transaction_timeout_ms > broker_max_ms:
        raise TransactionTimeoutTooShort(
            f"KafkaSink({topic!r}): transaction_timeout_ms={transaction_timeout_ms} exceeds the broker's "
            f"transaction.max.timeout.ms={broker_max_ms}: lower it, or raise the broker's maximum")
    if interval_s is not None and transaction_timeout_ms < interval_s * 1000:
        raise TransactionTimeoutTooShort(
            f"KafkaSink({topic!r}): transaction_timeout_ms={transaction_timeout_ms} is shorter than the "
            f"checkpoint interval ({interval_s:g}s): raise it above the interval (and within the broker's "
            f"transaction.max.timeout.ms)")


# -- (de)serializers -----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class KafkaRecord:
    """What a deserializer gets: the record and where it is."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]
    # Kafka's timestamp type: 0 CreateTime (the producer's), 1 LogAppendTime (the broker's), -1 none
    timestamp_type: int = field(default=0, kw_only=True)


def _plain(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value  # as JsonLinesSource: arrays become tuples


def json_value(record: KafkaRecord) -> Any:
    return _plain(json.loads(record.value)) if record.value is not None else None


def msgpack_value(record: KafkaRecord) -> Any:
    import msgpack

    return _plain(msgpack.unpackb(record.value, raw=False)) if record.value is not None else None


def raw_value(record: KafkaRecord) -> Any:
    return record.value


def key_value(record: KafkaRecord) -> Any:
    """(key as text or None, value as JSON)."""
    return (record.key.decode() if record.key is not None else None, json_value(record))


def timestamped_value(record: KafkaRecord) -> Any:
    """(the record's Kafka timestamp in ms, value as JSON): for event time from the broker's timestamps,
    `BoundedOutOfOrderness(..., timestamp=lambda r: r[0])`."""
    return (record.timestamp_ms, json_value(record))


@dataclass(frozen=True, slots=True)
class MalformedKafkaRecord(KafkaRecord):
    """A record the deserializer could not read, as the source's side output carries it (on_malformed=
    "side-output"): the record (where it is, its raw bytes) and the error."""

    error: str  # "JSONDecodeError: Unterminated string ..."

    @staticmethod
    def of(record: KafkaRecord, error: BaseException) -> MalformedKafkaRecord:
        return MalformedKafkaRecord(record.topic, record.partition, record.offset, record.timestamp_ms, record.key,
                                    record.value, record.headers, f"{type(error).__name__}: {error}",
                                    timestamp_type=record.timestamp_type)


def decode_prefix(records: list[KafkaRecord],
                  decode: Any) -> tuple[list[Any], tuple[KafkaRecord, BaseException] | None]:
    """Decode `records` in order up to the first the deserializer fails on: (the values before it, (that record,
    its error) or None). A batch never holds a malformed record in its middle: what the source hands out stays
    one record per offset, so a checkpoint's "records of the batch emitted" counts offsets exactly, and the
    malformed record leads a batch of its own (failing the task, or going to the side output)."""
    values = []
    for record in records:
        try:
            values.append(decode(record))
        except Exception as exc:
            return values, (record, exc)
    return values, None


ON_MALFORMED = ("fail", "side-output")


DESERIALIZERS = {"json": json_value, "msgpack": msgpack_value, "raw": raw_value, "key_value": key_value,
                 "timestamped": timestamped_value}


def encode_json(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def encode_msgpack(value: Any) -> bytes:
    import msgpack

    return bytes(msgpack.packb(value, use_bin_type=True))


def encode_raw(value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    raise TypeError(f"the raw serializer takes bytes or str, got {type(value).__name__}")


SERIALIZERS = {"json": encode_json, "msgpack": encode_msgpack, "raw": encode_raw}


def encode_key(key: Any) -> bytes | None:
    if key is None or isinstance(key, bytes):
        return key
    return str(key).encode()


# -- event time: watermarks per partition --------------------------------------------------------------------

MIN_WATERMARK = -(2**63)


class PartitionWatermarks:
    """A source subtask's watermark generator (runtime/execution/watermarks.py's WatermarkGenerator interface:
    on_timestamp, observe, due, snapshot, max_ts, last_emitted, idle) that keeps bounded out-of-orderness per
    partition and emits the minimum over the partitions that are not idle, as Flink's KafkaSource does: one
    partition far ahead of another does not make the other's records late. `current()` names the partition of the record
    being timed (the source hands out one partition per batch), `partitions()` the subtask's partitions and
    `idle()` those without a record for the strategy's idle timeout; both are read, never the clock. A
    partition that has had no record yet holds the watermark back until it is idle. The state is
    [max_ts, last_emitted, idle, {partition: max_ts}]: its first three as WatermarkGenerator's, so a rescale
    (which keeps the lowest of those) treats it alike; the per-partition maxima start again then."""

    __slots__ = ("max_delay_ms", "granularity_ms", "max_ts", "last_emitted", "idle", "partition_max", "_current",
                 "_partitions", "_idle")

    def __init__(self, max_delay_ms: int, granularity_ms: int, state: Any, *, current: Any, partitions: Any,
                 idle: Any) -> None:
        self.max_delay_ms = max_delay_ms
        self.granularity_ms = granularity_ms
        self.max_ts = MIN_WATERMARK
        self.last_emitted = MIN_WATERMARK
        self.idle = False
        self.partition_max: dict[str, int] = {}
        self._current, self._partitions, self._idle = current, partitions, idle
        if state:
            self.max_ts, self.last_emitted, idle_flag = state[0], state[1], state[2]
            self.idle = bool(idle_flag)
            if len(state) > 3 and state[3]:
                self.partition_max = {str(k): int(v) for k, v in state[3].items()}

    def on_timestamp(self, ts: int) -> int | None:
        self.observe(ts)
        return self.due()

    def observe(self, ts: int) -> None:
        """A record of the current partition with timestamp `ts` (periodic emission: `due` decides later)."""
        key = self._current_key()
        if ts > self.partition_max.get(key, MIN_WATERMARK):
            self.partition_max[key] = ts
        if ts > self.max_ts:
            self.max_ts = ts

    def _current_key(self) -> str:
        tp = self._current()
        return f"{tp[0]}:{tp[1]}" if tp is not None else ""

    def due(self) -> int | None:
        """The minimum over the partitions that are not idle, less the delay, when above the last emitted."""
        idle = self._idle()
        keys = [f"{t}:{p}" for t, p in self._partitions() if (t, p) not in idle] or [self._current_key()]
        low = min(self.partition_max.get(k, MIN_WATERMARK) for k in keys)
        if low == MIN_WATERMARK:
            return None
        w = low - self.max_delay_ms - 1
        w -= w % self.granularity_ms
        if w > self.last_emitted:
            self.last_emitted = w
            return w
        return None

    def snapshot(self) -> list[Any]:
        return [self.max_ts, self.last_emitted, self.idle, dict(self.partition_max)]
