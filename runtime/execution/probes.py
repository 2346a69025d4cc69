"""Probes: priority events that cross a running job like an unaligned barrier, without touching state.

A probe is injected at the sources and sent on the priority lane of every
output. A task forwards a probe on the first channel it arrives on, and the
probe is complete at that task once every input channel has delivered it.
Under backpressure a probe's trip time shows the priority lane at work: it
overtakes every queued buffer instead of waiting behind them. Checkpoint
barriers follow the same path.

`ProbeTracker` is the per-task bookkeeping, without I/O or clocks.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ProbeProgress:
    probe_id: int
    seen: set[int] = field(default_factory=set)
    overtaken_input_buffers: int = 0


@dataclass(frozen=True)
class ProbeStep:
    forward: bool  # first arrival: send the probe on every output now
    complete: bool  # every input channel has delivered it


class ProbeTracker:
    def __init__(self, channel_ids: list[int]) -> None:
        self.channel_ids = frozenset(channel_ids)
        self._pending: dict[int, ProbeProgress] = {}

    def on_probe(self, probe_id: int, channel_id: int, queued_before: int) -> ProbeStep:
        """A probe arrived on `channel_id`; `queued_before` input buffers of that channel were still queued."""
        if channel_id not in self.channel_ids:
            raise ValueError(f"probe {probe_id} on channel {channel_id}, not an input of this task")
        progress = self._pending.get(probe_id)
        first = progress is None
        if progress is None:
            progress = self._pending[probe_id] = ProbeProgress(probe_id)
        if channel_id in progress.seen:
            raise ValueError(f"probe {probe_id} arrived twice on channel {channel_id}")
        progress.seen.add(channel_id)
        progress.overtaken_input_buffers += queued_before
        complete = progress.seen == self.channel_ids
        return ProbeStep(forward=first, complete=complete)

    def finish(self, probe_id: int) -> ProbeProgress:
        return self._pending.pop(probe_id)
