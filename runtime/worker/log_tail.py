"""The worker's recent log lines, kept in memory for the coordinator's web UI (a worker's page).

A logging handler with a bounded ring of formatted lines: the tail of what
the worker wrote to its log, wherever its stderr goes (a file under
`sluice local`, a container's log), served over the `log_tail` RPC. It costs
one formatted string per log line, and the worker logs little.
"""

from __future__ import annotations

import logging
import os
import time
from collections import deque

LINES = 500  # lines kept
LINE_CHARS = 4000  # a longer line (a huge message) is cut


class LogTail(logging.Handler):
    def __init__(self, lines: int = LINES) -> None:
        super().__init__()
        self._lines: deque[str] = deque(maxlen=lines)
        self.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = self.format(record)
        except Exception:  # noqa: BLE001 - a bad log call must not break the caller
            self.handleError(record)
            return
        for line in text.splitlines() or [""]:
            self._lines.append(line[:LINE_CHARS])

    def tail(self, n: int) -> list[str]:
        """The last `n` lines, oldest first."""
        return list(self._lines)[-n:] if n > 0 else []


def process_figures() -> dict[str, float]:
    """This process's resident memory and CPU seconds so far (all threads), for its heartbeat; `measured_at`
    (the monotonic clock when read) times its CPU rate, as the tasks' figures time theirs."""
    rss = 0
    try:
        with open("/proc/self/statm", "rb") as f:
            rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):  # not Linux: the peak is the best figure at hand
        import resource

        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"rss_bytes": rss, "cpu_s": round(time.process_time(), 3), "measured_at": time.monotonic()}
