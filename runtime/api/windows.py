"""Windows on keyed streams: `stream.key_by(k).window(TumblingEventTimeWindows(60_000)).count()`.

A window operator is a KeyedProcessFunction (`WindowOperator`) over the runtime's keyed state and timers, so
windows checkpoint, restore and rescale exactly like any keyed state, with no code of their own for it. Per key
the state holds the open windows as [start, end, accumulator] entries; a window fires from an event-time timer at
`end - 1` (when the watermark passes the window) and its state is dropped at `end - 1 + allowed_lateness_ms`.

Every firing emits one row `(key, start, end, result)` (end exclusive) with the event time `end - 1`.

Lateness (event time), deterministic because watermarks are (runtime/api/time.py): a record is dropped from a
window w when `w.end - 1 + allowed_lateness_ms <= current watermark` at the time it arrives; dropped from all its
windows, it goes to the side output `LATE_DATA` (`windowed_stream.side_output(LATE_DATA)`). A record added to a
window the watermark has already passed (within the allowed lateness) fires that window again at once with the
updated result, as Flink's event-time trigger does. A session record is late when the session it would open,
[ts, ts + gap), is late; it is then not merged into an older session either.

State values are immutable by contract (a snapshot copies tables, not values), so `process` and `on_timer` build
new lists on every change, and `process` windows keep their elements in chunks so that adding one copies at most
one chunk. The batch loop of tumbling and sliding event-time windows is the exception, under copy on write: a key's
windows it built since the last snapshot (`_owned`) are its own, and it updates their accumulators in place;
`before_snapshot` gives them up, so the next record of the key copies them before changing anything.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable
from dataclasses import dataclass
from operator import itemgetter
from typing import TYPE_CHECKING, Any

from runtime.api.functions import KeyedProcessFunction, OutputTag
from runtime.api.runtime_hooks import RuntimeHooks
from runtime.api.state import AggregateFunction

if TYPE_CHECKING:
    from runtime.api.stream import DataStream, KeyedStream

LATE_DATA = OutputTag("late-data")
"""The side output of a window operator that receives the records too late for all their windows."""

_WINDOWS = "windows"  # the keyed-state table of a window operator (its own node: no user state beside it)
_CHUNK = 256  # elements per chunk of a `process` window
_end = itemgetter(1)  # a window entry's end: a key's windows of an assigner that does not merge are in its order
_session_start = itemgetter(0)  # a session's start: a key's sessions are in its order (they do not overlap)


@dataclass(frozen=True)
class Window:
    """[start, end) in milliseconds; `max_timestamp` (end - 1) is when it fires."""

    start: int
    end: int

    @property
    def max_timestamp(self) -> int:
        """The last millisecond in the window: it fires when the watermark (or clock) passes it."""
        return self.end - 1


class WindowAssigner:
    """Which windows a record with timestamp `ts` belongs to."""

    event_time: bool = True
    merging: bool = False

    def assign(self, ts: int) -> list[tuple[int, int]]:
        """The windows, as (start, end), that a record with timestamp `ts` belongs to, oldest first."""
        raise NotImplementedError


def _positive(name: str, value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{name} must be a positive integer of milliseconds, got {value!r}")
    return value


@dataclass(frozen=True)
class TumblingEventTimeWindows(WindowAssigner):
    """Windows of `size_ms` back to back: [offset + n*size, offset + (n+1)*size)."""

    size_ms: int
    offset_ms: int = 0

    def __post_init__(self) -> None:
        _positive("size_ms", self.size_ms)
        if not isinstance(self.offset_ms, int) or not 0 <= self.offset_ms < self.size_ms:
            raise ValueError(f"offset_ms must be an integer in [0, size_ms), got {self.offset_ms!r}")

    def assign(self, ts: int) -> list[tuple[int, int]]:
        """The one window containing `ts`."""
        start = ts - (ts - self.offset_ms) % self.size_ms
        return [(start, start + self.size_ms)]


@dataclass(frozen=True)
class SlidingEventTimeWindows(WindowAssigner):
    """Windows of `size_ms` starting every `slide_ms`: a record is in about size/slide of them."""

    size_ms: int
    slide_ms: int
    offset_ms: int = 0

    def __post_init__(self) -> None:
        _positive("size_ms", self.size_ms)
        _positive("slide_ms", self.slide_ms)
        if not isinstance(self.offset_ms, int) or not 0 <= self.offset_ms < self.slide_ms:
            raise ValueError(f"offset_ms must be an integer in [0, slide_ms), got {self.offset_ms!r}")

    def assign(self, ts: int) -> list[tuple[int, int]]:
        """Every window containing `ts`, oldest first."""
        last = ts - (ts - self.offset_ms) % self.slide_ms
        out = []
        start = last
        while start > ts - self.size_ms:
            out.append((start, start + self.size_ms))
            start -= self.slide_ms
        out.reverse()  # oldest first: the order they fire in
        return out


@dataclass(frozen=True)
class EventTimeSessionWindows(WindowAssigner):
    """A session per key: records closer than `gap_ms` to each other are in one window [first, last + gap)."""

    gap_ms: int
    merging = True

    def __post_init__(self) -> None:
        _positive("gap_ms", self.gap_ms)

    def assign(self, ts: int) -> list[tuple[int, int]]:
        """A session of its own, [ts, ts + gap); overlapping sessions of a key merge."""
        return [(ts, ts + self.gap_ms)]


@dataclass(frozen=True)
class TumblingProcessingTimeWindows(TumblingEventTimeWindows):
    """Tumbling windows on the wall clock of the operator (not repeatable after a failure, by nature)."""

    event_time = False


@dataclass(frozen=True)
class SlidingProcessingTimeWindows(SlidingEventTimeWindows):
    """Sliding windows on the wall clock of the operator."""

    event_time = False


@dataclass(frozen=True)
class ProcessingTimeSessionWindows(EventTimeSessionWindows):
    """Sessions on the wall clock of the operator."""

    event_time = False


class CountAggregate(AggregateFunction[Any, int, int]):
    """Counts the records of a window (`WindowedStream.count`)."""

    def create_accumulator(self) -> int:
        """No records yet."""
        return 0

    def add(self, value: Any, accumulator: int) -> int:
        """One more record."""
        return accumulator + 1

    def get_result(self, accumulator: int) -> int:
        """The count."""
        return accumulator

    def merge(self, a: int, b: int) -> int:
        """The count of both (merged sessions)."""
        return a + b


# -- how a window's contents grow: one small strategy object per kind of window function -----------------------


class _Contents:
    needs_window = False  # result() reads its window (a `process` window): the others get None, not a new Window

    def first(self, record: Any) -> Any:
        raise NotImplementedError

    def add(self, acc: Any, record: Any) -> Any:
        raise NotImplementedError

    def add_record(self, record: Any, acc: Any) -> Any:
        """`add` in an AggregateFunction's argument order (the batch loop calls an aggregate's `add` directly)."""
        return self.add(acc, record)

    def merge(self, a: Any, b: Any) -> Any:
        raise NotImplementedError

    def result(self, key: Any, window: Window | None, acc: Any) -> Any:
        raise NotImplementedError


class _Reduced(_Contents):
    def __init__(self, fn: Callable[[Any, Any], Any]) -> None:
        self.fn = fn

    def first(self, record: Any) -> Any:
        return record

    def add(self, acc: Any, record: Any) -> Any:
        return self.fn(acc, record)

    def merge(self, a: Any, b: Any) -> Any:
        return self.fn(a, b)

    def result(self, key: Any, window: Window | None, acc: Any) -> Any:
        return acc


class _Aggregated(_Contents):
    def __init__(self, agg: AggregateFunction) -> None:
        self.agg = agg

    def first(self, record: Any) -> Any:
        return self.agg.add(record, self.agg.create_accumulator())

    def add(self, acc: Any, record: Any) -> Any:
        return self.agg.add(record, acc)

    def merge(self, a: Any, b: Any) -> Any:
        return self.agg.merge(a, b)

    def result(self, key: Any, window: Window | None, acc: Any) -> Any:
        return self.agg.get_result(acc)


class _Elements(_Contents):
    """All elements, as a list of chunks of at most _CHUNK (so adding one copies one chunk, not all)."""

    needs_window = True

    def __init__(self, fn: Callable[[Any, Window, list[Any]], Any]) -> None:
        self.fn = fn

    def first(self, record: Any) -> Any:
        return [[record]]

    def add(self, acc: Any, record: Any) -> Any:
        last = acc[-1]
        if len(last) < _CHUNK:
            return [*acc[:-1], [*last, record]]
        return [*acc, [record]]

    def merge(self, a: Any, b: Any) -> Any:
        return [*a, *b]

    def result(self, key: Any, window: Window | None, acc: Any) -> Any:
        assert window is not None
        return self.fn(key, window, [r for chunk in acc for r in chunk])


class WindowOperator(KeyedProcessFunction, RuntimeHooks):
    """Assigns records to windows, keeps their contents in keyed state and fires them from timers."""

    def __init__(self, assigner: WindowAssigner, contents: _Contents, allowed_lateness_ms: int = 0) -> None:
        if not isinstance(assigner, WindowAssigner):
            raise ValueError(f"{assigner!r} is not a window assigner (e.g. TumblingEventTimeWindows(60_000))")
        if not isinstance(allowed_lateness_ms, int) or allowed_lateness_ms < 0:
            raise ValueError(f"allowed_lateness_ms must be an integer >= 0, got {allowed_lateness_ms!r}")
        if not assigner.event_time and allowed_lateness_ms:
            raise ValueError("allowed_lateness_ms applies to event-time windows only")
        self.assigner = assigner
        self.contents = contents
        self.lateness = allowed_lateness_ms
        # key -> its windows as a list of [start, end, accumulator] lists that the batch loop made since the last
        # snapshot (the memory path only): the very object in the state table, held by no snapshot, so the loop
        # changes it in place. Whatever else writes a key's windows (`process`, `on_timer`) takes it out first.
        self._owned: dict[Any, list[list[Any]]] = {}
        # event-time sessions without a lateness: timers derived from the sessions, the batch loop grows them, and a
        # session it grows keeps the timer it opened with (`on_timer` moves it to the session's end when it comes
        # up early). The one test of it: an assigner of the user's that merges keeps per-key timers
        self._lazy_session_timers = type(assigner) is EventTimeSessionWindows and not allowed_lateness_ms

    def open(self, ctx: Any) -> None:
        """Keeps the key's open windows in one value state."""
        self.windows = ctx.value_state(_WINDOWS, default=())

    # -- event-time timers as one index per timestamp, derived from the windows ---------------------------

    def event_timers_from_state(self, ctx: Any) -> Callable[[dict[Any, Any]], list[tuple[Any, int]]] | None:
        """For the runtime (runtime/execution/operators/kinds.py): event-time windows that do not merge, and
        sessions without an allowed lateness, keep no timer table, their timers follow from the windows
        (`_derive_timers`), and the task fires them from an index per timestamp (runtime/execution/timers.py,
        TimerIndex): registering and deleting a timer is a set operation there, where the per-key queue packs the
        key and pushes a heap entry (a session that grows moves its timer with every record). None: per-key timers
        (sessions with a lateness, whose fired sessions carry no mark to derive from; processing time)."""
        if not self.assigner.event_time or (self.assigner.merging and not self._lazy_session_timers):
            return None
        table = ctx.value_state(_WINDOWS, default=())._table
        return lambda legacy: self._derive_timers(table, legacy)

    def _derive_timers(self, table: Any, legacy: dict[Any, tuple[int, ...]]) -> list[tuple[Any, int]]:
        """Every (key, timestamp) of a timer the windows in `table` imply: `end - 1` for a window not fired yet
        (an entry of three), `end - 1 + allowed_lateness_ms` for every window when there is a lateness.

        A checkpoint of the earlier form (one timer per key and window, in `legacy`, entries of three whether
        fired or not) is converted here: a window whose `end - 1` timer is still registered has not fired (or
        fires again at that timer, as `on_timer` did); any other one has, and gets its fired mark."""
        self._owned.clear()  # a restore refilled the table in place: what the batch loop owned is gone
        if self._lazy_session_timers:  # every session is open, its timer at end - 1
            legacy.clear()  # the per-key form held exactly those
            return [(key, entry[1] - 1) for key, entries in table.items() for entry in entries]
        if legacy:
            for key, entries in list(table.items()):
                stamps = legacy.get(key, ())
                table[key] = tuple(tuple(e) if len(e) > 3 else (e[0], e[1], e[2]) if e[1] - 1 in stamps
                                   else (e[0], e[1], e[2], True) for e in entries)
            legacy.clear()
        for key, entries in list(table.items()):
            ends = [e[1] for e in entries]
            if ends != sorted(ends):  # an earlier version's `process` appended a late window it opened
                table[key] = sorted(entries, key=_end)
        lateness = self.lateness
        out = []
        for key, entries in table.items():
            for entry in entries:
                end = entry[1]
                if len(entry) == 3:
                    out.append((key, end - 1))
                if lateness:
                    out.append((key, end - 1 + lateness))
        return out

    # -- records --------------------------------------------------------------------------

    def process(self, record: Any, ctx: Any) -> None:
        """Add the record to its windows (a window the watermark passed fires again); a record too late for all
        of them goes to LATE_DATA."""
        event_time = self.assigner.event_time
        if event_time:
            ts = ctx.timestamp
            if ts is None:
                raise ValueError("event-time windows need a source with watermarks= (runtime/api/time.py)")
            watermark = ctx.current_watermark
        else:
            ts = ctx.timers.current_processing_time()
            watermark = ts - 1  # nothing is late on the wall clock; a window is due once its end has passed
        self._owned.pop(ctx.current_key, None)  # this writes a new value: the batch loop copies it before changing it
        entries = list(self.windows.value())
        if self.assigner.merging:
            added = self._add_to_session(entries, record, ts, watermark, ctx)
        else:
            added = self._add_to_windows(entries, record, ts, watermark, ctx)
        if added:
            self.windows.update(entries)
        elif event_time:
            ctx.output(LATE_DATA, record)

    def _is_late(self, end: int, watermark: int) -> bool:
        return self.assigner.event_time and end - 1 + self.lateness <= watermark

    def _add_to_windows(self, entries: list[Any], record: Any, ts: int, watermark: int, ctx: Any) -> bool:
        added = False
        contents = self.contents
        fired_mark = self.assigner.event_time  # event time: a window opened after the watermark passed it is fired
        for start, end in self.assigner.assign(ts):
            if self._is_late(end, watermark):
                continue
            added = True
            for i, entry in enumerate(entries):
                if entry[0] == start and entry[1] == end:
                    acc = contents.add(entry[2], record)
                    entries[i] = (start, end, acc, *entry[3:])
                    break
            else:
                acc = contents.first(record)
                entries.insert(bisect_left(entries, end, key=_end),  # in order of their ends, as the batch loop's
                               (start, end, acc, True) if fired_mark and end - 1 <= watermark else (start, end, acc))
                self._register(ctx, end, watermark)
            if end - 1 <= watermark:  # the watermark passed it already: fire again with this record (late firing)
                self._emit(ctx, start, end, acc)
        return added

    def _add_to_session(self, entries: list[list[Any]], record: Any, ts: int, watermark: int, ctx: Any) -> bool:
        ((start, end),) = self.assigner.assign(ts)
        if self._is_late(end, watermark):
            return False
        contents = self.contents
        acc = contents.first(record)
        merged_away = []
        keep = []
        for entry in entries:
            s, e, other = entry
            if s < end and start < e:  # overlaps: merge (older contents first)
                acc = contents.merge(other, acc) if s <= start else contents.merge(acc, other)
                start, end = min(start, s), max(end, e)
                merged_away.append(e)
            else:
                keep.append(entry)
        keep.append([start, end, acc])
        # a timer is (key, timestamp): drop the merged windows' timers unless a remaining window shares one
        needed = {t for _, e, _ in keep for t in self._timer_times(e)}
        for e in merged_away:
            for t in self._timer_times(e):
                if t not in needed:
                    self._delete_timer(ctx, t)
        keep.sort(key=lambda entry: entry[0])
        entries[:] = keep
        self._register(ctx, end, watermark)
        if end - 1 <= watermark:
            self._emit(ctx, start, end, acc)
        return True

    # -- timers ---------------------------------------------------------------------------

    def _register(self, ctx: Any, end: int, watermark: int) -> None:
        timers = ctx.timers
        if not self.assigner.event_time:
            timers.register_processing_time(end - 1)
            return
        if end - 1 > watermark:
            timers.register_event_time(end - 1)  # fire
        if self.lateness:
            timers.register_event_time(end - 1 + self.lateness)  # clean up

    def _timer_times(self, end: int) -> tuple[int, ...]:
        if self.lateness:
            return end - 1, end - 1 + self.lateness
        return (end - 1,)

    def _delete_timer(self, ctx: Any, ts: int) -> None:
        if self.assigner.event_time:
            ctx.timers.delete_event_time(ts)
        else:
            ctx.timers.delete_processing_time(ts)

    def on_timer(self, timestamp: int, ctx: Any) -> None:
        """Fire the key's windows whose last millisecond is `timestamp`; drop those past their allowed lateness.
        An event-time window kept for its lateness after firing gets its fired mark (a fourth item)."""
        key = ctx.current_key
        table = self.windows._table
        entries = table.get(key)
        if not entries:
            return
        if self._lazy_session_timers:
            self._fire_session(timestamp, ctx, key, entries)
            return
        owned = self._owned
        event_time = self.assigner.event_time
        lateness = self.lateness if event_time else 0
        mark = event_time and not self.assigner.merging
        if len(entries) == 1:  # the common case of tumbling windows: one open window per key
            entry = entries[0]
            end = entry[1]
            if end - 1 == timestamp:
                self._emit(ctx, entry[0], end, entry[2])
            if end - 1 + lateness <= timestamp:
                table.pop(key, None)
                owned.pop(key, None)
            elif mark and end - 1 == timestamp and len(entry) == 3:
                table[key] = ((entry[0], end, entry[2], True),)
                owned.pop(key, None)  # a new value: the batch loop copies it before changing it
            return
        if not lateness:  # one pass: a window due fires and goes, no other is past (none kept needs a mark)
            oldest = entries[0]
            if mark and oldest[1] - 1 == timestamp:
                # event-time windows that do not merge, in order (the batch loop keeps them so): the oldest is the
                # one due and every other one ends later (ends are unique, and an earlier window's timer has fired
                # and dropped it), so the rest stay as they are, a key with many open windows (a lagging source
                # subtask, rare watermarks) pays no pass over them
                self._emit(ctx, oldest[0], oldest[1], oldest[2])
                mine = owned.get(key)
                if mine is not None and mine is entries:  # the batch loop's own list (no snapshot holds it)
                    del mine[0]
                else:
                    table[key] = entries[1:]
                return
            kept = []
            for entry in entries:
                last_ms = entry[1] - 1
                if last_ms == timestamp:
                    self._emit(ctx, entry[0], entry[1], entry[2])
                elif last_ms > timestamp:
                    kept.append(entry)
            if not kept:
                table.pop(key, None)
                owned.pop(key, None)
            elif len(kept) != len(entries):
                mine = owned.get(key)
                if mine is not None and mine is entries:  # the batch loop's own list (no snapshot holds it)
                    mine[:] = kept
                else:
                    table[key] = kept
            return
        owned.pop(key, None)  # a new value (or none): the batch loop copies it before changing it
        for entry in entries:
            if entry[1] - 1 == timestamp:
                self._emit(ctx, entry[0], entry[1], entry[2])
        kept = [(e[0], e[1], e[2], True) if mark and e[1] - 1 == timestamp and len(e) == 3 else e
                for e in entries if e[1] - 1 + lateness > timestamp]
        if kept:
            if kept != list(entries):
                table[key] = kept
        else:
            table.pop(key, None)

    def _fire_session(self, timestamp: int, ctx: Any, key: Any, entries: Any) -> None:
        """`on_timer` for event-time sessions without a lateness, whose timers may come up early: a session the
        batch loop grows keeps the timer it opened with, at its first record + gap - 1 (`_lazy_session_timers`).

        The key's sessions are ordered by start, so by end too (they do not overlap), and every one ending before
        `timestamp` has fired at its own timer: only the oldest can be due. A timer that comes up early stood for
        the session that spans [timestamp - gap + 1, timestamp + 1) (it opened with a record at or after its
        start, and has grown since): at most one, the last starting by then, and the timer moves to its end.
        Anything else is a timer a merge left behind (`process` registers the merged session's end)."""
        oldest = entries[0]
        if oldest[1] - 1 == timestamp:
            self._emit(ctx, oldest[0], oldest[1], oldest[2])
            table, owned = self.windows._table, self._owned
            if len(entries) == 1:
                table.pop(key, None)
                owned.pop(key, None)
            else:
                mine = owned.get(key)
                if mine is not None and mine is entries:  # the batch loop's own list (no snapshot holds it)
                    del mine[0]
                else:
                    table[key] = entries[1:]
            return  # the timer of a session that ends here stands for no other (sessions do not overlap)
        gap = self.assigner.gap_ms  # type: ignore[attr-defined]
        i = bisect_right(entries, timestamp - gap + 1, key=_session_start) - 1
        if i >= 0 and entries[i][1] - 1 > timestamp:
            ctx.timers.event.register(key, entries[i][1] - 1)

    def _emit(self, ctx: Any, start: int, end: int, acc: Any) -> None:
        key = ctx.current_key
        contents = self.contents
        window = Window(start, end) if contents.needs_window else None
        ctx.emit((key, start, end, contents.result(key, window, acc)))

    # -- a batch at once (event time, windows that do not merge) --------------------------------------------

    def timed_batch_runner(self, key_fn: Callable[[Any], Any], ctx: Any,
                           after: Callable[[], None]) -> Callable[[list[Any]], None] | None:
        """For the runtime (runtime/execution/operators/kinds.py): a loop over a list of (timestamp, record)
        elements that does what `process` per element does, or None where only `process` applies (sessions,
        processing time, assigners of the user's).

        Why: `process` rebuilds the key's window list through several calls per record. The loop handles the
        common record in line: none of its windows has been passed by the watermark, so it is not late, fires
        nothing and only adds to (or opens) windows. Any other record (one the watermark passed some window of,
        one without a timestamp) goes through `process` with the context set as the per-record loop sets it, in
        its place in the batch. The watermark does not move within a batch (markers are between batches), and
        results are the same as `process` per record, in the same order.

        Accumulators change in place (copy on write, as the interval join's buffers): on the memory path a key's
        windows are a list of [start, end, accumulator] lists, and once the loop has made that list for the key
        since the last snapshot (`_owned`), a record only replaces the accumulator of its window in it: no new
        entry, no new list, no state write. The first record of a key after a snapshot (`before_snapshot`) copies
        the windows first, so the snapshot's shallow copy of the table keeps what it saw. On a state backend
        (values stored as bytes) every change is a write of a fresh list."""
        assigner = self.assigner
        kind = type(assigner)
        sessions = self._lazy_session_timers
        if kind is not TumblingEventTimeWindows and kind is not SlidingEventTimeWindows and not sessions:
            return None  # sessions with a lateness, processing time, an assigner of the user's: per record
        table = ctx.value_state(_WINDOWS, default=())._table  # the table `open` reads through self.windows
        owned: dict[Any, list[list[Any]]] | None = self._owned if type(table) is dict else None
        if sessions:
            return self._session_batch_runner(key_fn, ctx, after, table, owned)
        owned_get = owned.get if owned is not None else _nothing_owned
        contents = self.contents
        first = contents.first
        # a record into an accumulator in one call: the aggregate's own add where there is one (SQL's generated
        # accumulator, a user's AggregateFunction), in line for a count
        fold = contents.agg.add if isinstance(contents, _Aggregated) else contents.add_record
        counting = isinstance(contents, _Aggregated) and type(contents.agg) is CountAggregate
        lateness = self.lateness
        process = self.process
        size, offset = assigner.size_ms, assigner.offset_ms  # type: ignore[attr-defined]
        # sliding: windows start every `step` ms (tumbling: one window, a step of its size)
        step = assigner.slide_ms if kind is SlidingEventTimeWindows else size  # type: ignore[attr-defined]

        def slow(t: Any, record: Any, key: Any) -> None:
            ctx.current_key = key
            ctx.timestamp = t
            process(record, ctx)

        register = ctx.timers.event.register  # the operator's TimerIndex (kinds.py puts it in place first)

        def opened(key: Any, end: int) -> None:
            register(key, end - 1)  # fire
            if lateness:
                register(key, end - 1 + lateness)  # clean up

        def writable(key: Any) -> list[list[Any]]:
            return _writable(table, owned, key)

        def add_to(key: Any, entries: list[list[Any]], start: int, end: int, record: Any) -> None:
            """Add the record to window [start, end) of the key, which the watermark has not passed (so its entry,
            if any, has no fired mark), opening it if it is not there."""
            # a key's windows are in order of their ends (this loop, `process` and a restore keep them so), mostly
            # one after another, one step apart: look first where that puts this one, else by bisection (a key with
            # many open windows: one source subtask far ahead of another, whose windows all stay open until the
            # watermark passes them; a scan of them per new window made the loop quadratic in that lead)
            n = len(entries)
            i = n - 1 - (entries[-1][1] - end) // step if n else 0
            if not (0 <= i < n and entries[i][1] == end):
                i = bisect_left(entries, end, key=_end)
            if i < n and entries[i][1] == end:
                entry = entries[i]
                entry[2] = entry[2] + 1 if counting else fold(record, entry[2])
                return
            entries.insert(i, [start, end, first(record)])  # where its end puts it
            opened(key, end)

        def run_tumbling(elements: list[Any]) -> None:
            after_wm = ctx.current_watermark + 1  # a window whose end is at most this has been passed
            for t, record in elements:
                key = key_fn(record)
                if t is None:
                    slow(t, record, key)
                    continue
                start = t - (t - offset) % size
                end = start + size
                if end <= after_wm:
                    slow(t, record, key)
                    continue
                entries = owned_get(key)
                if entries is not None:
                    last = entries[-1]
                    if last[1] == end:  # in order: the newest window, changed in place
                        last[2] = last[2] + 1 if counting else fold(record, last[2])
                        continue
                    # behind the newest (a source subtask that lags the others: about half the records at Flink's
                    # watermark cadence): where windows in order, one size apart, put it
                    n = len(entries)
                    i = n - 1 - (last[1] - end) // size
                    if 0 <= i < n and entries[i][1] == end:
                        entry = entries[i]
                        entry[2] = entry[2] + 1 if counting else fold(record, entry[2])
                        continue
                else:
                    entries = writable(key)
                add_to(key, entries, start, end, record)
                if owned is None:
                    table[key] = entries  # a backend stores the value, not the object
            after()

        def run_sliding(elements: list[Any]) -> None:
            after_wm = ctx.current_watermark + 1
            for t, record in elements:
                key = key_fn(record)
                if t is None:
                    slow(t, record, key)
                    continue
                # the windows containing t, oldest first (what `assign` lists): starts one step apart from the
                # newest, `last`, down to the oldest one that still ends after t
                last = t - (t - offset) % step
                start = last - (last - t + size - 1) // step * step
                # in no window (a slide longer than the size: late data), or late for the oldest (it ends first)
                if start > last or start + size <= after_wm:
                    slow(t, record, key)
                    continue
                entries = owned_get(key)
                if entries is None:
                    entries = writable(key)
                # the record's windows are consecutive, as a key's open windows mostly are: find where the oldest
                # is, then walk both; a window not where that puts it (missing, out of order) goes through add_to
                n = len(entries)
                end = start + size
                i = n - 1 - (entries[-1][1] - end) // step if n else 0
                while start <= last:
                    if 0 <= i < n and entries[i][1] == end:
                        entry = entries[i]
                        entry[2] = entry[2] + 1 if counting else fold(record, entry[2])
                    else:
                        add_to(key, entries, start, end, record)
                        n = len(entries)
                        i = n - 1 - (entries[-1][1] - end) // step
                    i += 1
                    start += step
                    end += step
                if owned is None:
                    table[key] = entries
            after()

        return run_tumbling if kind is TumblingEventTimeWindows else run_sliding

    def _session_batch_runner(self, key_fn: Callable[[Any], Any], ctx: Any, after: Callable[[], None], table: Any,
                              owned: dict[Any, list[list[Any]]] | None) -> Callable[[list[Any]], None]:
        """`timed_batch_runner`'s loop for event-time sessions without an allowed lateness (their timers derived
        from the sessions, so moving one is a set operation on the operator's TimerIndex).

        A key's sessions are kept ordered by start and never overlap. The common record starts no earlier than
        the key's newest session: no older session can reach it, so it either falls inside the newest one (which
        takes it, and ends `gap` after it if that is later; its timer stays, see `_lazy_session_timers`) or
        after it (a session of its own, with its timer). A record before the newest session's start (a source
        subtask that lags the other: at Flink's watermark cadence a key holds many sessions) is placed by the
        starts: it joins the session before it, or the one after it (which then starts at the record), or opens
        one between them. Its session not passed by the watermark, it is not late and fires nothing. Any other
        record (one that bridges two sessions, late, without a timestamp) goes through `process` in its place, as
        the per-record loop would. Accumulators change in place under copy on write, as in the tumbling loop."""
        gap = self.assigner.gap_ms  # type: ignore[attr-defined]
        owned_get = owned.get if owned is not None else _nothing_owned
        contents = self.contents
        first, merge = contents.first, contents.merge
        counting = isinstance(contents, _Aggregated) and type(contents.agg) is CountAggregate
        process = self.process
        register = ctx.timers.event.register  # the operator's TimerIndex (kinds.py puts it in place first)

        def add_before_newest(key: Any, entries: list[list[Any]], t: int, end: int, record: Any) -> bool:
            """Add a record before the newest session's start; False (nothing changed) if it bridges two."""
            i = bisect_right(entries, t, key=_session_start) - 1  # the last session starting at or before t
            before = entries[i] if i >= 0 else None
            after_it = entries[i + 1]  # there is one: the newest starts after t
            joins_before = before is not None and t < before[1]
            if after_it[0] < end:  # the one after starts within the gap: it starts at t now (its end is later)
                if joins_before:
                    return False
                after_it[0] = t
                after_it[2] = after_it[2] + 1 if counting else merge(first(record), after_it[2])
            elif joins_before:
                assert before is not None
                before[2] = before[2] + 1 if counting else merge(before[2], first(record))
                if end > before[1]:
                    before[1] = end  # its timer stays (as the newest's)
            else:
                entries.insert(i + 1, [t, end, 1 if counting else first(record)])
                register(key, end - 1)
            return True

        def run_sessions(elements: list[Any]) -> None:
            after_wm = ctx.current_watermark + 1  # a session whose end is at most this has been passed
            for t, record in elements:
                key = key_fn(record)
                end = None if t is None else t + gap
                if end is not None and end > after_wm:
                    entries = owned_get(key)
                    if entries is None:
                        entries = _writable(table, owned, key)
                    newest = entries[-1] if entries else None
                    if newest is None or t >= newest[1]:  # after the newest session: one of its own
                        entries.append([t, end, 1 if counting else first(record)])
                        register(key, end - 1)
                    elif t >= newest[0]:  # inside the newest session: it takes the record (as `process` merges)
                        newest[2] = newest[2] + 1 if counting else merge(newest[2], first(record))
                        if end > newest[1]:
                            # its timer stays where it is, at or before its end: when it comes up, `on_timer`
                            # moves it to the end (a move per firing, not one per record)
                            newest[1] = end
                    elif not add_before_newest(key, entries, t, end, record):
                        end = None  # it bridges two sessions: per record
                    if end is not None:
                        if owned is None:
                            table[key] = entries  # a backend stores the value, not the object
                        continue
                ctx.current_key = key
                ctx.timestamp = t
                process(record, ctx)
            after()

        return run_sessions

    def before_snapshot(self) -> None:
        """For the runtime, at every snapshot's synchronous part, before the tables are copied: the memory path's
        snapshot is a shallow copy, so from now on the batch loop copies a key's windows before it changes them
        (copy on write, as Flink's CopyOnWriteStateMap)."""
        self._owned.clear()


def _writable(table: Any, owned: dict[Any, list[list[Any]]] | None, key: Any) -> list[list[Any]]:
    """The key's windows as a list of lists the batch loop may change: a copy of the stored ones (a snapshot may
    hold those), in the table and owned (on the memory path) from now until the next snapshot."""
    stored = table.get(key)
    entries = [list(e) for e in stored] if stored else []
    if owned is not None:
        table[key] = entries
        owned[key] = entries
    return entries


def _nothing_owned(key: Any) -> None:
    """On a state backend the batch loop owns nothing: every change is written."""
    return None


class WindowedStream:
    """A keyed stream cut into windows; finish it with `reduce`, `aggregate`, `count` or `process`."""

    def __init__(self, keyed: KeyedStream, assigner: WindowAssigner, allowed_lateness_ms: int) -> None:
        self._keyed = keyed
        self._assigner = assigner
        self._lateness = allowed_lateness_ms
        WindowOperator(assigner, _Reduced(lambda a, b: a), allowed_lateness_ms)  # check the arguments now

    def _finish(self, contents: _Contents, parallelism: int | None, name: str | None, default: str) -> DataStream:
        operator = WindowOperator(self._assigner, contents, self._lateness)
        return self._keyed.process(operator, parallelism=parallelism, name=name or default)

    def reduce(self, fn: Callable[[Any, Any], Any], *, parallelism: int | None = None,
               name: str | None = None) -> DataStream:
        """result = fn(...fn(fn(r1, r2), r3)..., rn) over the window's records, computed as they arrive."""
        return self._finish(_Reduced(fn), parallelism, name, "window-reduce")

    def aggregate(self, agg: AggregateFunction, *, parallelism: int | None = None,
                  name: str | None = None) -> DataStream:
        """result = agg.get_result(accumulator), the accumulator built with agg.add as records arrive."""
        if not isinstance(agg, AggregateFunction):
            raise ValueError(f"{agg!r} is not an AggregateFunction")
        return self._finish(_Aggregated(agg), parallelism, name, f"window-{type(agg).__name__}")

    def count(self, *, parallelism: int | None = None, name: str | None = None) -> DataStream:
        """result = the number of records in the window."""
        return self._finish(_Aggregated(CountAggregate()), parallelism, name, "window-count")

    def process(self, fn: Callable[[Any, Window, list[Any]], Any], *, parallelism: int | None = None,
                name: str | None = None) -> DataStream:
        """result = fn(key, window, records): all the window's records at once (kept in state until it fires)."""
        if not callable(fn):
            raise ValueError(f"{fn!r} is not callable as fn(key, window, records)")
        return self._finish(_Elements(fn), parallelism, name, "window-process")
