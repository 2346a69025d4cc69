"""Event time for an operator chain driven by hand in a unit test, as the task drives it."""

from __future__ import annotations

from typing import Any


def advance_watermark(chain: Any, wm: int, chunk: int = 64) -> None:
    """Set the chain's watermark to `wm`, fire every timer it makes due in chunks of `chunk` (the task fires a
    burst over several turns of its loop), then forward the watermark downstream."""
    timers = chain.timers
    if timers is not None:
        timers.set_watermark(wm)
        while timers.fire_event(wm, chunk):
            pass
    chain.forward_watermark(wm)
