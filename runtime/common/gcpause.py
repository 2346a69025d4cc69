"""Pausing Python's cyclic garbage collector while a large state file decodes.

Decoding a checkpoint's operator state creates a container object per key (msgpack lists) and none of them can be
garbage yet, but each allocation burst still triggers collections that walk every object built so far: with 500 k
keys that is 3-4x the decode itself. The collector is paused, not tuned: reference counting still frees
everything, and collection resumes once the last decoding thread is done (a count, since tasks restore in
parallel threads).
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_lock = threading.Lock()
_pausing = 0  # threads inside gc_paused()
_was_enabled = False  # whether the collector ran before the first of them paused it


@contextmanager
def gc_paused() -> Iterator[None]:
    global _pausing, _was_enabled
    with _lock:
        if _pausing == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _pausing += 1
    try:
        yield
    finally:
        with _lock:
            _pausing -= 1
            if _pausing == 0 and _was_enabled:
                gc.enable()
