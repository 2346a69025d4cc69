"""PostgreSQL's logical replication protocol (pgoutput, protocol version 1), decoded without I/O.

`decode_message(payload)` turns one XLogData payload into a message (Begin, Relation, Insert, Update, Delete,
Truncate, Commit; Origin and Type are recognised and carry nothing we use). `ChangeDecoder` keeps the
relations the stream announced (a Relation message precedes the first change of a table, and again after its
schema changed, so a column added mid-stream is in the records that follow it) and turns the messages of one
transaction into change records shaped like Debezium's and Flink CDC's:

    {"op": "c"|"u"|"d"|"t", "table": "schema.name", "before": {...}|None, "after": {...}|None,
     "lsn": commit LSN, "ts_ms": commit time in ms since the Unix epoch}

A transaction's changes come out together when its Commit arrives (`feed` returns them), each with its
commit LSN, so a reader can place its position between transactions. Values come in pgoutput's text format
and are converted by type OID (integers, floats, numeric, booleans; everything else stays text); a TOASTed
value that did not change is `UNCHANGED_TOAST` ('u' in the tuple data: the server did not send it).
"""

from __future__ import annotations

import datetime
import decimal
import struct
from dataclasses import dataclass, field
from typing import Any

# microseconds between the Unix epoch and PostgreSQL's (2000-01-01)
PG_EPOCH_OFFSET_US = 946_684_800_000_000


class PgoutputError(ValueError):
    """The stream held something this decoder cannot read (a malformed or unknown message)."""


class _Unchanged:
    def __repr__(self) -> str:
        return "UNCHANGED_TOAST"


UNCHANGED_TOAST: Any = _Unchanged()


@dataclass(frozen=True, slots=True)
class Column:
    name: str
    type_oid: int
    key: bool  # part of the replica identity (the primary key; every column with REPLICA IDENTITY FULL)


@dataclass(frozen=True, slots=True)
class Relation:
    oid: int
    namespace: str
    name: str
    replica_identity: str  # d(efault), n(othing), f(ull), i(ndex)
    columns: tuple[Column, ...]

    @property
    def table(self) -> str:
        return f"{self.namespace}.{self.name}"


@dataclass(frozen=True, slots=True)
class Begin:
    final_lsn: int  # the LSN of the transaction's commit record
    commit_time_us: int  # since PostgreSQL's epoch
    xid: int


@dataclass(frozen=True, slots=True)
class Commit:
    flags: int
    commit_lsn: int
    end_lsn: int  # the end of the commit record: a reader that has all of this transaction stands here
    commit_time_us: int


@dataclass(frozen=True, slots=True)
class Insert:
    relation_oid: int
    new: tuple[Any, ...]  # raw text values (None for NULL, UNCHANGED_TOAST)


@dataclass(frozen=True, slots=True)
class Update:
    relation_oid: int
    old: tuple[Any, ...] | None  # the old row ('O', REPLICA IDENTITY FULL) or its key ('K'), when sent
    old_is_key: bool
    new: tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class Delete:
    relation_oid: int
    old: tuple[Any, ...]
    old_is_key: bool


@dataclass(frozen=True, slots=True)
class Truncate:
    options: int
    relation_oids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Ignored:
    kind: str  # Origin ('O'), Type ('Y'), Message ('M')


Message = Begin | Commit | Relation | Insert | Update | Delete | Truncate | Ignored


_U16 = struct.Struct("!H").unpack_from
_I32 = struct.Struct("!i").unpack_from
_TEXT, _BINARY, _NULL, _UNCHANGED = b"t"[0], b"b"[0], b"n"[0], b"u"[0]


class _Reader:
    __slots__ = ("data", "at")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.at = 1  # after the message type

    def take(self, fmt: str) -> Any:
        size = struct.calcsize(fmt)
        if self.at + size > len(self.data):
            raise PgoutputError(f"message {self.data[:1]!r} ends early at byte {self.at} of {len(self.data)}")
        (value,) = struct.unpack_from(fmt, self.data, self.at)
        self.at += size
        return value

    def string(self) -> str:
        end = self.data.find(b"\x00", self.at)
        if end < 0:
            raise PgoutputError(f"message {self.data[:1]!r}: unterminated string at byte {self.at}")
        value = self.data[self.at:end].decode("utf-8")
        self.at = end + 1
        return value

    def tuple_data(self) -> tuple[Any, ...]:
        """The per-row hot path: parsed inline, one bounds check per value."""
        data, at, size = self.data, self.at, len(self.data)
        if at + 2 > size:
            raise PgoutputError("tuple data ends early")
        (count,) = _U16(data, at)
        at += 2
        values: list[Any] = []
        append = values.append
        for _ in range(count):
            if at >= size:
                raise PgoutputError("tuple data ends early")
            kind = data[at]
            at += 1
            if kind in (_TEXT, _BINARY):
                if at + 4 > size:
                    raise PgoutputError("tuple data ends early")
                (length,) = _I32(data, at)
                at += 4
                end = at + length
                if end > size:
                    raise PgoutputError("tuple data ends inside a value")
                append(data[at:end].decode("utf-8") if kind == _TEXT else data[at:end])
                at = end
            elif kind == _NULL:
                append(None)
            elif kind == _UNCHANGED:
                append(UNCHANGED_TOAST)
            else:
                raise PgoutputError(f"unknown tuple value kind {bytes([kind])!r}")
        self.at = at
        return tuple(values)


def decode_message(payload: bytes) -> Message:
    """One pgoutput message (the payload of an XLogData) -> its dataclass."""
    if not payload:
        raise PgoutputError("empty message")
    kind = payload[:1]
    r = _Reader(payload)
    if kind == b"B":
        return Begin(r.take("!Q"), r.take("!q"), r.take("!I"))
    if kind == b"C":
        return Commit(r.take("!B"), r.take("!Q"), r.take("!Q"), r.take("!q"))
    if kind == b"R":
        oid, namespace, name = r.take("!I"), r.string(), r.string()
        identity = r.take("!c").decode()
        columns = []
        for _ in range(r.take("!H")):
            flags, column, type_oid, _modifier = r.take("!B"), r.string(), r.take("!I"), r.take("!i")
            columns.append(Column(column, type_oid, bool(flags & 1)))
        return Relation(oid, namespace or "pg_catalog", name, identity, tuple(columns))
    if kind == b"I":
        oid = r.take("!I")
        if r.take("!c") != b"N":
            raise PgoutputError("insert without a new tuple")
        return Insert(oid, r.tuple_data())
    if kind == b"U":
        oid = r.take("!I")
        marker = r.take("!c")
        old: tuple[Any, ...] | None = None
        old_is_key = False
        if marker in (b"K", b"O"):
            old_is_key = marker == b"K"
            old = r.tuple_data()
            marker = r.take("!c")
        if marker != b"N":
            raise PgoutputError(f"update without a new tuple (marker {marker!r})")
        return Update(oid, old, old_is_key, r.tuple_data())
    if kind == b"D":
        oid = r.take("!I")
        marker = r.take("!c")
        if marker not in (b"K", b"O"):
            raise PgoutputError(f"delete without an old tuple (marker {marker!r})")
        return Delete(oid, r.tuple_data(), marker == b"K")
    if kind == b"T":
        count, options = r.take("!I"), r.take("!B")
        return Truncate(options, tuple(r.take("!I") for _ in range(count)))
    if kind in (b"O", b"Y", b"M"):
        return Ignored(kind.decode())
    raise PgoutputError(f"unknown pgoutput message type {kind!r}")


# -- values ----------------------------------------------------------------------------------------------------

BOOL, INT8, INT2, INT4, OID, FLOAT4, FLOAT8, NUMERIC = 16, 20, 21, 23, 26, 700, 701, 1700


def _to_bool(text: str) -> bool:
    return text == "t"


CONVERTERS: dict[int, Any] = {INT2: int, INT4: int, INT8: int, OID: int, FLOAT4: float, FLOAT8: float,
                              NUMERIC: decimal.Decimal, BOOL: _to_bool}


def convert(type_oid: int, text: Any) -> Any:
    """A text-format value of type `type_oid` -> a Python value (int, float, Decimal, bool; text otherwise).
    The same conversion serves the snapshot, whose rows are read as text for that reason."""
    if text is None or text is UNCHANGED_TOAST or not isinstance(text, str):
        return text
    converter = CONVERTERS.get(type_oid)
    return text if converter is None else converter(text)


def lsn_text(lsn: int) -> str:
    """An LSN as PostgreSQL writes it: 'X/Y' in hexadecimal."""
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


def parse_lsn(text: str) -> int:
    high, low = text.split("/")
    return (int(high, 16) << 32) | int(low, 16)


def pg_time_to_unix_ms(us: int) -> int:
    return (us + PG_EPOCH_OFFSET_US) // 1000


def pg_time_to_datetime(us: int) -> datetime.datetime:
    return datetime.datetime.fromtimestamp((us + PG_EPOCH_OFFSET_US) / 1e6, tz=datetime.UTC)


# -- changes ---------------------------------------------------------------------------------------------------


@dataclass(slots=True)
class Transaction:
    """The changes of one transaction once its Commit arrived."""

    commit_lsn: int
    end_lsn: int
    commit_ms: int
    changes: list[dict[str, Any]]


@dataclass(slots=True)
class ChangeDecoder:
    """Messages in stream order -> whole transactions of change records (see the module docstring)."""

    relations: dict[int, Relation] = field(default_factory=dict)
    _shapes: dict[int, tuple[Relation, tuple[str, ...], tuple[Any, ...]]] = field(default_factory=dict)
    _begin: Begin | None = None
    _changes: list[dict[str, Any]] = field(default_factory=list)

    @property
    def in_transaction(self) -> bool:
        """Between a Begin and its Commit: a transaction is partly decoded."""
        return self._begin is not None

    def feed(self, payload: bytes) -> Transaction | None:
        """Decode one message; the transaction it completes (on a Commit), else None."""
        message = decode_message(payload)
        if isinstance(message, Relation):
            self.relations[message.oid] = message
            return None
        if isinstance(message, Begin):
            self._begin = message
            self._changes = []
            return None
        if isinstance(message, Commit):
            if self._begin is None:
                raise PgoutputError(f"commit at {lsn_text(message.commit_lsn)} without a begin")
            txn = Transaction(message.commit_lsn, message.end_lsn, pg_time_to_unix_ms(message.commit_time_us),
                              self._changes)
            for change in txn.changes:
                change["lsn"] = message.commit_lsn
                change["ts_ms"] = txn.commit_ms
            self._begin, self._changes = None, []
            return txn
        if isinstance(message, Ignored):
            return None
        if self._begin is None:
            raise PgoutputError(f"{type(message).__name__} outside a transaction")
        if isinstance(message, Truncate):
            for oid in message.relation_oids:
                self._changes.append(self._record("t", self._relation(oid), None, None))
            return None
        relation = self._relation(message.relation_oid)
        if isinstance(message, Insert):
            self._changes.append(self._record("c", relation, None, self._row(relation, message.new)))
        elif isinstance(message, Update):
            before = None if message.old is None else self._row(relation, message.old, key_only=message.old_is_key)
            after = self._row(relation, message.new)
            if before is not None and not message.old_is_key:  # an unchanged TOASTed value is the old one
                after = {k: before[k] if v is UNCHANGED_TOAST and k in before else v for k, v in after.items()}
            self._changes.append(self._record("u", relation, before, after))
        elif isinstance(message, Delete):
            self._changes.append(
                self._record("d", relation, self._row(relation, message.old, key_only=message.old_is_key), None))
        return None

    def _relation(self, oid: int) -> Relation:
        relation = self.relations.get(oid)
        if relation is None:
            raise PgoutputError(f"change for relation {oid} before its Relation message")
        return relation

    def _row(self, relation: Relation, values: tuple[Any, ...], *, key_only: bool = False) -> dict[str, Any]:
        if len(values) != len(relation.columns):
            raise PgoutputError(f"{relation.table}: {len(values)} values for {len(relation.columns)} columns")
        if key_only:
            return {c.name: convert(c.type_oid, v) for c, v in zip(relation.columns, values, strict=True) if c.key}
        names, converters = self._shape(relation)
        return {name: v if conv is None or v is None or v is UNCHANGED_TOAST else conv(v)
                for name, conv, v in zip(names, converters, values, strict=True)}

    def _shape(self, relation: Relation) -> tuple[tuple[str, ...], tuple[Any, ...]]:
        """The relation's column names and value converters, computed once per Relation message."""
        shape = self._shapes.get(relation.oid)
        if shape is None or shape[0] is not relation:
            shape = (relation, tuple(c.name for c in relation.columns),
                     tuple(CONVERTERS.get(c.type_oid) for c in relation.columns))
            self._shapes[relation.oid] = shape
        return shape[1], shape[2]

    @staticmethod
    def _record(op: str, relation: Relation, before: dict[str, Any] | None,
                after: dict[str, Any] | None) -> dict[str, Any]:
        return {"op": op, "table": relation.table, "before": before, "after": after}
