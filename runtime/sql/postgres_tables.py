"""PostgreSQL tables in Sluice SQL: Flink's `jdbc` connector (a sink, the dimension table of a lookup join, and a
bounded scan: runtime/sql/jdbc_scan.py) and Flink CDC's `postgres-cdc` (a changelog source), planned onto
runtime/connectors' PostgresSink and PostgresCdcSource, so exactly as exact as they are.

- `jdbc` written: with a PRIMARY KEY the exactly-once upsert sink (+I/+U upserted, -D deleted by key, -U dropped:
  the +U after it replaces the row, as Flink's JDBC upsert sink does), without one it appends (insert-only
  queries only: the planner refuses an updating one, runtime/sql/changelog.py).
- `postgres-cdc` read: the CDC source's Debezium-shaped changes become (kind, row) pairs: r/c +I, u -U (the
  before image, when the table has REPLICA IDENTITY FULL) then +U, d -D.
- `jdbc` looked up (`JOIN dim FOR SYSTEM_TIME AS OF o.proc_time`): `LookupFunction`, an async function for the
  runtime's async_map, querying by key on threads of its own, a connection each (psycopg2 blocks), behind
  Flink's PARTIAL cache, or answering from Flink's FULL cache (the whole table, reloaded periodically).

Options are checked when the plan is built, each refusal one line naming the table and the option.
"""

from __future__ import annotations

import asyncio
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

from runtime.connectors import postgres as pgc
from runtime.connectors.postgres_cdc import PostgresCdcSource
from runtime.connectors.postgres_sink import PostgresSink
from runtime.sql import types as T
from runtime.sql.catalog import TableDef
from runtime.sql.errors import SqlError

# lookup.async.capacity is Sluice's (the lookups in flight per subtask); the rest are Flink's
JDBC_OPTIONS = ("connector", "url", "table-name", "username", "password", "driver", "sink.delivery-guarantee",
                "lookup.cache", "lookup.partial-cache.max-rows", "lookup.partial-cache.expire-after-write",
                "lookup.partial-cache.cache-missing-key", "lookup.max-retries", "lookup.async.capacity",
                "scan.partition.column", "scan.partition.num", "scan.partition.lower-bound",
                "scan.partition.upper-bound", "scan.fetch-size", "lookup.full-cache.reload-strategy",
                "lookup.full-cache.periodic-reload.interval", "lookup.full-cache.periodic-reload.schedule-mode")
CDC_OPTIONS = ("connector", "hostname", "port", "username", "password", "database-name", "schema-name",
               "table-name", "slot.name", "decoding.plugin.name", "debezium.publication.name",
               "scan.incremental.snapshot.enabled", "changelog-mode")


def _option(table: TableDef, key: str, default: str | None = None) -> str:
    value = table.options.get(key, default)
    if not value:
        raise SqlError(f"table {table.name}: the '{table.connector}' connector needs the option '{key}'")
    return value


def _known(table: TableDef, allowed: Sequence[str]) -> None:
    unknown = sorted(k for k in table.options if k not in allowed)
    if unknown:
        raise SqlError(f"table {table.name}: option '{unknown[0]}' is not supported by the '{table.connector}' "
                       f"connector (options: {', '.join(allowed[1:])})")


def _dsn(host: str, port: str, database: str, user: str | None, password: str | None) -> str:
    parts = [f"host={host}", f"port={port}", f"dbname={database}"]
    if user:
        parts.append(f"user={user}")
    if password:
        parts.append(f"password={password}")
    return " ".join(parts)


def jdbc_dsn(table: TableDef) -> str:
    """'url' = 'jdbc:postgresql://host:port/db' with 'username' and 'password' -> a libpq DSN."""
    _known(table, JDBC_OPTIONS)
    url = _option(table, "url")
    driver = table.options.get("driver", "org.postgresql.Driver")
    if driver != "org.postgresql.Driver":
        raise SqlError(f"table {table.name}: 'driver' must be org.postgresql.Driver (PostgreSQL is the one JDBC "
                       f"database of Sluice SQL), got '{driver}'")
    if not url.startswith("jdbc:postgresql://"):
        raise SqlError(f"table {table.name}: 'url' must be jdbc:postgresql://host:port/database (PostgreSQL is the "
                       f"one JDBC database of Sluice SQL), got '{url}'")
    parts = urlsplit(url[len("jdbc:"):])
    database = parts.path.lstrip("/")
    try:
        port = parts.port or 5432
    except ValueError:
        port = 0
    if not parts.hostname or not database or not port:
        raise SqlError(f"table {table.name}: 'url' must be jdbc:postgresql://host:port/database, got '{url}'")
    _option(table, "table-name")
    return _dsn(parts.hostname, str(port), unquote(database), table.options.get("username"),
                table.options.get("password"))


def check_table(dsn: str, table_name: str, columns: Sequence[str], where: str) -> None:
    """A jdbc table read (looked up or scanned) exists with `columns` and may be selected from, or one line raised
    (ValueError; PostgresError when the server cannot be reached)."""
    conn = pgc.connect(dsn)
    try:
        with conn.cursor() as cur:
            info = pgc.table_info(cur, table_name)
            if info is None:
                raise ValueError(f"{where}: no such table")
            missing = [c for c in columns if c not in info.columns]
            if missing:
                raise ValueError(f"{where}: no column {', '.join(missing)} (the table has "
                                 f"{', '.join(info.columns)})")
            cur.execute("SELECT has_table_privilege(%s, 'SELECT')", (pgc.qualified(table_name),))
            if not cur.fetchone()[0]:
                raise ValueError(f"{where}: no SELECT privilege on the table")
    finally:
        conn.close()


# -- jdbc: the sink ----------------------------------------------------------------------------------------------


class JdbcSink(PostgresSink):
    """Rows (an insert-only query) appended or upserted; or a changelog of (kind, row) pairs into a table with a
    key: +I/+U upserted, -D deleted, -U dropped. `convert`: a row's values as the driver takes them."""

    def __init__(self, *args: Any, changelog: bool, convert: Callable[[Any], tuple[Any, ...]] = tuple,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.changelog = changelog
        self.convert = convert

    def write(self, record: Any) -> None:
        if not self.changelog:
            super().write(self.convert(record))
            return
        kind, row = record
        if kind == "-D":
            self.delete(self.convert(row))
        elif kind != "-U":
            super().write(self.convert(row))


def jdbc_sink(table: TableDef, *, changelog: bool) -> JdbcSink:
    dsn = jdbc_dsn(table)
    delivery = table.options.get("sink.delivery-guarantee", "exactly-once")
    if delivery not in ("exactly-once", "at-least-once"):
        raise SqlError(f"table {table.name}: 'sink.delivery-guarantee' must be exactly-once or at-least-once, "
                       f"got '{delivery}'")
    names = [c.name for c in table.physical]
    writers = [T.writer(c.type) if c.type is not None and c.type.timestamp else None  # type: ignore[arg-type]
               for c in table.physical]
    convert: Callable[[Any], tuple[Any, ...]] = (
        (lambda row: tuple(w(v) if w else v for w, v in zip(writers, row, strict=True)))
        if any(writers) else tuple)
    key = table.primary_key
    if changelog and not key:  # the planner refuses this first (changelog.sink_accepts): a guard, not a path
        raise SqlError(f"table {table.name}: a 'jdbc' table without a PRIMARY KEY appends; declare PRIMARY KEY "
                       "(...) NOT ENFORCED to write an updating query")
    return JdbcSink(dsn, _option(table, "table-name"), key=key, mode="upsert" if key else "append",
                    delivery=delivery, columns=names, name=f"sql-{table.name}", changelog=changelog,
                    convert=convert)


# -- postgres-cdc: the source ------------------------------------------------------------------------------------


def changelog_rows(change: dict[str, Any], names: Sequence[str], readers: Sequence[Callable[[Any], Any]],
                   computed: Callable[[tuple[Any, ...]], tuple[Any, ...]] | None) -> list[tuple[str, Any]]:
    """One CDC change (Debezium's shape) -> its (kind, row) pairs. An update without a full before image (the
    table's REPLICA IDENTITY is not FULL) is a +U alone; a truncate has no rows to give and is refused."""

    def row(image: dict[str, Any]) -> tuple[Any, ...]:
        values = tuple(read(image.get(n)) for n, read in zip(names, readers, strict=True))
        return computed(values) if computed is not None else values

    op = change["op"]
    if op in ("r", "c"):
        return [("+I", row(change["after"]))]
    if op == "u":
        before = change.get("before")
        out = [("-U", row(before))] if before and all(n in before for n in names) else []
        return [*out, ("+U", row(change["after"]))]
    if op == "d":
        return [("-D", row(change["before"]))]
    raise ValueError(f"a '{op}' change (truncate) cannot be a changelog of rows: Flink CDC does not read it either")


class CdcTableSource(PostgresCdcSource):
    """A `postgres-cdc` table: the CDC source, its changes as (kind, row) pairs (module docstring)."""

    def __init__(self, table: TableDef, computed: Callable[[tuple[Any, ...]], tuple[Any, ...]] | None) -> None:
        _known(table, CDC_OPTIONS)
        for key, allowed in (("decoding.plugin.name", "pgoutput"), ("changelog-mode", "all"),
                             ("scan.incremental.snapshot.enabled", None)):
            value = table.options.get(key)
            if value is not None and allowed is not None and value != allowed:
                raise SqlError(f"table {table.name}: '{key}' must be '{allowed}', got '{value}'")
        port = table.options.get("port", "5432")
        if not port.isdigit():
            raise SqlError(f"table {table.name}: 'port' must be a number, got '{port}'")
        dsn = _dsn(_option(table, "hostname"), port, _option(table, "database-name"), _option(table, "username"),
                   table.options.get("password"))
        name = _option(table, "table-name")
        if "." in name:
            raise SqlError(f"table {table.name}: 'table-name' is one table's name (its schema is 'schema-name'), "
                           f"got '{name}'")
        qualified = f"{table.options.get('schema-name', 'public')}.{name}"
        super().__init__(dsn, [qualified], slot=_option(table, "slot.name"),
                         publication=table.options.get("debezium.publication.name", "dbz_publication"))
        self.table_name = table.name
        self.names = [c.name for c in table.physical]
        self.readers = [T.reader(c.type) for c in table.physical]  # type: ignore[arg-type]
        self.computed = computed

    expands = True  # an update is -U and +U: a batch may end between them (postgres_cdc.ChangeQueue)

    def records_of(self, change: dict[str, Any]) -> list[Any]:
        try:
            return changelog_rows(change, self.names, self.readers, self.computed)
        except (ValueError, TypeError, KeyError) as exc:
            raise ValueError(f"table {self.table_name}: cannot read change {str(change)[:200]}: {exc}") from exc


# -- jdbc: the lookup ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LookupSettings:
    """Flink's lookup options of a jdbc table: the PARTIAL cache (rows kept, for how long after written) and
    retries; `capacity` the lookups in flight per subtask."""

    cache_rows: int = 0  # 0: no cache
    expire_after_write_ms: int | None = None
    cache_missing: bool = True
    max_retries: int = 3
    capacity: int = 10
    full_reload_ms: int | None = None  # lookup.cache = 'FULL': the whole table, loaded again this often
    full_fixed_rate: bool = False  # FIXED_RATE: the interval from a load's start, FIXED_DELAY (Flink's default) its end


_UNITS_MS = {"ms": 1, "milli": 1, "millis": 1, "s": 1000, "sec": 1000, "second": 1000, "seconds": 1000,
             "min": 60_000, "minute": 60_000, "minutes": 60_000, "h": 3_600_000, "hour": 3_600_000,
             "hours": 3_600_000, "d": 86_400_000, "day": 86_400_000, "days": 86_400_000}


def duration_ms(text: str) -> int:
    """A Flink duration option ('10 s', '10s', '1 min', '500 ms'; a bare number is milliseconds) in ms."""
    value = text.strip().lower()
    digits = len(value) - len(value.lstrip("0123456789"))
    number, unit = value[:digits], value[digits:].strip() or "ms"
    if not number or unit not in _UNITS_MS:
        raise ValueError(f"not a duration: {text!r}")
    return int(number) * _UNITS_MS[unit]


def lookup_settings(table: TableDef) -> LookupSettings:
    opts = table.options
    cache = opts.get("lookup.cache", "NONE").upper()
    if cache not in ("NONE", "PARTIAL", "FULL"):
        raise SqlError(f"table {table.name}: 'lookup.cache' must be NONE, PARTIAL or FULL, got "
                       f"'{opts['lookup.cache']}'")

    def number(key: str, default: int) -> int:
        value = opts.get(key, str(default))
        if not value.isdigit():
            raise SqlError(f"table {table.name}: '{key}' must be a whole number, got '{value}'")
        return int(value)

    rows = number("lookup.partial-cache.max-rows", 0) if cache == "PARTIAL" else 0
    if cache == "PARTIAL" and rows == 0:
        raise SqlError(f"table {table.name}: 'lookup.cache' = 'PARTIAL' needs 'lookup.partial-cache.max-rows' "
                       "above 0")
    expire = None
    if "lookup.partial-cache.expire-after-write" in opts:
        try:
            expire = duration_ms(opts["lookup.partial-cache.expire-after-write"])
        except ValueError:
            raise SqlError(f"table {table.name}: 'lookup.partial-cache.expire-after-write' must be a duration "
                           f"('10 s', '1 min'), got '{opts['lookup.partial-cache.expire-after-write']}'") from None
    missing = opts.get("lookup.partial-cache.cache-missing-key", "true").lower()
    if missing not in ("true", "false"):
        raise SqlError(f"table {table.name}: 'lookup.partial-cache.cache-missing-key' must be true or false, got "
                       f"'{missing}'")
    full_reload_ms, fixed_rate = _full_cache(table) if cache == "FULL" else (None, False)
    return LookupSettings(rows, expire, missing == "true", number("lookup.max-retries", 3),
                          max(1, number("lookup.async.capacity", 10)), full_reload_ms, fixed_rate)


def _full_cache(table: TableDef) -> tuple[int, bool]:
    """Flink's FULL cache options: (the reload interval in ms, whether it runs at a fixed rate). Only the PERIODIC
    reload strategy (Flink's default); its interval has no default in Flink either."""
    opts = table.options
    strategy = opts.get("lookup.full-cache.reload-strategy", "PERIODIC").upper()
    if strategy != "PERIODIC":
        raise SqlError(f"table {table.name}: 'lookup.full-cache.reload-strategy' must be PERIODIC (TIMED is not "
                       f"supported yet), got '{opts['lookup.full-cache.reload-strategy']}'")
    text = opts.get("lookup.full-cache.periodic-reload.interval")
    if text is None:
        raise SqlError(f"table {table.name}: 'lookup.cache' = 'FULL' needs 'lookup.full-cache.periodic-reload."
                       "interval' ('10 min')")
    try:
        interval = duration_ms(text)
    except ValueError:
        interval = 0
    if interval <= 0:
        raise SqlError(f"table {table.name}: 'lookup.full-cache.periodic-reload.interval' must be a positive "
                       f"duration ('10 s', '1 min'), got '{text}'")
    mode = opts.get("lookup.full-cache.periodic-reload.schedule-mode", "FIXED_DELAY").upper()
    if mode not in ("FIXED_DELAY", "FIXED_RATE"):
        raise SqlError(f"table {table.name}: 'lookup.full-cache.periodic-reload.schedule-mode' must be FIXED_DELAY "
                       f"or FIXED_RATE, got '{opts['lookup.full-cache.periodic-reload.schedule-mode']}'")
    return interval, mode == "FIXED_RATE"


class FullCache:
    """Flink's FULL lookup cache, pure: the whole table indexed by the lookup key, loaded again once
    `reload_ms` passed since the last load began (fixed rate) or ended (fixed delay). The caller passes the
    times and the rows; a key no row has matches nothing."""

    def __init__(self, reload_ms: int, *, fixed_rate: bool) -> None:
        self.reload_ms = reload_ms
        self.fixed_rate = fixed_rate
        self.by_key: dict[Any, list[tuple[Any, ...]]] | None = None
        self.next_load_ms = 0
        self.loads = 0

    def due(self, now_ms: int) -> bool:
        return self.by_key is None or now_ms >= self.next_load_ms

    def load(self, rows: Sequence[tuple[Any, ...]], key_at: Sequence[int], started_ms: int, finished_ms: int) -> None:
        by_key: dict[Any, list[tuple[Any, ...]]] = {}
        for row in rows:
            by_key.setdefault(tuple(row[i] for i in key_at), []).append(row)
        self.by_key = by_key
        self.next_load_ms = (started_ms if self.fixed_rate else finished_ms) + self.reload_ms
        self.loads += 1

    def get(self, key: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        assert self.by_key is not None, "load before get"
        return self.by_key.get(key, [])


class LookupCache:
    """Flink's PARTIAL lookup cache, pure: at most `max_rows` keys (least recently used out first), each kept
    `expire_after_write_ms` after it was put. The caller passes `now_ms`."""

    def __init__(self, max_rows: int, expire_after_write_ms: int | None) -> None:
        self.max_rows = max_rows
        self.expire_after_write_ms = expire_after_write_ms
        self._entries: OrderedDict[Any, tuple[int, Any]] = OrderedDict()

    def get(self, key: Any, now_ms: int) -> tuple[bool, Any]:
        entry = self._entries.get(key)
        if entry is None:
            return False, None
        written, value = entry
        if self.expire_after_write_ms is not None and now_ms - written >= self.expire_after_write_ms:
            del self._entries[key]
            return False, None
        self._entries.move_to_end(key)
        return True, value

    def put(self, key: Any, value: Any, now_ms: int) -> None:
        if self.max_rows <= 0:
            return
        self._entries[key] = (now_ms, value)
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_rows:
            self._entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)


def join_rows(row: tuple[Any, ...], matches: Sequence[tuple[Any, ...]], *, left: bool, width: int
              ) -> list[tuple[Any, ...]]:
    """The lookup join's output for one input row: the row with each matching dimension row; a LEFT join's
    row without a match once, padded with NULLs; an inner join's, nothing."""
    if matches:
        return [(*row, *m) for m in matches]
    return [(*row, *([None] * width))] if left else []


class LookupFunction:
    """`async def __call__(row) -> [joined rows]` for async_map: the dimension rows whose key columns equal the
    row's key (`key_fn`), through the cache, queried on a thread per connection (psycopg2 blocks)."""

    def __init__(self, table: TableDef, key_columns: Sequence[str], key_fn: Callable[[Any], tuple[Any, ...]],
                 *, left: bool, filter_fn: Callable[[Any], Any] | None = None, updating: bool = False) -> None:
        self.dsn = jdbc_dsn(table)
        self.updating = updating  # rows come as (kind, row) pairs: each joined row keeps its row's kind
        self.table_name = _option(table, "table-name")
        self.settings = lookup_settings(table)
        self.columns = [c.name for c in table.physical]
        self.readers = [T.reader(c.type) for c in table.physical]  # type: ignore[arg-type]
        self.key_columns = list(key_columns)
        self.key_fn = key_fn
        self.left = left
        self.filter_fn = filter_fn  # the rest of ON, over the joined row
        self._local: Any = None  # per thread: its connection (made with the executor, at the first lookup)
        self._cache: LookupCache | None = None
        self._full: FullCache | None = None
        self._reloading: asyncio.Lock | None = None
        self._clock = time.monotonic  # read once per lookup, for the caches' expiry and reloads
        self._query: Any = None
        self._executor: ThreadPoolExecutor | None = None
        self.lookups = 0  # queries sent to the server (the cache's misses)
        self._connections: list[Any] = []  # every thread's, closed with the function

    extras = ("postgres",)

    def check_at_submit(self, context: Any) -> None:
        """The coordinator's submit check (runtime/graph/admission.py): the table, its columns and the SELECT
        privilege, or one line raised."""
        check_table(self.dsn, self.table_name, self.columns, f"lookup table {self.table_name}")

    def _whole_table(self) -> Any:
        sql = pgc.psycopg2().sql
        schema, name = pgc.split_table(self.table_name)
        return sql.SQL("SELECT {} FROM {}.{}").format(sql.SQL(", ").join(map(sql.Identifier, self.columns)),
                                                      sql.Identifier(schema), sql.Identifier(name))

    def _statement(self) -> Any:
        sql = pgc.psycopg2().sql
        schema, name = pgc.split_table(self.table_name)
        where = sql.SQL(" AND ").join(sql.SQL("{} = %s").format(sql.Identifier(c)) for c in self.key_columns)
        return sql.SQL("SELECT {} FROM {}.{} WHERE {}").format(
            sql.SQL(", ").join(map(sql.Identifier, self.columns)), sql.Identifier(schema), sql.Identifier(name), where)

    def _fetch(self, key: tuple[Any, ...] | None) -> list[tuple[Any, ...]]:
        """On a worker thread: its own connection (opened on first use, dropped on an error: the retry opens
        a new one). `key` None: the whole table (the FULL cache's load)."""
        conn = getattr(self._local, "conn", None)
        if conn is None or conn.closed:
            conn = self._local.conn = pgc.connect(self.dsn)
            conn.autocommit = True
            self._connections.append(conn)
        try:
            with conn.cursor() as cur:
                if key is None:
                    cur.execute(self._whole_table())
                else:
                    cur.execute(self._query, key)
                rows = cur.fetchall()
        except Exception:
            self._local.conn = None
            try:
                conn.close()
            except Exception:  # a broken connection: nothing more to lose
                pass
            raise
        readers = self.readers
        return [tuple(read(v) for read, v in zip(readers, r, strict=True)) for r in rows]

    def close(self) -> None:
        """The task ends (async_map closes its function): the lookup threads stop and their connections close."""
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None
        for conn in self._connections:
            try:
                conn.close()
            except Exception:  # a broken connection: nothing more to lose
                pass
        self._connections.clear()
        self._query = None  # a function used again (a restart in the same process) starts afresh

    async def __call__(self, record: Any) -> list[Any]:
        if self.updating:  # a retraction looks the key up again, as Flink's lookup join over a changelog does
            kind, row = record
            return [(kind, joined) for joined in await self._joined(tuple(row))]
        return await self._joined(record)

    async def _full_loaded(self, now_ms: int) -> None:
        """The FULL cache loaded (the first lookup waits for it) and loaded again when its interval passed: one
        load at a time, the lookups waiting meanwhile see the table as loaded."""
        full, lock = self._full, self._reloading
        assert full is not None and lock is not None
        if not full.due(now_ms):
            return
        async with lock:
            if full.due(now_ms):
                rows = await asyncio.get_running_loop().run_in_executor(self._executor, self._fetch, None)
                self.lookups += 1
                full.load(rows, [self.columns.index(c) for c in self.key_columns], now_ms,
                          int(self._clock() * 1000))

    async def _joined(self, row: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        key = self.key_fn(row)
        if any(k is None for k in key):  # NULL = anything is unknown: no match
            matches: list[tuple[Any, ...]] = []
        else:
            if self._query is None:
                self._query = self._statement()
                s = self.settings
                self._cache = LookupCache(s.cache_rows, s.expire_after_write_ms) if s.cache_rows else None
                if s.full_reload_ms is not None:
                    self._full = FullCache(s.full_reload_ms, fixed_rate=s.full_fixed_rate)
                    self._reloading = asyncio.Lock()
                # threads of its own (not the loop's default executor, which restores use): one connection
                # each, closed with them when this function is dropped (a task that ends or restarts)
                self._local = threading.local()
                self._executor = ThreadPoolExecutor(max_workers=s.capacity,
                                                    thread_name_prefix=f"lookup-{self.table_name}")
                weakref.finalize(self, self._executor.shutdown, wait=False)
            now_ms = int(self._clock() * 1000)
            cache = self._cache
            hit, cached = cache.get(key, now_ms) if cache is not None else (False, [])
            if self._full is not None:
                await self._full_loaded(now_ms)
                matches = self._full.get(key)
            elif hit:
                matches = list(cached)
            else:
                self.lookups += 1
                matches = await asyncio.get_running_loop().run_in_executor(self._executor, self._fetch, key)
                if cache is not None and (matches or self.settings.cache_missing):
                    cache.put(key, matches, now_ms)
        width = len(self.columns)
        if self.filter_fn is not None:
            matches = [m for m in matches if self.filter_fn((*row, *m))]
        return join_rows(row, matches, left=self.left, width=width)
