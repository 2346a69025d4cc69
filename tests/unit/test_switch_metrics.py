"""The per-task switching figures follow the barrier handler's decisions.

A real BarrierHandler decides (switch a channel, refuse it for the in-flight cap, find a switched
channel aligned after all); its InflightBudget keeps the counts, and the worker's real collector
exports them as sluice_task_checkpoint_channels_switched_total / ..._switches_refused_total. The
worker around the collector is a stand-in: only the budget's figures flow through it.
"""

from __future__ import annotations

from types import SimpleNamespace

from prometheus_client import CollectorRegistry, generate_latest

from runtime.checkpointing.barriers import BarrierHandler, BarrierSpec
from runtime.execution.task import CheckpointStatistics, TaskStatistics
from runtime.graph.checkpoint_figures import CheckpointFigures, TaskCheckpointFigures
from runtime.graph.checkpoint_options import CheckpointOptions
from runtime.worker.metrics import WorkerCollector


def switching(checkpoint_id: int = 1, *, nbytes: int = 10, cap: int | None = None) -> BarrierSpec:
    return BarrierSpec(checkpoint_id, 0.0, CheckpointOptions(channel_inflight_bytes=nbytes, max_inflight_bytes=cap))


def scrape(h: BarrierHandler) -> dict[str, float]:
    """The worker's /metrics text for one task whose checkpoint statistics come from `h`'s budget."""
    b = h.budget
    cp = CheckpointStatistics(channels_switched=b.switched, switches_refused=b.refused)
    st = TaskStatistics(0, 0, 0.0, 0.0, 0.0, 0, 0.0, 0, 0, 0, 0.0, 0, 0, 0.0, 0.0, 0, 0,
                        channels_switched=cp.channels_switched, switches_refused=cp.switches_refused)
    task = SimpleNamespace(statistics=lambda: st, key=SimpleNamespace(operator="map", subtask=0),
                           chain=SimpleNamespace(async_operator=None, sinks=[]), source=None,
                           isolation=SimpleNamespace(isolated=False, user_loop=False), state="RUNNING")
    net = SimpleNamespace(outbound_channels=lambda: [], links={})
    worker = SimpleNamespace(all_tasks=lambda: [("j", task)], network=net, config=SimpleNamespace(slots=1))
    registry = CollectorRegistry()
    registry.register(WorkerCollector(worker))  # type: ignore[arg-type]
    out: dict[str, float] = {}
    for line in generate_latest(registry).decode().splitlines():
        if line.startswith("sluice_task_checkpoint_") and ("switched" in line or "refused" in line):
            name, value = line.rsplit(" ", 1)
            out[name.split("{")[0]] = float(value)
    return out


def figures(h: BarrierHandler) -> tuple[float, float]:
    m = scrape(h)
    return (m["sluice_task_checkpoint_channels_switched_total"], m["sluice_task_checkpoint_switches_refused_total"])


def test_counters_follow_switches_refusals_and_stay_monotonic_on_a_refund():
    h = BarrierHandler([0, 1, 2])
    assert figures(h) == (0, 0)
    s = switching(cap=1000)
    h.on_barrier(0, s, priority=False, now=0.0)
    h.on_arrival(1, s, now=0.0, bytes_ahead=600)  # over the 10-byte threshold and fits the cap: switched
    assert figures(h) == (1, 0) and h.budget.channels[1] == 1
    h.on_arrival(2, s, now=0.0, bytes_ahead=600)  # 1200 > cap: refused, stays aligned
    assert figures(h) == (1, 1) and h.budget.channels[1] == 1
    # channel 1's barrier is taken before the snapshot: aligned after all. The checkpoint's own count drops,
    # the life-long counter does not (a Prometheus counter never goes down)
    h.on_barrier(1, s, priority=False, now=0.1)
    assert h.budget.channels[1] == 0 and figures(h) == (1, 1)
    h.on_barrier(2, s, priority=False, now=0.2)
    assert h.last_finished == 1


def test_a_priority_barrier_counts_as_a_switch_of_its_checkpoint():
    h = BarrierHandler([0, 1])
    s2 = switching(2)
    h.on_barrier(0, s2, priority=True, now=0.0, queued_bytes=300)  # its sender promoted it
    h.on_barrier(1, s2, priority=False, now=0.1)
    assert figures(h) == (1, 0) and h.budget.channels == {2: 1} and h.budget.used == {2: 300}


def test_aligned_without_switching_moves_nothing():
    h = BarrierHandler([0, 1])
    s = BarrierSpec(1, 0.0)
    h.on_arrival(1, s, now=0.0, bytes_ahead=10_000)
    h.on_barrier(0, s, priority=False, now=0.0)
    h.on_barrier(1, s, priority=False, now=5.0)
    assert figures(h) == (0, 0) and h.budget.channels == {}


def test_the_ack_figure_travels_on_the_wire():
    f = TaskCheckpointFigures(switched_channels=3)
    assert f.to_wire()["switched_channels"] == 3 and TaskCheckpointFigures.from_wire(f.to_wire()) == f
    assert "switched_channels" not in TaskCheckpointFigures().to_wire()  # optional: absent when not switching
    # the checkpoint's own figure (history, `sluice checkpoints`): the sum over the tasks that measured it
    assert CheckpointFigures.of([f, TaskCheckpointFigures(), TaskCheckpointFigures(switched_channels=2)]
                                ).switched_channels == 5
