"""Reference models the tests compare a real run against: the out-of-order timestamps of the event-time and
window jobs, and the documented semantics of a counting window, computed naively."""

from __future__ import annotations

from collections import Counter
from typing import Any

from runtime.api import MAX_WATERMARK, MIN_WATERMARK
from runtime.api.windows import WindowAssigner


def jittered(record: Any) -> int:
    """A generator record's timestamp out of order by up to 400 ms, deterministically (as the jobs' own)."""
    return int(record[2] + (record[1] * 7919) % 400)


def window_model(events: list[tuple[Any, ...]], assigner: WindowAssigner, lateness: int) -> tuple[Counter, list]:
    """The documented semantics of a counting window, naively. `events` are ("r", key, ts, record) and
    ("w", watermark) in stream order; a window fires when the watermark reaches end - 1, again per late
    addition, and at the end of input. Returns (Counter of (key, start, end, count) rows, late records)."""
    wm = MIN_WATERMARK
    windows: dict[tuple[Any, int, int], int] = {}
    fired: set[tuple[Any, int, int]] = set()
    rows: Counter = Counter()
    late = []

    def advance(to: int) -> None:
        for (key, start, end), n in windows.items():
            if end - 1 <= to and (key, start, end) not in fired:
                rows[(key, start, end, n)] += 1
                fired.add((key, start, end))
        for w in [w for w in windows if w[2] - 1 + lateness <= to]:
            del windows[w]

    for event in events:
        if event[0] == "w":
            wm = event[1]
            advance(wm)
            continue
        _, key, ts, record = event
        added = False
        for start, end in assigner.assign(ts):
            if end - 1 + lateness <= wm:
                continue
            added = True
            w = (key, start, end)
            windows[w] = windows.get(w, 0) + 1
            if end - 1 <= wm:  # the watermark passed it: fires now, and never from a timer
                rows[(key, start, end, windows[w])] += 1
                fired.add(w)
        if not added:
            late.append(record)
    advance(MAX_WATERMARK)
    return rows, late
