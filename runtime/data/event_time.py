"""The event-time rules `sluice data verify` reproduces for windowed jobs, stated as plain Python.

verify computes the same results with Spark SQL in closed form
(runtime/data/verify.py); this module simulates a windowed job record by
record, so the tests can check one against the other, and it is the
readable statement of what a windowed job must output.

The job reads records (key, seq, event_time_ms) in one fixed order (a source
of parallelism 1) and, after each record, emits the watermark
max(event time so far) - max_delay_ms - 1. A record is processed under the
watermark left by the records before it (none before the first record).

Windows (window-count): a record belongs to every window [start, start +
size) with start a multiple of `slide` (of `size` for tumbling windows,
aligned at epoch 0) that holds its event time. It is dropped from window w
iff w_end - 1 + allowed_lateness_ms <= watermark; a record dropped from all
its windows is late and goes to the side output as (key, seq,
event_time_ms). A window with records fires when the watermark reaches
w_end - 1, with the count of its records; a record added after that (only
possible with allowed lateness) fires it again with the new count. At the
end of the input every window not yet fired fires. A window with no
records never fires. Output rows: (key, window_start, window_end, count).

Sessions (session-count): per key, a record opens [ts, ts + gap); sessions
that overlap (max(start) < min(end)) merge; a session fires when the
watermark reaches its end - 1. Output rows: (key, start, max ts + gap,
count). verify only accepts inputs where no record is behind the watermark
(event time <= watermark when it arrives): then no record can reach a
session that already fired, so every session fires exactly once and the
batch answer (sessions split where consecutive event times of a key are
`gap` or more apart) is exact.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable

Record = tuple[str, int, int]  # (key, seq, event_time_ms)
Row = tuple[str, int, int, int]  # (key, start, end, count)


def watermark_after(max_event_time: int | None, max_delay_ms: int) -> int | None:
    """The watermark a source emits once it has seen `max_event_time` (None: nothing seen, no watermark)."""
    return None if max_event_time is None else max_event_time - max_delay_ms - 1


def window_starts(ts: int, size: int, slide: int | None = None) -> list[int]:
    """Starts of the windows [start, start + size) holding `ts`, starts being multiples of `slide` (default
    `size`: tumbling), ascending."""
    step = size if slide is None else slide
    if size <= 0 or step <= 0 or step > size:
        raise ValueError(f"need 0 < slide <= size, got size {size}, slide {step}")
    last = ts - ts % step  # Python's % floors, like Spark's pmod: aligned at epoch 0 for negative ts too
    first = (ts - size) - (ts - size) % step + step  # the first multiple of step above ts - size
    return list(range(first, last + 1, step))


def dropped(window_end: int, watermark: int | None, allowed_lateness_ms: int) -> bool:
    """True iff a record arriving under `watermark` is dropped from the window ending (exclusive) at
    `window_end`: the window's last event time plus the allowed lateness is at or behind the watermark."""
    return watermark is not None and window_end - 1 + allowed_lateness_ms <= watermark


def window_count(records: Iterable[Record], *, size: int, slide: int | None = None, max_delay_ms: int = 0,
                 allowed_lateness_ms: int = 0) -> tuple[list[Row], list[Record]]:
    """(every window firing, late records) of a window count over `records` in read order, by simulation."""
    counts: dict[tuple[str, int], int] = {}
    fired: set[tuple[str, int]] = set()
    due: list[tuple[int, str, int]] = []  # (end, key, start) of windows with records that have not fired
    rows: list[Row] = []
    late: list[Record] = []
    watermark: int | None = None
    max_ts: int | None = None
    for key, seq, ts in records:
        kept = False
        for start in window_starts(ts, size, slide):
            end = start + size
            if dropped(end, watermark, allowed_lateness_ms):
                continue
            kept = True
            window = (key, start)
            counts[window] = counts.get(window, 0) + 1
            if window in fired or (watermark is not None and watermark >= end - 1):
                fired.add(window)  # a late addition (or a window first seen after its time): fires at once
                rows.append((key, start, end, counts[window]))
            elif counts[window] == 1:
                heapq.heappush(due, (end, key, start))
        if not kept:
            late.append((key, seq, ts))
        max_ts = ts if max_ts is None else max(max_ts, ts)
        watermark = max_ts - max_delay_ms - 1  # watermark_after, for a max that now exists
        while due and due[0][0] - 1 <= watermark:
            end, key, start = heapq.heappop(due)
            fired.add((key, start))
            rows.append((key, start, end, counts[(key, start)]))
    for end, key, start in sorted(due):  # end of input: everything left fires
        rows.append((key, start, end, counts[(key, start)]))
    return rows, late


def behind_watermark(records: Iterable[Record], max_delay_ms: int) -> list[Record]:
    """Records whose event time is at or behind the watermark when they arrive."""
    behind = []
    max_ts: int | None = None
    for record in records:
        watermark = watermark_after(max_ts, max_delay_ms)
        if watermark is not None and record[2] <= watermark:
            behind.append(record)
        max_ts = record[2] if max_ts is None else max(max_ts, record[2])
    return behind


def session_count(records: Iterable[Record], *, gap: int, max_delay_ms: int = 0) -> list[Row]:
    """Every session firing of a session count over `records` in read order, by simulation. Raises ValueError
    if a record arrives behind the watermark (then a session could fire more than once: module docstring)."""
    if gap <= 0:
        raise ValueError(f"gap must be > 0, got {gap}")
    open_sessions: dict[str, list[list[int]]] = {}  # key -> [start, end, count] of sessions not yet fired
    rows: list[Row] = []
    watermark: int | None = None
    max_ts: int | None = None
    for key, seq, ts in records:
        if watermark is not None and ts <= watermark:
            raise ValueError(f"record seq {seq} (event time {ts}) is behind the watermark {watermark}")
        merged = [ts, ts + gap, 1]
        kept = []
        for session in open_sessions.get(key, []):
            if max(session[0], merged[0]) < min(session[1], merged[1]):
                merged = [min(session[0], merged[0]), max(session[1], merged[1]), session[2] + merged[2]]
            else:
                kept.append(session)
        open_sessions[key] = kept + [merged]
        max_ts = ts if max_ts is None else max(max_ts, ts)
        watermark = max_ts - max_delay_ms - 1
        for k, sessions in open_sessions.items():
            rows += [(k, s, e, n) for s, e, n in sessions if e - 1 <= watermark]
            open_sessions[k] = [x for x in sessions if x[1] - 1 > watermark]
    for k, sessions in open_sessions.items():
        rows += [(k, s, e, n) for s, e, n in sessions]
    return rows
